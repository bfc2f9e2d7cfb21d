"""The status of ZeroscaleRoute objects (adapter/proxy/route_status.py) in-process against the Kubernetes API stand-in:
the conditions, who writes them (the Lease holder only), and how often (only what changed, live facts at most once
per status_interval)."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.children import port_outside_ephemeral
from adapter.config.route_object import API_VERSION, KIND
from adapter.kube.client import KubeClient
from adapter.kube.leases import lease_path
from adapter.proxy.app import Proxy
from tests.fixtures.kube_routes import SLICES_V1, ScaleStandIn, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.fixtures.proxy import get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.proxy.test_activator import DEPLOYMENTS, LEASES, SERVICES, activator_settings
from tests.proxy.test_route_objects import activator_object, seed_activator

ROUTES = r"/apis/zeroscale\.io/v1alpha1/namespaces/[^/]+/zeroscaleroutes"
INTERVAL = 0.3  # proxy.route_objects.status_interval in these tests
BURST = 200  # held requests


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        for pattern, kind in (
            (SLICES_V1, "EndpointSliceList"),
            (SERVICES, "ServiceList"),
            (LEASES, "LeaseList"),
            (DEPLOYMENTS, "DeploymentList"),
        ):
            standin.serve_collection(pattern, kind, writable=True)
        standin.serve_collection(ROUTES, f"{KIND}List", writable=True, status_subresource=True)
        yield standin


def routes_collection(namespace: str) -> str:
    return f"/apis/zeroscale.io/v1alpha1/namespaces/{namespace}/zeroscaleroutes"


def route_object(
    namespace: str, name: str = "shop", *, generation: int = 1, created: str = "2026-01-01T00:00:00Z", **spec: Any
) -> dict[str, Any]:
    """A route to Service `web` in front of Deployment `web` of its namespace, for host `<namespace>.example`."""
    body = {
        "hosts": [f"{namespace}.example"],
        "upstream": {"service": "web", "port": "http"},
        "target": {"kind": "Deployment", "name": "web"},
        "wake": "none",
        "limits": {"hold_timeout": 30},
        **spec,
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "generation": generation, "creationTimestamp": created},
        "spec": body,
    }


def app(kube: KubeStandIn, namespace: str, *ready: str) -> None:
    """Service `web` of `namespace`, its slice (`ready` addresses) and Deployment `web`'s scale subresource."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": namespace}}
    kube.put(f"/api/v1/namespaces/{namespace}/services", service)
    pods(kube, namespace, *ready)
    ScaleStandIn(kube, namespace, "web", replicas=1)


def pods(kube: KubeStandIn, namespace: str, *ready: str) -> None:
    body = endpoint_slice("web-abcde", "web", [(address, {"ready": True}) for address in ready], 8080)
    body["metadata"]["namespace"] = namespace
    kube.put(slices_collection(namespace), body)


@asynccontextmanager
async def proxy_for(kube_client: KubeClient, *namespaces: str, **objects: Any) -> AsyncIterator[Proxy]:
    route_objects = {"enabled": True, "namespaces": list(namespaces), "status_interval": INTERVAL, **objects}
    async with running_proxy(
        [], kube=kube_client, activator=activator_settings(), route_objects=route_objects
    ) as proxy:
        yield proxy


def status(kube: KubeStandIn, namespace: str, name: str = "shop") -> dict[str, Any]:
    obj = kube.get(routes_collection(namespace), name)
    return (obj or {}).get("status") or {}


def condition(kube: KubeStandIn, kind: str, namespace: str, name: str = "shop") -> dict[str, Any]:
    found = [c for c in status(kube, namespace, name).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def reason(kube: KubeStandIn, kind: str, namespace: str, name: str = "shop") -> tuple[str, str]:
    found = condition(kube, kind, namespace, name)
    return found.get("status", ""), found.get("reason", "")


def status_patches(kube: KubeStandIn) -> list[str]:
    return [path for method, path, _body in kube.writes if method == "PATCH" and "/status" in path]


async def test_an_accepted_route_with_its_service_and_target_is_ready_and_says_which_generation_and_how_warm(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a", generation=3))
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        written = status(kube, "team-a")
        assert written["observedGeneration"] == 3
        assert reason(kube, "Accepted", "team-a") == ("True", "Accepted")
        assert {c["observedGeneration"] for c in written["conditions"]} == {3}
        assert (written["state"], written["held"]) == ("Warm", 0)
        assert written.get("lastColdStartSeconds") is None
        assert all(path.endswith("/namespaces/team-a/zeroscaleroutes/shop/status") for path in status_patches(kube))


async def test_a_route_whose_service_is_missing_is_not_ready_and_names_the_service(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    ScaleStandIn(kube, "team-a", "web", replicas=1)
    kube.put(routes_collection("team-a"), route_object("team-a"))
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("False", "ServiceNotFound"))
        assert "Service team-a/web" in condition(kube, "Ready", "team-a")["message"]
        assert reason(kube, "Accepted", "team-a") == ("True", "Accepted")


async def test_of_two_namespaces_claiming_one_host_the_younger_route_is_refused_naming_the_winner(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    for namespace, created in (("team-a", "2026-01-01T00:00:00Z"), ("team-b", "2026-02-01T00:00:00Z")):
        app(kube, namespace, "127.0.0.1")
        kube.put(routes_collection(namespace), route_object(namespace, created=created, hosts=["shop.example"]))
    async with proxy_for(kube_client, "team-a", "team-b"):
        await until(lambda: reason(kube, "Accepted", "team-b") == ("False", "HostClaimed"))
        assert "team-a/shop" in condition(kube, "Accepted", "team-b")["message"]
        assert reason(kube, "Ready", "team-b") == ("False", "NotAccepted")
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        routes = {
            state: REGISTRY.get_sample_value("zeroscale_proxy_route_objects", {"state": state})
            for state in ("accepted", "refused")
        }
        assert routes == {"accepted": 1.0, "refused": 1.0}


async def test_an_invalid_spec_is_refused_with_what_is_wrong(kube: KubeStandIn, kube_client: KubeClient) -> None:
    app(kube, "team-a", "127.0.0.1")
    body = route_object("team-a", wake="scale")
    del body["spec"]["target"]
    kube.put(routes_collection("team-a"), body)
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Accepted", "team-a") == ("False", "InvalidSpec"))
        assert "wake: scale needs a target" in condition(kube, "Accepted", "team-a")["message"]


async def test_a_replica_not_holding_the_lease_writes_nothing_until_it_holds_it(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "zeroscale-proxy-activator", "namespace": "zeroscale"},
        "spec": {"holderIdentity": "proxy-z", "leaseDurationSeconds": 3600},
    }
    kube.put(lease_path("zeroscale"), lease)
    async with proxy_for(kube_client, "team-a") as proxy:
        await until(lambda: "team-a/shop" in proxy.routes)
        await asyncio.sleep(6 * INTERVAL)
        assert status_patches(kube) == []
        assert not [path for _method, path, _headers in kube.requests if "/services/" in path]
        assert REGISTRY.get_sample_value("zeroscale_proxy_route_status_backlog") == 1  # waiting for the Lease
        kube.put(lease_path("zeroscale"), {**lease, "spec": {"holderIdentity": "", "leaseDurationSeconds": 1}})
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))  # the next retry_period takes it
        await until(lambda: REGISTRY.get_sample_value("zeroscale_proxy_route_status_backlog") == 0)


async def test_a_status_is_not_written_again_while_nothing_changed(kube: KubeStandIn, kube_client: KubeClient) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        written = len(status_patches(kube))
        await asyncio.sleep(8 * INTERVAL)  # several sweeps, and the watch events of its own writes
        assert len(status_patches(kube)) == written


async def test_a_burst_of_held_requests_writes_the_live_facts_at_most_once_per_status_interval(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a")  # no ready endpoint: every request is held
    kube.put(routes_collection("team-a"), route_object("team-a"))
    writes: list[tuple[float, Any]] = []  # when the stand-in received each status write, and its conditions

    def timed(_method: str, path: str, body: Any) -> None:
        if path.endswith("/status"):
            writes.append((time.monotonic(), body["status"].get("conditions")))

    kube.before_write.append(timed)
    interval = 0.5
    async with proxy_for(kube_client, "team-a", status_interval=interval) as proxy:
        await until(
            lambda: reason(kube, "Ready", "team-a") == ("True", "Ready") and status(kube, "team-a")["state"] == "Cold"
        )
        before = len(writes)
        started = time.monotonic()
        held = []
        # One every 5 ms or so for over a second: faster than a write and its watch event go round, so each event of
        # the route's own write finds `held` changed again.
        for _ in range(BURST):
            held.append(asyncio.create_task(request(proxy.port, get(host="team-a.example"), within=30)))
            await asyncio.sleep(0.005)
        await until(lambda: status(kube, "team-a").get("held") == BURST)
        # Writes of the live facts alone (a condition that changed, e.g. a read timed out on a loaded machine, is
        # written at once, and is not what this test is about).
        burst = writes[before - 1 :]
        live = [at for (_, earlier), (at, now) in itertools.pairwise(burst) if now == earlier]
        assert live
        assert len(live) <= (time.monotonic() - started) / interval + 1, [(at - started, c) for at, c in burst]
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_a_condition_keeps_its_last_transition_time_while_its_status_stays(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """What a previous writer left: Accepted True (stays so), Ready False (becomes True)."""
    app(kube, "team-a", "127.0.0.1")
    before = "2026-01-01T00:00:00Z"
    left = [
        {
            "type": kind,
            "status": state,
            "reason": why,
            "message": "",
            "lastTransitionTime": before,
            "observedGeneration": 1,
        }
        for kind, state, why in (("Accepted", "True", "Accepted"), ("Ready", "False", "ReadinessUnknown"))
    ]
    kube.put(routes_collection("team-a"), {**route_object("team-a", generation=2), "status": {"conditions": left}})
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        assert condition(kube, "Accepted", "team-a")["lastTransitionTime"] == before
        assert condition(kube, "Ready", "team-a")["lastTransitionTime"] > before
        assert status(kube, "team-a")["observedGeneration"] == 2


def service_reads(kube: KubeStandIn, namespace: str) -> int:
    return sum(
        1
        for method, path, _ in kube.requests
        if method == "GET" and path == f"/api/v1/namespaces/{namespace}/services/web"
    )


async def test_whether_the_service_exists_is_read_once_per_generation_not_at_every_event(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        for state in ("Cold", "Warm", "Cold", "Warm"):  # each a write of its own
            pods(kube, "team-a", *(["127.0.0.1"] if state == "Warm" else []))
            await until(lambda state=state: status(kube, "team-a").get("state") == state)  # type: ignore[misc]
        assert service_reads(kube, "team-a") == 1
        obj = kube.get(routes_collection("team-a"), "shop")
        assert obj is not None
        edited = route_object("team-a", generation=2, hosts=["shop.team-a.example"])
        kube.put(routes_collection("team-a"), {**edited, "status": obj["status"]})
        await until(lambda: status(kube, "team-a").get("observedGeneration") == 2)
        assert service_reads(kube, "team-a") == 2


async def test_a_route_deleted_before_its_write_is_dropped_silently_and_forgotten(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))

    def delete_first(method: str, path: str, _body: Any) -> None:
        if method == "PATCH" and kube.get(routes_collection("team-a"), "shop") is not None:
            kube.delete(routes_collection("team-a"), "shop")

    kube.before_write.append(delete_first)
    gone = writes_total("gone")
    async with proxy_for(kube_client, "team-a") as proxy:
        await until(
            lambda: (
                REGISTRY.get_sample_value("zeroscale_proxy_route_status_writes_total", {"result": "gone"}) == gone + 1
            )
        )
        await until(lambda: "team-a/shop" not in proxy.routes)
        # Forgotten: neither served nor refused.
        routes = {
            state: REGISTRY.get_sample_value("zeroscale_proxy_route_objects", {"state": state})
            for state in ("accepted", "refused")
        }
        assert routes == {"accepted": 0.0, "refused": 0.0}
        await asyncio.sleep(3 * INTERVAL)
        assert len(status_patches(kube)) == 0  # the 404 is not a write; nothing is tried again
    assert not [record for record in caplog.records if record.name == "adapter.proxy.route_status"]


async def test_a_route_in_mode_activator_is_not_ready_while_its_slices_cannot_be_written_and_says_why(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    port = port_outside_ephemeral()
    seed_activator(kube, "team-a")
    pods_service = {"kind": "Service", "metadata": {"name": "web-pods", "namespace": "team-a"}, "spec": {}}
    kube.put("/api/v1/namespaces/team-a/services", pods_service)
    ScaleStandIn(kube, "team-a", "web")
    clients = {"kind": "Service", "metadata": {"name": "web", "namespace": "team-a", "uid": "uid-web"}}
    kube.put("/api/v1/namespaces/team-a/services", {**clients, "spec": {"selector": {"app": "web"}}})
    kube.put(routes_collection("team-a"), activator_object("team-a", "web", port))
    async with proxy_for(kube_client, "team-a", activator_ports={"first": port, "last": port}):
        await until(lambda: reason(kube, "Ready", "team-a", "web") == ("False", "SlicesNotWritten"))
        assert "has a selector" in condition(kube, "Ready", "team-a", "web")["message"]
        kube.put("/api/v1/namespaces/team-a/services", {**clients, "spec": {}})
        await until(lambda: reason(kube, "Ready", "team-a", "web") == ("True", "Ready"))


async def test_an_edited_route_is_not_said_unready_while_its_new_version_starts(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    readies: list[str] = []

    def ready_written(_method: str, path: str, body: Any) -> None:
        if path.endswith("/status"):
            readies.extend(c["reason"] for c in body["status"].get("conditions", []) if c["type"] == "Ready")

    kube.before_write.append(ready_written)
    async with proxy_for(kube_client, "team-a", status_interval=3.0):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        lists = sum(1 for _, path, _ in kube.requests if "/endpointslices" in path and "watch" not in path)
        obj = kube.get(routes_collection("team-a"), "shop")
        assert obj is not None
        edited = route_object("team-a", generation=2, hosts=["shop.team-a.example"])
        kube.put(routes_collection("team-a"), {**edited, "status": obj["status"]})
        await until(lambda: status(kube, "team-a").get("observedGeneration") == 2)
        assert reason(kube, "Ready", "team-a") == ("True", "Ready")
        # The new version read the namespace's slices as the watch the two versions share already had them.
        assert sum(1 for _, path, _ in kube.requests if "/endpointslices" in path and "watch" not in path) == lists
        assert "ReadinessUnknown" not in readies, readies


async def test_a_service_the_proxy_may_not_read_leaves_ready_unknown_saying_what_to_grant(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    forbidden = Reply(403, status_body(403, "Forbidden", 'services "web" is forbidden'))
    kube.add_route("GET", r"/api/v1/namespaces/team-a/services/web", lambda _request, _match: forbidden)
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("Unknown", "CannotCheck"))
        message = condition(kube, "Ready", "team-a")["message"]
        assert "grant it get" in message
        assert "forbidden" in message


async def test_a_failed_write_is_counted_logged_once_and_tried_again_a_status_interval_later(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    refused: list[float] = []

    def unwell(_request: StandInRequest, _match: re.Match[str]) -> Reply | None:
        if len(refused) == 2:
            return None  # the status subresource's own route
        refused.append(time.monotonic())
        return Reply(500, status_body(500, "InternalError", "etcd is unwell"))

    kube.add_route("PATCH", rf"{routes_collection('team-a')}/shop/status", unwell)
    errors = writes_total("error")
    async with proxy_for(kube_client, "team-a"):
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
    assert writes_total("error") == errors + 2
    assert refused[1] - refused[0] >= INTERVAL * 0.9
    warnings = [r for r in caplog.records if r.name == "adapter.proxy.route_status" and r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "etcd is unwell" in warnings[0].getMessage()


def writes_total(result: str) -> float:
    return REGISTRY.get_sample_value("zeroscale_proxy_route_status_writes_total", {"result": result}) or 0.0


async def test_a_status_changed_by_someone_else_is_written_back_without_placing_the_routes_again(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    async with proxy_for(kube_client, "team-a") as proxy:
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        placed, table = proxy.control.refusals, proxy.control.table
        kube.put(routes_collection("team-a"), {**route_object("team-a"), "status": {"state": "Cold"}})
        await until(lambda: reason(kube, "Ready", "team-a") == ("True", "Ready"))
        assert status(kube, "team-a")["state"] == "Warm"
        # Every status event (the writer's own too) left the placing of the routes and the table as they were.
        assert proxy.control.refusals is placed
        assert proxy.control.table is table


async def test_an_object_named_as_a_file_route_is_refused_and_shows_none_of_its_live_facts(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    file_route: dict[str, Any] = {"name": "shop", "namespace": "team-a", "hosts": ["own.example"], "wake": "none"}
    file_route |= {"upstream": {"address": upstream.address}, "readiness": "probe"}
    app(kube, "team-a", "127.0.0.1")
    kube.put(routes_collection("team-a"), route_object("team-a"))
    route_objects = {"enabled": True, "namespaces": ["team-a"], "status_interval": INTERVAL}
    async with running_proxy(
        [file_route], kube=kube_client, activator=activator_settings(), route_objects=route_objects
    ) as proxy:
        await until(lambda: reason(kube, "Accepted", "team-a") == ("False", "NameClaimed"))
        assert (await request(proxy.port, get("/echo", host="own.example"))).status == 200
        await asyncio.sleep(3 * INTERVAL)  # sweeps that would copy the file route's warmth into the object
        assert status(kube, "team-a")["state"] == "Unknown"
