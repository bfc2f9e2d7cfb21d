"""ZeroscaleRoute objects served live (adapter/proxy/control.py, route_objects.py, claims.py) against the Kubernetes
API stand-in: a route object takes requests once created, a change takes new requests at once while what the old
version admitted finishes there, a deletion answers the held requests 503, routes nobody changed keep their state,
and one team's claim or mistake fails only its own route."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.children import port_outside_ephemeral
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import MANAGED_BY
from adapter.proxy import claims, control
from adapter.proxy.app import Proxy
from adapter.proxy.route_objects import RouteObjects
from tests.fixtures.kube_routes import SLICES_V1, ScaleStandIn, SlowLists, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.proxy import get, read_response, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream

LEASES = r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases"
DEPLOYMENTS = r"/apis/apps/v1/namespaces/[^/]+/deployments"
SERVICES = r"/api/v1/namespaces/[^/]+/services"
LEASE_COLLECTION = "/apis/coordination.k8s.io/v1/namespaces/zeroscale/leases"
ROUTES = r"/apis/zeroscale\.io/v1alpha1/namespaces/[^/]+/zeroscaleroutes"
ACTIVATOR = {
    "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
    "lease_namespace": "zeroscale",
    "identity": "proxy-a",
}


def routes_collection(namespace: str) -> str:
    return f"/apis/zeroscale.io/v1alpha1/namespaces/{namespace}/zeroscaleroutes"


def route_object(namespace: str, name: str, hosts: list[str], generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "zeroscale.io/v1alpha1",
        "kind": "ZeroscaleRoute",
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": {"hosts": hosts, "upstream": {"service": "web", "port": "http"}, "wake": "none", **spec},
    }


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList", writable=True)
        standin.serve_collection(LEASES, "LeaseList", writable=True)
        standin.serve_collection(ROUTES, "ZeroscaleRouteList", writable=True)
        standin.serve_collection(DEPLOYMENTS, "DeploymentList", writable=True)
        standin.serve_collection(SERVICES, "ServiceList", writable=True)
        yield standin


@asynccontextmanager
async def route_proxy(
    kube: KubeStandIn, client: KubeClient, routes: list[dict[str, Any]] | None = None, **objects: Any
) -> AsyncIterator[Proxy]:
    settings = {"namespaces": ["team-a", "team-b"], **objects, "enabled": True}
    async with running_proxy(routes or [], kube=client, activator=ACTIVATOR, route_objects=settings) as proxy:
        yield proxy


def serve_pods(kube: KubeStandIn, namespace: str, app: Upstream | None) -> None:
    """Service `web` of `namespace` has `app` as its one ready pod (None: no pod at all: the workload at zero)."""
    endpoints = [] if app is None else [("127.0.0.1", {"ready": True})]
    kube.put(slices_collection(namespace), endpoint_slice("web-1", "web", endpoints, app.port if app else 80))


def held_gauge(route: str) -> float | None:
    return REGISTRY.get_sample_value("zeroscale_proxy_held_requests", {"route": route})


async def status_of(port: int, host: str) -> int:
    return (await request(port, get("/echo", host=host))).status


async def routed(port: int, host: str) -> None:
    """Wait until a request for `host` is routed (no longer the proxy's own 404)."""
    for _ in range(500):
        if await status_of(port, host) != 404:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{host} was never routed")


async def test_a_route_object_takes_requests_once_created_and_a_file_route_keeps_working(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    file_route = {"name": "own", "hosts": ["own.example"], "upstream": {"address": upstream.address}}
    file_route |= {"wake": "none", "readiness": "probe"}
    serve_pods(kube, "team-a", upstream)
    async with route_proxy(kube, kube_client, [file_route]) as proxy:
        assert await status_of(proxy.port, "shop.example") == 404
        kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
        await routed(proxy.port, "shop.example")
        assert await status_of(proxy.port, "shop.example") == 200
        assert await status_of(proxy.port, "own.example") == 200
        assert set(proxy.routes) == {"default/own", "team-a/shop"}


async def test_an_edit_routes_new_requests_at_once_and_leaves_unchanged_routes_as_they_were(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", upstream)
    serve_pods(kube, "team-b", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
    kube.put(routes_collection("team-b"), route_object("team-b", "blog", ["blog.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await routed(proxy.port, "shop.example")
        await routed(proxy.port, "blog.example")
        blog, shop = proxy.routes["team-b/blog"], proxy.routes["team-a/shop"]
        blog_requests = blog.stats.requests
        # A change of the status alone (the proxy's own writes) is no change of the routes: the table stands.
        table = proxy.control.table
        status_only = route_object("team-b", "blog", ["blog.example"])
        status_only["status"] = {"observedGeneration": 1}
        kube.put(routes_collection("team-b"), status_only)
        await until(lambda: any(o.status for o in proxy.control.route_objects.objects()))  # type: ignore[union-attr]
        await asyncio.sleep(0.05)
        assert proxy.control.table is table
        edited = route_object("team-a", "shop", ["shop.example", "store.example"], generation=2)
        kube.put(routes_collection("team-a"), edited)
        await routed(proxy.port, "store.example")
        assert proxy.routes["team-a/shop"] is not shop  # a new version
        assert proxy.routes["team-b/blog"] is blog  # untouched: its pools, queue and counters go on
        assert blog.stats.requests == blog_requests
        assert await status_of(proxy.port, "blog.example") == 200
        assert blog.stats.requests == blog_requests + 1


async def test_requests_held_by_a_changed_route_finish_on_the_version_that_admitted_them(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", None)  # at zero: requests are held
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/shop" in proxy.routes)
        old = proxy.routes["team-a/shop"]
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(get("/echo?held=1", host="shop.example"))
        await until(lambda: len(old.queue) == 1)
        limits = {"hold_timeout": "30s", "max_held_requests": 7}
        kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"], 2, limits=limits))
        await until(lambda: proxy.routes["team-a/shop"] is not old)
        assert proxy.routes["team-a/shop"].limits.max_held_requests == 7
        assert old.counts is proxy.routes["team-a/shop"].counts  # one sum for the HPA
        assert old.counts.held == 1
        serve_pods(kube, "team-a", upstream)  # the workload wakes: the old version's own watch sees it
        response = await asyncio.wait_for(read_response(reader), 10)
        writer.close()
        assert response.status == 200
        assert response.headers["x-seen-path"] == "/echo?held=1"
        await until(lambda: old.counts.pending == 0)


async def test_a_deleted_route_answers_its_held_requests_503_and_leaves_no_series(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    serve_pods(kube, "team-a", None)
    kube.put(routes_collection("team-a"), route_object("team-a", "gone", ["gone.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/gone" in proxy.routes)
        held = [asyncio.create_task(request(proxy.port, get("/echo", host="gone.example"))) for _ in range(3)]
        await until(lambda: proxy.routes["team-a/gone"].counts.held == 3)
        assert held_gauge("team-a/gone") == 3
        kube.delete(routes_collection("team-a"), "gone")
        responses = await asyncio.wait_for(asyncio.gather(*held), 10)
        assert [response.status for response in responses] == [503] * 3
        assert all(b"route team-a/gone was deleted" in response.body for response in responses)
        assert await status_of(proxy.port, "gone.example") == 404
        await until(
            lambda: REGISTRY.get_sample_value("zeroscale_proxy_held_requests", {"route": "team-a/gone"}) is None
        )


async def test_a_deleted_route_whose_last_request_is_at_its_fallback_is_closed_once_it_is_answered(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The retired version waits for what it admitted, its fallback's requests too; the last one answered, it closes
    and its series go (a request at the fallback changes only the fallback's counts, not the route's)."""
    static = await Upstream().start()
    try:
        serve_pods(kube, "team-a", None)
        ready = [("127.0.0.1", {"ready": True})]
        kube.put(slices_collection("team-a"), endpoint_slice("static-1", "static", ready, static.port))
        fallback = {"service": "static", "port": "http", "after": 0.1}
        kube.put(routes_collection("team-a"), route_object("team-a", "gone", ["gone.example"], fallback=fallback))
        async with route_proxy(kube, kube_client) as proxy:
            await until(lambda: "team-a/gone" in proxy.routes)
            at_fallback = proxy.routes["team-a/gone"].fallback
            assert at_fallback is not None
            await until(at_fallback.has_usable)
            answered = asyncio.create_task(request(proxy.port, get("/slow?s=0.5", host="gone.example")))
            await until(lambda: at_fallback.counts.inflight == 1)
            kube.delete(routes_collection("team-a"), "gone")
            assert (await asyncio.wait_for(answered, 10)).status == 200
            await until(lambda: "team-a/gone" not in proxy.control._retiring, within=3)
            assert held_gauge("team-a/gone") is None
            assert held_gauge("team-a/gone/fallback") is None
    finally:
        await static.stop()


async def test_an_edit_that_drops_the_fallback_leaves_no_fallback_series(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The route stays, its fallback goes: once the version that had it is closed, nothing reads that fallback any
    more (its gauges read the closed version's endpoints, and kept it alive)."""
    serve_pods(kube, "team-a", None)
    kube.put(slices_collection("team-a"), endpoint_slice("static-1", "static", [("127.0.0.1", {"ready": True})], 80))
    fallback = {"service": "static", "port": "http", "after": 0.1}
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"], fallback=fallback))
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/shop" in proxy.routes)
        old = proxy.routes["team-a/shop"]
        assert old.fallback is not None
        await until(old.fallback.has_usable)

        def ready_gauge() -> float | None:
            return REGISTRY.get_sample_value("zeroscale_proxy_ready_endpoints", {"route": "team-a/shop/fallback"})

        assert ready_gauge() == 1
        kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"], 2))
        await until(lambda: proxy.routes["team-a/shop"] is not old)
        await until(lambda: "team-a/shop" not in proxy.control._retiring, within=3)
        assert ready_gauge() is None
        assert REGISTRY.get_sample_value("zeroscale_proxy_ready_endpoints", {"route": "team-a/shop"}) == 0


async def test_a_route_object_wakes_its_also_wake_targets_in_its_own_namespace(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """A team's route waking Deployment web and, with it, Deployment api (also_wake names a kind and a name, in the
    route's own namespace): one held request patches both Scales of team-a, none of another namespace's."""
    scales = [ScaleStandIn(kube, "team-a", name, replicas=0) for name in ("web", "api")]
    elsewhere = ScaleStandIn(kube, "team-b", "api", replicas=0)
    serve_pods(kube, "team-a", None)
    stack = route_object(
        "team-a", "stack", ["stack.example"], wake="always", target={"name": "web"}, also_wake=[{"name": "api"}]
    )
    kube.put(routes_collection("team-a"), stack)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/stack" in proxy.routes)
        pending = asyncio.create_task(request(proxy.port, get("/echo", host="stack.example")))
        await until(lambda: all(scale.replicas == 1 for scale in scales))
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
    assert [len(scale.patches) for scale in scales] == [1, 1]
    assert elsewhere.patches == []


async def test_a_host_belongs_to_its_oldest_claim_and_the_younger_route_is_refused_naming_it(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", upstream)
    serve_pods(kube, "team-b", upstream)
    older = route_object("team-b", "first", ["shared.example"])
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    younger = route_object("team-a", "second", ["shared.example", "mine.example"])
    younger["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    kube.put(routes_collection("team-a"), younger)
    kube.put(routes_collection("team-b"), older)
    async with route_proxy(kube, kube_client) as proxy:
        # Placed together once both namespaces are listed: the younger claim is never served meanwhile.
        await until(lambda: "team-b/first" in proxy.routes or "team-a/second" in proxy.routes)
        assert "team-a/second" not in proxy.routes
        refusal = proxy.control.refusals["team-a/second"]
        assert refusal.reason == "HostClaimed"
        assert "team-b/first" in refusal.message
        assert "team-a/second" not in proxy.routes
        # Refused whole: none of its hosts is served, and it took nothing from the winner.
        assert await status_of(proxy.port, "mine.example") == 404
        assert await status_of(proxy.port, "shared.example") == 200
        kube.delete(routes_collection("team-b"), "first")  # the claim is free: the other route gets it
        await until(lambda: "team-a/second" in proxy.routes)
        assert "team-a/second" not in proxy.control.refusals


async def test_a_file_route_is_older_than_any_object(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    file_route = {"name": "own", "hosts": ["own.example"], "upstream": {"address": upstream.address}}
    file_route |= {"wake": "none", "readiness": "probe", "namespace": "platform"}
    serve_pods(kube, "team-a", upstream)
    claim = route_object("team-a", "grab", ["own.example"])
    claim["metadata"]["creationTimestamp"] = "2000-01-01T00:00:00Z"
    kube.put(routes_collection("team-a"), claim)
    async with route_proxy(kube, kube_client, [file_route]) as proxy:
        await until(lambda: "team-a/grab" in proxy.control.refusals)
        assert "platform/own" in proxy.control.refusals["team-a/grab"].message


async def test_the_platform_policy_refuses_namespaces_and_hosts_it_did_not_grant(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", upstream)
    serve_pods(kube, "team-b", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "ok", ["team-a.apps.example"]))
    kube.put(routes_collection("team-a"), route_object("team-a", "greedy", ["team-b.apps.example"]))
    kube.put(routes_collection("team-b"), route_object("team-b", "outside", ["team-b.apps.example"]))
    grants = [{"namespaces": ["*"], "hosts": ["{namespace}.apps.example"]}]
    async with route_proxy(kube, kube_client, namespaces=["team-a"], hosts=grants) as proxy:
        await until(lambda: "team-a/ok" in proxy.routes and "team-a/greedy" in proxy.control.refusals)
        assert proxy.control.refusals["team-a/greedy"].reason == "HostNotAllowed"
        # team-b's routes are not read at all: the proxy watches the namespaces it serves only.
        assert "team-b/outside" not in proxy.routes
        assert not any("/namespaces/team-b/" in path for _, path, _ in kube.requests)
        assert await status_of(proxy.port, "team-a.apps.example") == 200


async def test_an_invalid_route_fails_alone(kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream) -> None:
    serve_pods(kube, "team-a", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "good", ["good.example"]))
    kube.put(routes_collection("team-a"), route_object("team-a", "bad", ["bad.example"], wake="scale"))
    async with route_proxy(kube, kube_client) as proxy:
        await routed(proxy.port, "good.example")
        refusal = proxy.control.refusals["team-a/bad"]
        assert refusal.reason == "InvalidSpec"
        assert "wake: scale needs a target" in refusal.message


async def test_without_the_crd_the_file_routes_serve_and_objects_are_picked_up_once_it_is_installed(
    kube_client: KubeClient, upstream: Upstream
) -> None:
    file_route = {"name": "own", "hosts": ["own.example"], "upstream": {"address": upstream.address}}
    file_route |= {"wake": "none", "readiness": "probe"}
    with KubeStandIn(tls=False, token="proxy-token") as bare:
        bare.serve_collection(SLICES_V1, "EndpointSliceList", writable=True)
        bare.serve_collection(LEASES, "LeaseList", writable=True)
        client = KubeClient.from_config(bare.client_config())
        try:
            async with route_proxy(bare, client, [file_route]) as proxy:
                assert await status_of(proxy.port, "own.example") == 200
                await until(lambda: any("zeroscaleroutes" in path for _, path, _ in bare.requests))
                serve_pods(bare, "team-a", upstream)
                bare.serve_collection(ROUTES, "ZeroscaleRouteList", writable=True)  # the CRD is installed
                bare.put(routes_collection("team-a"), route_object("team-a", "late", ["late.example"]))
                await routed(proxy.port, "late.example")
        finally:
            await client.close()


def activator_object(namespace: str, name: str, port: int, generation: int = 1) -> dict[str, Any]:
    """A route object in mode activator: clients call Service `web`, whose slices the proxy writes; `web-pods`
    selects the pods of Deployment `web`."""
    body = route_object(namespace, name, ["web.example"], generation, mode="activator")
    body["spec"] |= {
        "upstream": {"service": "web-pods", "port": "http"},
        "activator": {"service": "web", "port": port},
        "target": {"kind": "Deployment", "name": "web"},
    }
    return body


def seed_activator(kube: KubeStandIn, namespace: str) -> None:
    """Deployment web at 0, the selector-less Service web, no pod, and the proxy's own pod 10.1.0.7."""
    kube.put(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        {"kind": "Deployment", "metadata": {"name": "web", "namespace": namespace}, "spec": {"replicas": 0}},
    )
    kube.put(
        f"/api/v1/namespaces/{namespace}/services",
        {"kind": "Service", "metadata": {"name": "web", "namespace": namespace, "uid": "uid-web"}, "spec": {}},
    )
    kube.put(slices_collection(namespace), endpoint_slice("web-pods-1", "web-pods", [], 80))
    proxy_pod = endpoint_slice("zeroscale-proxy-1", "zeroscale-proxy", [("10.1.0.7", {"ready": True})], 8080)
    kube.put(slices_collection("zeroscale"), proxy_pod)


def written_slices(kube: KubeStandIn, namespace: str) -> list[dict[str, Any]]:
    return [
        obj
        for obj in kube.objects(slices_collection(namespace))
        if obj["metadata"]["labels"].get("endpointslice.kubernetes.io/managed-by") == MANAGED_BY
    ]


async def test_a_route_object_in_mode_activator_gets_its_port_writes_its_slices_and_gives_both_up_when_deleted(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    port = port_outside_ephemeral()
    seed_activator(kube, "team-a")
    kube.put(routes_collection("team-a"), activator_object("team-a", "web", port))
    ports = {"first": port, "last": port}
    async with route_proxy(kube, kube_client, activator_ports=ports) as proxy:
        await until(lambda: "team-a/web" in proxy.activators)
        # Cold: the Service's slice lists the proxy's pod on the route's own port (the Lease holder wrote it).
        await until(lambda: bool(written_slices(kube, "team-a")))
        (written,) = written_slices(kube, "team-a")
        assert [endpoint["addresses"] for endpoint in written["endpoints"]] == [["10.1.0.7"]]
        assert written["ports"][0]["port"] == port
        assert written["metadata"]["labels"]["zeroscale.io/route"] == "web"  # a label value: the name alone
        # The Lease says this replica writes the route's Service (what other replicas compare with theirs).
        await until(lambda: "team-a/web@" in str(kube.objects(LEASE_COLLECTION)))
        # Whatever the Host, a request on the route's port is the route's: held while the workload is at zero.
        held = asyncio.create_task(request(port, get("/echo", host="anything.example")))
        await until(lambda: proxy.routes["team-a/web"].counts.held == 1)
        kube.delete(routes_collection("team-a"), "web")
        response = await asyncio.wait_for(held, 10)
        assert response.status == 503
        assert b"route team-a/web was deleted" in response.body
        await until(lambda: "team-a/web" not in proxy.activators)

        async def refused() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                return True
            writer.close()
            return False

        for _ in range(200):
            if await refused():
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"port {port} still listens after its route was deleted")


async def test_activator_ports_are_the_platforms_and_each_is_claimed_once(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    port = port_outside_ephemeral()
    seed_activator(kube, "team-a")
    seed_activator(kube, "team-b")
    first = activator_object("team-a", "web", port)
    first["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    second = activator_object("team-b", "web", port)
    second["spec"]["hosts"] = ["other.example"]
    outside = activator_object("team-b", "far", port + 1)
    outside["spec"]["hosts"] = ["far.example"]
    outside["spec"]["activator"]["service"] = "far"
    for body in (first, second, outside):
        kube.put(routes_collection(body["metadata"]["namespace"]), body)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/web" in proxy.control.refusals)
        assert proxy.control.refusals["team-a/web"].reason == "ActivatorNotAllowed"
    async with route_proxy(kube, kube_client, activator_ports={"first": port, "last": port}) as proxy:
        await until(lambda: "team-a/web" in proxy.activators and len(proxy.control.refusals) == 2)
        assert proxy.control.refusals["team-b/web"].reason == "PortClaimed"
        assert "team-a/web" in proxy.control.refusals["team-b/web"].message
        assert proxy.control.refusals["team-b/far"].reason == "PortNotAllowed"


async def test_a_proxy_is_not_ready_before_it_has_read_the_route_objects(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """A new pod of a rollout must not take requests it would answer 404 for want of routes it has not read yet."""
    serve_pods(kube, "team-a", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
    slow = SlowLists(kube, ROUTES)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: slow.waiting > 0)
        assert (await request(proxy.admin_port, get("/readyz"))).status == 503
        slow.answer()
        await until(lambda: "team-a/shop" in proxy.routes)
        assert (await request(proxy.admin_port, get("/readyz"))).status == 200


async def test_a_team_cannot_make_the_shared_proxy_hold_more_or_spin_faster_than_the_platform_allows(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", upstream)
    greedy = route_object("team-a", "greedy", ["greedy.example"], limits={"max_held_bytes": 2**40})
    spinning = route_object("team-a", "spinning", ["spin.example"], probe_interval="1ms")
    modest = route_object("team-a", "modest", ["modest.example"], limits={"max_held_requests": 2000})
    for body in (greedy, spinning, modest):
        kube.put(routes_collection("team-a"), body)
    async with route_proxy(kube, kube_client, max_limits={"max_held_requests": 5000}) as proxy:
        await until(lambda: "team-a/modest" in proxy.routes and len(proxy.control.refusals) == 2)
        refusal = proxy.control.refusals["team-a/greedy"]
        assert refusal.reason == "LimitNotAllowed"
        assert "limits.max_held_bytes" in refusal.message
        assert "proxy.route_objects.max_limits" in refusal.message
        assert proxy.control.refusals["team-a/spinning"].reason == "InvalidSpec"
        assert "spec.probe_interval" in proxy.control.refusals["team-a/spinning"].message


async def test_a_table_that_cannot_be_built_leaves_the_one_in_force_and_the_next_change_is_applied(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault injected where no check foresaw one: the proxy keeps serving, counts it, and recovers."""
    import adapter.proxy.control as control

    serve_pods(kube, "team-a", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await routed(proxy.port, "shop.example")
        failures = REGISTRY.get_sample_value("zeroscale_proxy_route_table_failures_total") or 0.0
        place = control.place  # type: ignore[attr-defined]

        def broken(*args: Any) -> Any:
            monkeypatch.setattr(control, "place", place)  # once
            raise RuntimeError("injected")

        monkeypatch.setattr(control, "place", broken)
        kube.put(routes_collection("team-a"), route_object("team-a", "blog", ["blog.example"]))
        await until(lambda: REGISTRY.get_sample_value("zeroscale_proxy_route_table_failures_total") == failures + 1)
        assert await status_of(proxy.port, "shop.example") == 200
        kube.put(routes_collection("team-a"), route_object("team-a", "news", ["news.example"]))
        await routed(proxy.port, "news.example")
        assert await status_of(proxy.port, "blog.example") == 200


async def test_an_event_costs_the_object_it_changed_not_every_route(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """10,000 routes, one status written: the proxy looks at that one object (most events are its own status writes)."""
    serve_pods(kube, "team-a", upstream)
    for index in range(50):
        kube.put(routes_collection("team-a"), route_object("team-a", f"r{index}", [f"r{index}.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        objects = proxy.control.route_objects
        assert objects is not None
        await until(lambda: len(proxy.routes) == 50)
        seen: list[set[str]] = []
        take = objects.take_changes

        def recording() -> tuple[set[str], bool]:
            changed, specs = take()
            seen.append(changed)
            return changed, specs

        objects.take_changes = recording  # type: ignore[method-assign]
        before = {key: objects.get(key) for key in proxy.routes}
        table = proxy.control.table
        body = route_object("team-a", "r7", ["r7.example"])
        body["status"] = {"observedGeneration": 1, "held": 3}
        kube.put(routes_collection("team-a"), body)
        await until(lambda: any("team-a/r7" in changed for changed in seen))
        # The change names the object it changed; none was parsed again (a status is no spec).
        configs = {key: obj.config for key, obj in before.items() if obj is not None}
        assert all(getattr(objects.get(key), "config", None) is config for key, config in configs.items())
        assert len(configs) == 50
        assert proxy.control.table is table


async def test_the_routes_of_a_namespace_share_one_watch_of_its_slices(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """10,000 routes must not be 10,000 watches of the API server: one per namespace, each change to its readers."""
    for index in range(20):
        body = endpoint_slice(f"svc{index}-1", f"svc{index}", [("127.0.0.1", {"ready": True})], upstream.port)
        kube.put(slices_collection("team-a"), body)
        route = route_object("team-a", f"r{index}", [f"r{index}.example"])
        route["spec"]["upstream"]["service"] = f"svc{index}"
        kube.put(routes_collection("team-a"), route)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: len(proxy.routes) == 20 and all(r.endpoints for r in proxy.routes.values()))
        reads = [path for _, path, _ in kube.requests if "/namespaces/team-a/endpointslices" in path]
        assert len([path for path in reads if "watch" not in path]) == 1, reads
        # A change of one Service's slice reaches its route, and only its route.
        r3, r4 = proxy.routes["team-a/r3"], proxy.routes["team-a/r4"]
        kube.put(slices_collection("team-a"), endpoint_slice("svc3-1", "svc3", [], upstream.port))
        await until(lambda: not r3.endpoints)
        assert r4.endpoints
        # The last route reading the namespace gone, its watch stops.
        for index in range(20):
            kube.delete(routes_collection("team-a"), f"r{index}")
        await until(lambda: not proxy.routes)
        services = proxy.control.services.slices
        assert services is not None
        await until(lambda: not services.namespaces)


async def test_a_service_without_any_slice_is_known_to_have_no_endpoint(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """The namespace's list names no slice of the route's Service: its readiness is known (none ready: requests are
    held and wake the target), not left unknown for want of an event about that Service."""
    serve_pods(kube, "team-a", upstream)  # slices of Service web only
    lonely = route_object("team-a", "lonely", ["lonely.example"])
    lonely["spec"]["upstream"]["service"] = "nothing"
    kube.put(routes_collection("team-a"), lonely)
    kube.put(routes_collection("team-a"), route_object("team-a", "shop", ["shop.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/lonely" in proxy.routes and proxy.routes["team-a/lonely"].readiness_known)
        assert proxy.routes["team-a/lonely"].endpoints == []


async def test_a_route_deleted_twice_keeps_counting_what_its_newest_version_still_forwards(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """Deleted (v1 still forwarding), re-created (v2 forwards), deleted again: v1 finishing first must not drop the
    route's counts and series while v2 still forwards, or the HPA reads 0 for a busy route and the series leak."""
    serve_pods(kube, "team-a", upstream)
    collection = routes_collection("team-a")
    kube.put(collection, route_object("team-a", "again", ["again.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await routed(proxy.port, "again.example")
        first = asyncio.create_task(request(proxy.port, get("/slow?s=0.5", host="again.example")))
        await until(lambda: proxy.routes["team-a/again"].counts.inflight == 1)
        counts = proxy.routes["team-a/again"].counts
        kube.delete(collection, "again")
        await until(lambda: "team-a/again" not in proxy.routes)
        kube.put(collection, route_object("team-a", "again", ["again.example"]))
        await routed(proxy.port, "again.example")
        second = asyncio.create_task(request(proxy.port, get("/slow?s=2", host="again.example")))
        await until(lambda: counts.inflight == 2)
        kube.delete(collection, "again")
        await until(lambda: "team-a/again" not in proxy.routes)
        assert (await asyncio.wait_for(first, 10)).status == 200
        await asyncio.sleep(0.05)
        # v2 still forwards one: its route is still counted, and its series are still there.
        heard: dict[str, tuple[int, int]] = {}
        unsubscribe = proxy.control.subscribe(lambda route, held, inflight: heard.__setitem__(route, (held, inflight)))
        unsubscribe()
        assert heard.get("team-a/again") == (0, 1)
        assert REGISTRY.get_sample_value("zeroscale_proxy_inflight_requests", {"route": "team-a/again"}) == 1
        assert (await asyncio.wait_for(second, 10)).status == 200
        await until(lambda: proxy.control.board.pending() == 0)
        await until(
            lambda: REGISTRY.get_sample_value("zeroscale_proxy_inflight_requests", {"route": "team-a/again"}) is None
        )


async def test_a_route_object_named_as_a_file_route_cannot_replace_it(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """A tenant's object with the key of a platform route (`team-a/own`) is refused: before, both were placed and
    the object's version took the key's place in the table, so the file route and its host stopped being served."""
    file_route = {"name": "own", "hosts": ["own.example"], "upstream": {"address": upstream.address}}
    file_route |= {"wake": "none", "readiness": "probe", "namespace": "team-a"}
    serve_pods(kube, "team-a", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "own", ["other.example"]))
    async with route_proxy(kube, kube_client, [file_route]) as proxy:
        await until(lambda: "team-a/own" in proxy.control.refusals)
        assert proxy.control.refusals["team-a/own"].reason == "NameClaimed"
        assert proxy.routes["team-a/own"].config.hosts == ["own.example"]
        assert await status_of(proxy.port, "own.example") == 200
        assert await status_of(proxy.port, "other.example") == 404


async def test_a_team_cannot_make_the_shared_proxy_sweep_every_connection_a_hundred_times_a_second(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """The data plane checks every connection's deadlines at a quarter of the shortest timeout of any route: a route
    object's tiny timeout would make the sweep walk every connection of every team each 10ms instead of each second."""
    serve_pods(kube, "team-a", upstream)
    for name, limits in (
        ("fast-response", {"response_timeout": "10ms"}),
        ("fast-body", {"body_timeout": "10ms"}),
        ("fast-tunnel", {"tunnel_idle_timeout": "10ms"}),
    ):
        kube.put(routes_collection("team-a"), route_object("team-a", name, [f"{name}.example"], limits=limits))
    kube.put(routes_collection("team-a"), route_object("team-a", "modest", ["modest.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/modest" in proxy.routes and len(proxy.control.refusals) == 3)
        for name in ("fast-response", "fast-body", "fast-tunnel"):
            refusal = proxy.control.refusals[f"team-a/{name}"]
            assert refusal.reason == "InvalidSpec"
            assert "spec.limits." in refusal.message
        assert proxy.control.table.sweep_tick(10.0) >= 0.25


async def test_one_namespace_cannot_take_every_route_the_proxy_serves(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    """max_routes is the proxy's whole budget, oldest first: without a share per namespace, one team's early burst of
    objects refused every route any other team made after it."""
    serve_pods(kube, "team-a", upstream)
    serve_pods(kube, "team-b", upstream)
    for at, name in enumerate(("one", "two", "three")):
        body = route_object("team-a", name, [f"{name}.example"])
        body["metadata"]["creationTimestamp"] = f"2026-01-0{at + 1}T00:00:00Z"
        kube.put(routes_collection("team-a"), body)
    late = route_object("team-b", "late", ["late.example"])
    late["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    kube.put(routes_collection("team-b"), late)
    async with route_proxy(kube, kube_client, max_routes=3, max_routes_per_namespace=2) as proxy:
        await until(lambda: "team-b/late" in proxy.routes)
        assert set(proxy.routes) == {"team-a/one", "team-a/two", "team-b/late"}
        refusal = proxy.control.refusals["team-a/three"]
        assert refusal.reason == "TooManyRoutes"
        assert "proxy.route_objects.max_routes_per_namespace" in refusal.message


async def test_the_proxy_keeps_only_what_it_reads_of_a_route_object(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept: list[dict[str, dict[str, Any]]] = []
    changed = RouteObjects._changed

    def spy(self: RouteObjects, path: str, objects: dict[str, dict[str, Any]]) -> None:
        kept.append(objects)
        changed(self, path, objects)

    monkeypatch.setattr(RouteObjects, "_changed", spy)
    serve_pods(kube, "team-a", upstream)
    bulky = route_object("team-a", "bulky", ["bulky.example"])
    bulky["metadata"]["annotations"] = {"padding": "x" * 200_000}
    kube.put(routes_collection("team-a"), bulky)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-a/bulky" in proxy.routes)
        later = route_object("team-a", "later", ["later.example"])  # from the watch, not the list
        later["metadata"]["annotations"] = {"padding": "x" * 200_000}
        kube.put(routes_collection("team-a"), later)
        await until(lambda: "team-a/later" in proxy.routes)
        assert kept
        assert all("annotations" not in obj.get("metadata", {}) for objects in kept for obj in objects.values())
        assert {"team-a/bulky", "team-a/later"} <= {key for objects in kept for key in objects}


@pytest.mark.xfail(
    strict=True,
    reason="a deleted activator route's port is free at once while the slices it wrote (kept, by design) still send "
    "its Service's clients to the proxy's pods on that port: another namespace's route taking the port receives "
    "them, whatever their Host; needs the port held while slices labelled with the old route list it, or the "
    "proxy-pointing slices removed with the route",
)
async def test_a_port_freed_by_a_deleted_route_is_not_given_to_another_namespace_while_its_slices_point_at_it(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    port = port_outside_ephemeral()
    seed_activator(kube, "team-a")
    seed_activator(kube, "team-b")
    kube.put(routes_collection("team-a"), activator_object("team-a", "web", port))
    async with route_proxy(kube, kube_client, activator_ports={"first": port, "last": port}) as proxy:
        await until(lambda: bool(written_slices(kube, "team-a")))  # cold: team-a's Service -> the proxy's pod:port
        kube.delete(routes_collection("team-a"), "web")
        await until(lambda: "team-a/web" not in proxy.activators)
        assert [slice_["ports"][0]["port"] for slice_ in written_slices(kube, "team-a")] == [port]
        taker = activator_object("team-b", "web", port)
        taker["spec"]["hosts"] = ["other.example"]
        kube.put(routes_collection("team-b"), taker)
        await until(lambda: "team-b/web" in proxy.activators or "team-b/web" in proxy.control.refusals)
        assert "team-b/web" in proxy.control.refusals


async def test_one_route_edited_in_a_loop_holds_at_most_a_third_of_the_event_loop(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every spec change places every route again (~70 ms at 10,000 routes): a team editing its route in a loop must
    not take the shared proxy's loop from every team. A placement made slow on purpose (blocking 50 ms) is followed
    by at least twice its length of loop for everything else, and the last edit is still applied."""
    spans: list[tuple[float, float]] = []
    real_place = claims.place

    def slow(*args: Any) -> Any:
        began = time.monotonic()
        time.sleep(0.05)  # blocks the loop, as placing 10,000 routes does
        placed = real_place(*args)
        spans.append((began, time.monotonic()))
        return placed

    serve_pods(kube, "team-a", upstream)
    kube.put(routes_collection("team-a"), route_object("team-a", "flap", ["flap.example"]))
    async with route_proxy(kube, kube_client) as proxy:
        await routed(proxy.port, "flap.example")
        monkeypatch.setattr(control, "place", slow)
        for generation in range(2, 22):  # 20 edits in about a second
            limits = {"max_held_requests": 100 + generation}
            kube.put(
                routes_collection("team-a"), route_object("team-a", "flap", ["flap.example"], generation, limits=limits)
            )
            await asyncio.sleep(0.05)
        await until(lambda: proxy.routes["team-a/flap"].limits.max_held_requests == 121)
    assert len(spans) >= 2
    for (began, ended), (next_began, _) in itertools.pairwise(spans):
        assert next_began - ended >= 2 * (ended - began) * 0.95  # the loop's clock and this one's may differ a little


@pytest.mark.xfail(
    strict=True,
    reason="claims compare hosts as written: an older `*.shop.example` of team-b does not stop team-a's younger "
    "`api.shop.example`, which the router prefers, so team-a takes that part of team-b's traffic; needs a younger "
    "claim covered by another namespace's older wildcard refused (HostClaimed), or grants that partition the names",
)
async def test_a_younger_exact_host_of_another_namespace_does_not_take_traffic_from_an_older_wildcard(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    serve_pods(kube, "team-a", upstream)
    serve_pods(kube, "team-b", upstream)
    owner = route_object("team-b", "shop", ["*.shop.example"])
    owner["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    taker = route_object("team-a", "api", ["api.shop.example"])
    taker["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    kube.put(routes_collection("team-b"), owner)
    kube.put(routes_collection("team-a"), taker)
    async with route_proxy(kube, kube_client) as proxy:
        await until(lambda: "team-b/shop" in proxy.routes)
        await until(lambda: "team-a/api" in proxy.routes or "team-a/api" in proxy.control.refusals)
        assert proxy.control.refusals["team-a/api"].reason == "HostClaimed"


async def test_two_routes_of_a_namespace_that_differ_only_in_match_headers_share_a_host_and_prefix(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream
) -> None:
    canary = await Upstream().start()
    try:
        serve_pods(kube, "team-a", upstream)
        kube.put(slices_collection("team-a"), endpoint_slice("canary-1", "canary", [("127.0.0.1", {})], canary.port))
        spec: dict[str, Any] = {"upstream": {"service": "canary", "port": "http"}, "match_headers": {"X-Canary": "1"}}
        # The third has the same host, prefix and match_headers as the second (names compared without case).
        objects = [
            route_object("team-a", "stable", ["shop.example"]),
            route_object("team-a", "canary", ["shop.example"], **spec),
            route_object("team-a", "again", ["shop.example"], match_headers={"x-canary": "1"}),
        ]
        for month, obj in enumerate(objects, 1):
            obj["metadata"]["creationTimestamp"] = f"2026-0{month}-01T00:00:00Z"
            kube.put(routes_collection("team-a"), obj)
        async with route_proxy(kube, kube_client) as proxy:
            await until(lambda: {"team-a/stable", "team-a/canary"} <= set(proxy.routes))
            await until(lambda: "team-a/again" in proxy.control.refusals)
            refusal = proxy.control.refusals["team-a/again"]
            assert (refusal.reason, "team-a/canary" in refusal.message) == ("PathClaimed", True)
            assert "match_headers" in refusal.message
            assert (await request(proxy.port, get("/echo", "shop.example", "x-canary: 1\r\n"))).status == 200
            assert (await request(proxy.port, get("/echo", "shop.example"))).status == 200
        assert (len(canary.requests), len(upstream.requests)) == (1, 1)
    finally:
        await canary.stop()
