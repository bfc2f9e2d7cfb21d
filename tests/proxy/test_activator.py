"""Route mode activator (adapter/proxy/activator.py) in-process against the Kubernetes API stand-in: the slices the
Lease holder writes for the Service clients call, and the proxy holding and forwarding while it is listed.

The "pod" is a real HTTP server on loopback (the stand-in, unlike the real API, does not refuse loopback
addresses in a slice); the proxy's own pods are listed at an address nothing listens on, as only what the slice
says of them is checked here (tests/e2e has them routed by a real kube-proxy).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from adapter.children import port_outside_ephemeral
from adapter.config.proxy import ProxyConfig
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import MANAGED_BY, build_slices
from adapter.proxy.app import Proxy
from tests.fixtures.grpc_echo import EchoServer, echo_client
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.fixtures.proxy import get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream

DEPLOYMENTS = r"/apis/apps/v1/namespaces/[^/]+/deployments"
SERVICES = r"/api/v1/namespaces/[^/]+/services"
LEASES = r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases"
SLICES = slices_collection("default")
PROXY_SLICES = slices_collection("zeroscale")
PROXY_ADDRESS = "10.1.0.7"  # the proxy's pod, as its own Service's slice lists it
SERVICE_UID = "0b5e1c2a-service-web"


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        for pattern, kind in (
            (SLICES_V1, "EndpointSliceList"),
            (DEPLOYMENTS, "DeploymentList"),
            (SERVICES, "ServiceList"),
            (LEASES, "LeaseList"),
        ):
            standin.serve_collection(pattern, kind, writable=True)
        yield standin


def activator_route(port: int, name: str = "web", **overrides: Any) -> dict[str, Any]:
    activator = {"service": "web", "port": port, **overrides.pop("activator", {})}
    return {
        "name": name,
        "upstream": {"service": "web-pods", "namespace": "default", "port": "http"},
        "mode": "activator",
        "activator": activator,
        "target": {"namespace": "default", "kind": "Deployment", "name": "web"},
        "wake": "none",  # the test scales the Deployment itself
        "readiness": "endpointslice",
        "limits": {"hold_timeout": 15, **overrides.pop("limits", {})},
        **overrides,
    }


# Leases a loaded machine's stalls (the event loop held 1-2 s, the stand-in's thread with it) cannot take away:
# a test that is not about losing the Lease must not lose it (a lost Lease drops the writes in flight). The
# defaults: each try, and the give-up at close, has retry_period (2 s) to be answered (with 0.1 s, a stall
# timed the give-up out and the other replica waited out the lease_duration); the Lease is taken at the first
# try. Tests that let a Lease lapse use SHORT_LEASE and decide from events (what the API received, and when),
# not from how long a wait took.
LEASE = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0}
SHORT_LEASE = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}


def activator_settings(identity: str = "proxy-a", **overrides: Any) -> dict[str, Any]:
    return {
        "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
        "lease_namespace": "zeroscale",
        "identity": identity,
        **LEASE,
        "resync_interval": 30,
        **overrides,
    }


def deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas},
    }


def service(selector: dict[str, str] | None = None, uid: str = SERVICE_UID) -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    if selector is not None:
        spec["selector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "uid": uid},
        "spec": spec,
    }


def pods(port: int, *addresses: str, ready: bool = True) -> dict[str, Any]:
    """The upstream Service's slice, as Kubernetes' controller writes it."""
    return endpoint_slice("web-pods-abcde", "web-pods", [(address, {"ready": ready}) for address in addresses], port)


def proxies(*addresses: str, generation: int = 0) -> dict[str, Any]:
    """The proxy's own Service's slice (a named port, as the Helm chart names it)."""
    body = endpoint_slice("zeroscale-proxy-xyz", "zeroscale-proxy", [(a, {"ready": True}) for a in addresses], 8080)
    body["metadata"].update(namespace="zeroscale", annotations={"generation": str(generation)})
    return body


def seed(kube: KubeStandIn, replicas: int, pod_port: int, *pod_addresses: str) -> None:
    kube.put("/apis/apps/v1/namespaces/default/deployments", deployment(replicas))
    kube.put("/api/v1/namespaces/default/services", service())
    kube.put(SLICES, pods(pod_port, *pod_addresses))
    kube.put(PROXY_SLICES, proxies(PROXY_ADDRESS))


def set_replicas(kube: KubeStandIn, replicas: int) -> None:
    kube.put("/apis/apps/v1/namespaces/default/deployments", deployment(replicas))


def ours(kube: KubeStandIn, service_name: str = "web") -> list[dict[str, Any]]:
    return [
        obj
        for obj in kube.objects(SLICES)
        if obj["metadata"]["labels"].get("endpointslice.kubernetes.io/managed-by") == MANAGED_BY
        and obj["metadata"]["labels"].get("kubernetes.io/service-name") == service_name
    ]


def listed(kube: KubeStandIn) -> list[tuple[str, int, str]]:
    """What the Service's written slices route to: (address, port, port name)."""
    return sorted(
        (address, body["ports"][0]["port"], body["ports"][0]["name"])
        for body in ours(kube)
        for endpoint in body["endpoints"]
        for address in endpoint["addresses"]
    )


def slice_writes(kube: KubeStandIn) -> list[tuple[str, str]]:
    return [(method, path) for method, path, _body in kube.writes if "/endpointslices" in path]


def writes_total(route: str, result: str) -> float:
    labels = {"route": f"default/{route}", "result": result}
    return REGISTRY.get_sample_value("zeroscale_proxy_activator_slice_writes_total", labels) or 0.0


async def test_the_service_lists_the_pods_while_warm_the_proxy_from_replicas_zero_and_the_pods_after_the_held(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    upstream = await Upstream().start()
    pod_port, port = upstream.port, port_outside_ephemeral()
    seed(kube, 1, pod_port, "127.0.0.1")
    # One request at a time per pod: the held requests go out one after the other, so "held ones first" shows.
    route = activator_route(port, limits={"endpoint_concurrency": 1})
    pods_listed_while: list[int] = []

    def watch_writes(method: str, path: str, body: Any) -> None:
        lists_pod = isinstance(body, dict) and any("127.0.0.1" in e["addresses"] for e in body.get("endpoints", []))
        if method in ("POST", "PUT") and "/endpointslices" in path and lists_pod:
            pods_listed_while.append(server.routes["default/web"].counts.held)

    kube.before_write.append(watch_writes)
    updated = writes_total("web", "updated")
    try:
        async with running_proxy([route], kube=kube_client, activator=activator_settings()) as server:
            await until(lambda: listed(kube) == [("127.0.0.1", pod_port, "http")])
            (written,) = ours(kube)
            assert written["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": SERVICE_UID}
            ]
            assert written["metadata"]["labels"]["zeroscale.io/route"] == "web"
            assert server.activators["default/web"].warm

            # Scaled to 0: the proxy is listed at once, while the pod's endpoint is still ready in its slice.
            set_replicas(kube, 0)
            await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http")])
            pod_slice = kube.get(SLICES, "web-pods-abcde")
            assert pod_slice is not None
            assert pod_slice["endpoints"][0]["conditions"] == {"ready": True}

            # The pod goes; requests (here straight to the proxy's activator port) are held.
            kube.put(SLICES, pods(pod_port))
            await upstream.stop()
            held = [asyncio.create_task(request(port, get(f"/slow?s=0.2&n={n}"), within=15)) for n in range(3)]
            await until(lambda: server.routes["default/web"].counts.held == 3)
            set_replicas(kube, 1)  # woken, but no pod is ready yet: still the proxy
            await asyncio.sleep(0.3)
            assert not any(task.done() for task in held)
            assert listed(kube) == [(PROXY_ADDRESS, port, "http")]

            upstream = await Upstream(pod_port).start()
            kube.put(SLICES, pods(pod_port, "127.0.0.1"))
            responses = await asyncio.gather(*held)
            assert [response.status for response in responses] == [200, 200, 200]
            assert sorted(seen.path for seen in upstream.requests) == [f"/slow?s=0.2&n={n}" for n in range(3)]
            await until(lambda: listed(kube) == [("127.0.0.1", pod_port, "http")])
    finally:
        await upstream.stop()
    # The first write listed the pod before anything was held; every later one only once nothing was.
    assert pods_listed_while
    assert set(pods_listed_while) == {0}, pods_listed_while
    assert writes_total("web", "updated") == updated + 2  # to the proxy, back to the pod


def block(kube: KubeStandIn, what: str) -> Any:
    """Answer 500 to every read of one input of the activator (its list and its watch), until undone."""

    def refuse(request: StandInRequest, _match: Any) -> Reply | None:
        selector = request.param("labelSelector") or ""
        hit = {
            "target": request.path.startswith("/apis/apps/v1/namespaces/default/deployments"),
            # The upstream's slices come from the namespace's one watch of every slice (no selector).
            "pods": request.path.startswith(SLICES) and not selector,
            "proxies": request.path.startswith(PROXY_SLICES),
        }[what]
        return Reply(500, status_body(500, "InternalError", "etcd is unwell")) if hit else None

    return kube.add_route("GET", r"/.*", refuse)


@pytest.mark.parametrize(("unread", "replicas"), [("target", 1), ("pods", 1), ("proxies", 0)])
async def test_a_new_writer_writes_nothing_until_it_has_read_the_target_the_pods_and_the_proxies(
    kube: KubeStandIn, kube_client: KubeClient, unread: str, replicas: int
) -> None:
    """A restart (or a new leader) while the Service is warm must not flip it to the proxy because it has not
    read the pods (or the target) yet; while cold, not empty it because it has not read the proxies yet."""
    port = port_outside_ephemeral()
    seed(kube, replicas, 8080, "10.0.0.5")
    owner = {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": SERVICE_UID}
    groups = {8080: [{"addresses": ["10.0.0.5"], "conditions": {"ready": True}}]} if replicas else {}
    if not replicas:
        groups = {port: [{"addresses": [PROXY_ADDRESS], "conditions": {"ready": True}}]}
    for body in build_slices("default", "web", "web", owner, "http", groups, 100).values():
        kube.put(SLICES, body)  # what the previous writer left
    before = listed(kube)
    unblock = block(kube, unread)
    async with running_proxy([activator_route(port)], kube=kube_client, activator=activator_settings()) as server:
        activator = server.activators["default/web"]
        await until(lambda: server.leader is not None and server.leader.leading)
        await asyncio.sleep(0.5)
        assert not activator.inputs_read
        assert slice_writes(kube) == []
        unblock()
        await until(lambda: activator.inputs_read)
        await asyncio.sleep(0.3)
        assert slice_writes(kube) == [], "what the previous writer left was right: nothing to write"
        assert listed(kube) == before
        set_replicas(kube, 1 - replicas)  # and it does write, once there is something to change
        await until(lambda: listed(kube) != before)


async def test_slices_it_does_not_own_are_never_touched(kube: KubeStandIn, kube_client: KubeClient) -> None:
    port = port_outside_ephemeral()
    seed(kube, 1, 8080, "10.0.0.1", "10.0.0.2")
    foreign = [
        # Someone else's slice for the same Service.
        {
            **endpoint_slice("web-manual", "web", [("10.9.9.9", {})], 80),
            "metadata": {
                "name": "web-manual",
                "labels": {
                    "kubernetes.io/service-name": "web",
                    "endpointslice.kubernetes.io/managed-by": "someone-else.example",
                },
            },
        },
        # A slice with one of our names but not our label: a name taken, not ours to take over.
        endpoint_slice("web-zeroscale-1", "web", [("10.9.9.8", {})], 80),
        # Ours, for another Service.
        {
            **endpoint_slice("other-zeroscale-0", "other", [], 80),
            "metadata": {
                "name": "other-zeroscale-0",
                "labels": {"kubernetes.io/service-name": "other", "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
            },
        },
    ]
    kept = [kube.put(SLICES, body) for body in foreign]
    route = activator_route(port, activator={"max_endpoints_per_slice": 1})
    async with running_proxy([route], kube=kube_client, activator=activator_settings(resync_interval=0.2)):
        await until(lambda: listed(kube) == [("10.0.0.1", 8080, "http")])  # -1 is taken: it cannot be created
        set_replicas(kube, 0)  # one slice wanted: a -1 of ours would be deleted now
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http")])
        await asyncio.sleep(0.5)  # a few resyncs
    assert [kube.get(SLICES, body["metadata"]["name"]) for body in kept] == kept
    touched = {
        path.split("?")[0].rsplit("/", 1)[-1]
        for method, path, _ in kube.requests
        if method in ("PUT", "DELETE", "PATCH")
    }
    assert touched.isdisjoint({"web-manual", "web-zeroscale-1", "other-zeroscale-0"}), touched
    assert writes_total("web", "conflict") >= 1  # the POST of web-zeroscale-1: 409 AlreadyExists, each try


async def test_a_service_with_a_selector_is_refused_and_the_log_says_what_to_change(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    seed(kube, 1, 8080, "10.0.0.1")
    kube.put("/api/v1/namespaces/default/services", service(selector={"app": "web"}))
    refused = writes_total("web", "refused")
    async with running_proxy(
        [activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings()
    ) as server:
        await until(lambda: server.activators["default/web"].inputs_read and writes_total("web", "refused") > refused)
        await asyncio.sleep(0.3)
    assert slice_writes(kube) == []
    assert ours(kube) == []
    messages = [record.getMessage() for record in caplog.records]
    assert any("has a selector" in m and "remove its selector" in m for m in messages), messages


WARM = [("10.0.0.1", 8080, "http")]


@asynccontextmanager
async def warm_writer(kube: KubeStandIn, kube_client: KubeClient, resync_interval: float) -> AsyncIterator[None]:
    """A proxy leading and writing the Service warm (one pod), resyncing every `resync_interval`."""
    seed(kube, 1, 8080, "10.0.0.1")
    settings = activator_settings(resync_interval=resync_interval)
    async with running_proxy([activator_route(port_outside_ephemeral())], kube=kube_client, activator=settings):
        await until(lambda: listed(kube) == WARM)
        yield


def tamper(kube: KubeStandIn) -> None:
    """Someone rewrites our slice to route elsewhere."""
    changed = kube.get(SLICES, "web-zeroscale-0")
    assert changed is not None
    kube.put(SLICES, {**changed, "endpoints": [{"addresses": ["10.6.6.6"], "conditions": {}}]})
    assert listed(kube) != WARM


async def test_a_slice_someone_deleted_or_changed_is_put_back_at_the_next_resync(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    async with warm_writer(kube, kube_client, resync_interval=0.3):
        kube.delete(SLICES, "web-zeroscale-0")
        await until(lambda: listed(kube) == WARM, within=10)
        tamper(kube)
        await until(lambda: listed(kube) == WARM, within=10)


async def test_a_changed_slice_is_put_back_even_while_the_inputs_keep_changing(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The resync is a schedule, not a quiet period: inputs that change more often than resync_interval (a busy
    cluster's pods, the proxy's own pods in a rollout) must not put it off for ever."""

    async def churn() -> None:
        for generation in range(1, 1000):
            kube.put(PROXY_SLICES, proxies(PROXY_ADDRESS, generation=generation))
            await asyncio.sleep(0.1)

    async with warm_writer(kube, kube_client, resync_interval=0.5):
        tamper(kube)
        churning = asyncio.create_task(churn())
        try:
            await until(lambda: listed(kube) == WARM, within=10)
        finally:
            churning.cancel()


async def test_a_conflict_on_update_is_read_again_and_written(kube: KubeStandIn, kube_client: KubeClient) -> None:
    port = port_outside_ephemeral()
    seed(kube, 1, 8080, "10.0.0.1")
    async with running_proxy([activator_route(port)], kube=kube_client, activator=activator_settings()):
        await until(lambda: listed(kube) == [("10.0.0.1", 8080, "http")])

        def someone_writes_first(method: str, path: str, _body: Any) -> None:
            """Someone writes the slice (an annotation: nothing the writer compares) just before the writer's update
            arrives: written earlier, the writer could have seen it on its watch of its slices, and sent no stale
            update (what it sees is up to the loop's timing)."""
            if method == "PUT" and "/web-zeroscale-0" in path:
                kube.before_write.remove(someone_writes_first)
                current = kube.get(SLICES, "web-zeroscale-0")
                assert current is not None
                kube.put(SLICES, {**current, "metadata": {**current["metadata"], "annotations": {"note": "x"}}})

        kube.before_write.append(someone_writes_first)
        conflicts = writes_total("web", "conflict")
        set_replicas(kube, 0)
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http")])
    assert writes_total("web", "conflict") == conflicts + 1
    puts = [path for method, path, _ in kube.requests if method == "PUT" and "/web-zeroscale-0?" in path]
    assert len(puts) == 2, "the stale one (409), then the one with the version read again"


async def test_the_proxy_service_is_read_on_any_port(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """proxy_service names no port (only the addresses are used, each with the route's activator.port); the
    chart's proxy Service names its port `http`, and a Service may have several: each pod listed once."""
    port = port_outside_ephemeral()
    seed(kube, 0, 8080)
    two_ports = proxies(PROXY_ADDRESS, "10.1.0.8")
    two_ports["ports"].append({"name": "admin", "port": 9090, "protocol": "TCP"})
    kube.put(PROXY_SLICES, two_ports)
    async with running_proxy([activator_route(port)], kube=kube_client, activator=activator_settings()):
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http"), ("10.1.0.8", port, "http")])


async def test_a_service_created_again_is_owned_by_the_new_one(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Deleted and created again, the Service has a new uid: slices naming the old one as their owner are
    deleted by the garbage collector, so the writer must name the new one (read again at each resync)."""
    port = port_outside_ephemeral()
    seed(kube, 1, 8080, "10.0.0.1")
    settings = activator_settings(resync_interval=0.3)
    async with running_proxy([activator_route(port)], kube=kube_client, activator=settings):
        await until(lambda: listed(kube) == [("10.0.0.1", 8080, "http")])
        kube.delete("/api/v1/namespaces/default/services", "web")
        # The garbage collector will delete the slice (its owner is gone), in its own time: it must be owned by the
        # new Service before that.
        kube.put("/api/v1/namespaces/default/services", service(uid="7f00-the-new-web"))

        def owner_uid() -> str | None:
            body = kube.get(SLICES, "web-zeroscale-0")
            return body["metadata"]["ownerReferences"][0]["uid"] if body else None

        await until(lambda: owner_uid() == "7f00-the-new-web", within=10)


async def test_a_writer_that_stops_leading_mid_write_writes_no_more(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Two slices to create; the Lease is lost while the first is on its way: the second is not written (the new
    leader may be writing by then)."""
    port = port_outside_ephemeral()
    seed(kube, 1, 8080, "10.0.0.1", "10.0.0.2")
    entered, release = threading.Event(), threading.Event()

    def slow_first_post(method: str, path: str, _body: Any) -> None:
        """Holds the first slice write that is on time (a stall may make one late: 504 before this hook), which is
        then applied whenever released."""
        if method == "POST" and "/endpointslices" in path:
            kube.before_write.remove(slow_first_post)
            entered.set()
            release.wait(10)

    def refuse_renewals(request: StandInRequest, _match: Any) -> Reply | None:
        return Reply(500, status_body(500, "InternalError", "etcd is unwell")) if request.method == "PUT" else None

    kube.before_write.append(slow_first_post)
    route = activator_route(port, activator={"max_endpoints_per_slice": 1})
    async with running_proxy(
        [route], kube=kube_client, activator=activator_settings("proxy-a", **SHORT_LEASE)
    ) as server:
        leader = server.leader
        assert leader is not None
        await until(entered.is_set)
        kube.add_route("PUT", LEASES + "/.*", refuse_renewals)
        await until(lambda: not leader.leading, within=10)
        release.set()
        await until(lambda: len(ours(kube)) == 1)
        await asyncio.sleep(0.5)
        assert [name for _, name in slice_writes(kube)] == [slices_collection("default")]
        assert len(ours(kube)) == 1


async def test_cold_with_no_proxy_pod_to_list_the_slices_keep_the_pods(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """No proxy pod ready or serving (a rollout gone wrong): refusing every connection is worse than the pods."""
    seed(kube, 1, 8080, "10.0.0.1")
    kube.put(PROXY_SLICES, proxies())  # the proxy's Service lists no pod
    async with running_proxy(
        [activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings()
    ):
        await until(lambda: listed(kube) == WARM)
        set_replicas(kube, 0)  # cold: the proxy should be listed, but there is none
        await asyncio.sleep(0.5)
        assert listed(kube) == WARM


async def test_a_selector_given_to_the_service_later_removes_our_slices(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Kubernetes' controller writes a Service's slices once it has a selector: ours, merged with its own by
    kube-proxy, would send part of the traffic elsewhere."""
    async with warm_writer(kube, kube_client, resync_interval=0.3):
        kube.put("/api/v1/namespaces/default/services", service(selector={"app": "web"}))
        await until(lambda: ours(kube) == [], within=10)


async def test_a_missing_service_is_named_with_what_to_do(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    seed(kube, 1, 8080, "10.0.0.1")
    kube.delete("/api/v1/namespaces/default/services", "web")
    refused = writes_total("web", "refused")
    async with running_proxy(
        [activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings()
    ):
        await until(lambda: writes_total("web", "refused") > refused)
    assert slice_writes(kube) == []
    messages = [record.getMessage() for record in caplog.records]
    assert any("does not exist: create it without a selector" in m for m in messages), messages


def switches_timed(route: str, to: str) -> float:
    labels = {"route": f"default/{route}", "to": to}
    return REGISTRY.get_sample_value("zeroscale_proxy_activator_switch_seconds_count", labels) or 0.0


async def test_a_switch_whose_first_write_failed_is_timed_when_it_is_written(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    failures = [1]

    def fail_once(request: StandInRequest, _match: Any) -> Reply | None:
        if failures and request.method == "PUT":
            failures.pop()
            return Reply(500, status_body(500, "InternalError", "etcd is unwell"))
        return None

    async with warm_writer(kube, kube_client, resync_interval=30):
        timed = switches_timed("web", "proxy")
        kube.add_route("PUT", SLICES_V1 + "/.*", fail_once)
        set_replicas(kube, 0)
        await until(lambda: [address for address, _, _ in listed(kube)] == [PROXY_ADDRESS])
        assert not failures, "the first write was refused"
        await until(lambda: switches_timed("web", "proxy") == timed + 1)


async def test_a_slice_whose_address_family_changes_is_replaced_not_updated(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """A slice's addressType is immutable. Dual-stack pods over two slices of IPv4 and one of IPv6, then the proxy's
    dual-stack pods (one IPv4 slice, one IPv6): the second slice's family changes. Updated in place, the API
    refuses it at every try and the Service stayed on the pods after replicas 0 (the proxy never listed)."""
    port = port_outside_ephemeral()
    seed(kube, 1, 8080)
    kube.put(SLICES, pods(8080, "10.0.0.1", "10.0.0.2"))
    six = endpoint_slice("web-pods-v6", "web-pods", [("fd00::1", {"ready": True})], 8080)
    kube.put(SLICES, {**six, "addressType": "IPv6"})
    proxy_six = endpoint_slice("zeroscale-proxy-v6", "zeroscale-proxy", [("fd00::7", {"ready": True})], 8080)
    proxy_six["metadata"]["namespace"] = "zeroscale"
    kube.put(PROXY_SLICES, {**proxy_six, "addressType": "IPv6"})
    route = activator_route(port, activator={"max_endpoints_per_slice": 1})
    async with running_proxy([route], kube=kube_client, activator=activator_settings()):
        await until(lambda: len(listed(kube)) == 3)
        assert [body["addressType"] for body in sorted(ours(kube), key=lambda b: b["metadata"]["name"])] == [
            "IPv4",
            "IPv4",
            "IPv6",
        ]
        set_replicas(kube, 0)
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http"), ("fd00::7", port, "http")], within=10)
    by_name = {body["metadata"]["name"]: body["addressType"] for body in ours(kube)}
    assert by_name == {"web-zeroscale-0": "IPv4", "web-zeroscale-1": "IPv6"}


def test_two_routes_may_not_write_one_service() -> None:
    """Each would write the Service's slices from its own decision (one warm, one cold): rewritten at every event."""
    routes = [activator_route(9001, name="web"), activator_route(9002, name="web-api", hosts=["api.example"])]
    with pytest.raises(ValidationError, match="default/web"):
        ProxyConfig.model_validate({"routes": routes, "activator": activator_settings()})
    routes[1]["upstream"] = {**routes[1]["upstream"], "namespace": "other"}
    routes[1]["target"] = {**routes[1]["target"], "namespace": "other"}
    ProxyConfig.model_validate({"routes": routes, "activator": activator_settings()})  # another namespace's web


def test_an_activator_routes_target_is_in_its_services_namespace() -> None:
    """Its spec.replicas was watched in the Service's namespace whatever the target said: a target elsewhere was
    read as a missing workload there (or another one of the same name), and the switch followed that."""
    route = activator_route(9001, target={"namespace": "other", "kind": "Deployment", "name": "web"})
    with pytest.raises(ValidationError, match=r"target in the upstream's namespace \(default\), not other"):
        ProxyConfig.model_validate({"routes": [route], "activator": activator_settings()})


def test_an_activator_route_name_too_long_for_a_label_value_is_refused_at_load_with_what_to_change() -> None:
    """The route's name is the zeroscale.io/route label's value on every slice written, and the API refuses a label
    value over 63 characters: the Service would never get a slice, write after write refused."""
    fits = "r" * 63
    ProxyConfig.model_validate(
        {"routes": [activator_route(port_outside_ephemeral(), name=fits)], "activator": activator_settings()}
    )
    too_long = "r" * 64
    with pytest.raises(ValidationError, match=r"at most 63 characters \(this name has 64\): shorten the route's name"):
        ProxyConfig.model_validate(
            {"routes": [activator_route(port_outside_ephemeral(), name=too_long)], "activator": activator_settings()}
        )
    # In the path, the name is only a metric label's value, which has no such bound.
    ProxyConfig.model_validate({"routes": [{"name": too_long, "upstream": {"address": "web:80"}, "wake": "none"}]})


async def test_an_fqdn_slice_of_the_pods_is_not_copied(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Issue 28, finding 5: its name went into an IPv4 slice, every write was refused, and the Service stayed on the
    proxy while the activator believed it warm. kube-proxy ignores FQDN slices: so does the copy."""
    seed(kube, 1, 8080, "10.0.0.1")
    kube.put(
        SLICES,
        {**endpoint_slice("web-pods-fqdn", "web-pods", [("localhost", {"ready": True})], 8080), "addressType": "FQDN"},
    )
    async with running_proxy(
        [activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings()
    ) as a:
        await until(lambda: listed(kube) == [("10.0.0.1", 8080, "http")])
        await asyncio.sleep(0.3)  # nothing more is written
        assert listed(kube) == [("10.0.0.1", 8080, "http")]
        assert a.activators["default/web"].warm


# --- bounded staleness and our own outputs (issue 28 findings 1 and 6; docs/architecture.md#staleness-bounds) ---


def route_hosts(server: Proxy) -> list[str]:
    return sorted(endpoint.host for endpoint in server.routes["default/web"].endpoints)


async def test_a_pod_replaced_under_a_silent_watch_leaves_the_route_and_the_service_within_the_silence_timeout(
    kube: KubeStandIn,
) -> None:
    """Finding 1: the EndpointSlice watch went silent (open, nothing sent, the lists fine) and the Service and the
    in-path route listed the replaced pod for 301 s. Now for at most kubernetes.watch_silence_timeout (3 s here;
    the resync, 30 s, is not what ends it)."""
    client = KubeClient.from_config(kube.client_config(watch_silence_timeout=3))
    seed(kube, 1, 8080, "10.0.0.1")
    try:
        async with running_proxy(
            [activator_route(port_outside_ephemeral())], kube=client, activator=activator_settings()
        ) as server:
            await until(lambda: listed(kube) == WARM and route_hosts(server) == ["10.0.0.1"])
            kube.silence_watches(SLICES_V1)
            kube.put(SLICES, pods(8080, "10.0.0.2"))  # the pod replaced
            await until(lambda: listed(kube) == [("10.0.0.2", 8080, "http")], within=20)
            await until(lambda: route_hosts(server) == ["10.0.0.2"], within=10)
    finally:
        await client.close()


async def test_the_resync_reads_the_inputs_again(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """The resync compared our slices with what they should be built from the watches' copies: under silent
    watches it rebuilt the same stale slices at every resync. It lists the target, its pods and the proxy's pods
    again (the watches' silence timeout here is the default 30 s)."""
    port = port_outside_ephemeral()
    seed(kube, 1, 8080, "10.0.0.1")
    settings = activator_settings(resync_interval=0.5)
    async with running_proxy([activator_route(port)], kube=kube_client, activator=settings):
        await until(lambda: listed(kube) == WARM)
        kube.silence_watches(SLICES_V1)
        kube.silence_watches(DEPLOYMENTS)
        kube.put(SLICES, pods(8080, "10.0.0.2"))
        await until(lambda: listed(kube) == [("10.0.0.2", 8080, "http")], within=10)
        set_replicas(kube, 0)
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http")], within=10)
        kube.put(PROXY_SLICES, proxies("10.1.0.8"))  # the proxy's own pod replaced
        await until(lambda: listed(kube) == [("10.1.0.8", port, "http")], within=10)


async def test_a_slice_someone_deleted_or_changed_is_written_back_at_once(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Finding 6: deleted (a person, the garbage collector), the Service had no slice until the next resync (28 s
    in the review), refusing every connection. The writer watches its slices: back within a second (the test allows
    10 s on a loaded machine; the resync is 30 s)."""
    async with warm_writer(kube, kube_client, resync_interval=30):
        kube.delete(SLICES, "web-zeroscale-0")
        await until(lambda: listed(kube) == WARM, within=10)
        tamper(kube)
        await until(lambda: listed(kube) == WARM, within=10)


async def test_a_service_created_again_gets_its_slices_back_at_once(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Deleted, the Service's slices go with it (the garbage collector); created again, nothing about our slices
    changes after that: the writer watches the Service too, and writes them, owned by the new one, at once."""
    async with warm_writer(kube, kube_client, resync_interval=30):
        kube.delete("/api/v1/namespaces/default/services", "web")
        kube.delete(SLICES, "web-zeroscale-0")  # the garbage collector: its owner is gone
        await asyncio.sleep(0.5)
        kube.put("/api/v1/namespaces/default/services", service(uid="7f00-the-new-web"))

        def owner_uid() -> str | None:
            body = kube.get(SLICES, "web-zeroscale-0")
            return body["metadata"]["ownerReferences"][0]["uid"] if body else None

        await until(lambda: listed(kube) == WARM and owner_uid() == "7f00-the-new-web", within=10)


async def test_a_selector_given_to_the_service_removes_our_slices_at_once(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The Service is watched: a selector given to it (Kubernetes' controller now writes its slices) removes ours
    at once, not at the next resync (30 s here)."""
    async with warm_writer(kube, kube_client, resync_interval=30):
        kube.put("/api/v1/namespaces/default/services", service(selector={"app": "web"}))
        await until(lambda: ours(kube) == [], within=10)


async def test_a_grpc_call_to_the_activator_port_is_held_while_cold_and_forwarded_over_h2c(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Activator mode for an h2c workload: cold, the Service lists the proxy, whose activator port takes the call
    over HTTP/2 (prior knowledge) and holds it; the pod ready (its port's appProtocol kubernetes.io/h2c), the call goes
    to it over h2c, and the Service lists the pod again."""
    pod_port, port = port_outside_ephemeral(), port_outside_ephemeral()
    seed(kube, 0, pod_port)
    pod = EchoServer(pod_port)
    try:
        async with running_proxy([activator_route(port)], kube=kube_client, activator=activator_settings()) as server:
            await until(lambda: listed(kube) == [(PROXY_ADDRESS, port, "http")])
            async with echo_client(port, **{"grpc.enable_retries": 0}) as client:
                call = client.unary(b"held by the activator", timeout=15)
                await until(lambda: server.routes["default/web"].counts.held == 1)
                set_replicas(kube, 1)
                await pod.start()
                ready = endpoint_slice(
                    "web-pods-abcde",
                    "web-pods",
                    [("127.0.0.1", {"ready": True})],
                    pod_port,
                    app_protocol="kubernetes.io/h2c",
                )
                kube.put(SLICES, ready)
                assert await call == b"held by the activator"
            await until(lambda: listed(kube) == [("127.0.0.1", pod_port, "http")])
            assert server.routes["default/web"].endpoints[0].h2c
    finally:
        await pod.stop()
    assert pod.calls == {"Unary": 1}


async def test_a_route_s_own_port_takes_every_request_whatever_its_headers_the_main_port_matches_them(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Warm, the Service clients call reaches the pods with no header checked; cold, its requests reach the route's
    port: that port does not check them either (docs/architecture.md#route-precedence)."""
    upstream = await Upstream().start()
    port = port_outside_ephemeral()
    seed(kube, 1, upstream.port, "127.0.0.1")
    route = activator_route(port, hosts=["web.example"], match_headers={"x-canary": "1"})
    try:
        async with running_proxy([route], kube=kube_client, activator=activator_settings()) as server:
            await until(lambda: listed(kube) == [("127.0.0.1", upstream.port, "http")])
            assert (await request(port, get("/echo", host="any.example"))).status == 200
            assert (await request(server.port, get("/echo", host="web.example"))).status == 404
            assert (await request(server.port, get("/echo", host="web.example", extra="x-canary: 1\r\n"))).status == 200
    finally:
        await upstream.stop()
    assert len(upstream.requests) == 2
