"""Waking through the scale subresource and readiness from EndpointSlices, against the Kubernetes API stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from adapter.config.route import ScaleTarget
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import ready_addresses
from adapter.kube.hpas import HPA
from adapter.proxy.intent import decide
from tests.fixtures.grpc_echo import EchoServer, echo_client
from tests.fixtures.kube_routes import (
    HPAS,
    SLICES_V1,
    SLICES_V1BETA1,
    ColdWeb,
    ScaleStandIn,
    endpoint_slice,
    hpas_collection,
    slices_collection,
    wake_route,
    wake_standin,
)
from tests.fixtures.kube_routes import hpa as hpa_object
from tests.fixtures.kube_standin import KubeStandIn, Reply, status_body
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


def hpa(scaled_to_zero: str | None, target: str = "web") -> dict[str, Any]:
    """An HPA scaling Deployment `target`, with its ScaledToZero condition at `scaled_to_zero` (None: absent)."""
    return hpa_object(f"{target}-hpa", target, scaled_to_zero)


HPA_COLLECTION = hpas_collection("default")


def wakes(route: str, result: str) -> float:
    return (
        REGISTRY.get_sample_value("zeroscale_proxy_wakes_total", {"route": f"default/{route}", "result": result}) or 0.0
    )


async def test_cold_start_wakes_the_target_and_forwards_when_a_slice_is_ready(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    scale, port = web.scale, web.port
    async with running_proxy([wake_route("woken")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get("/echo?cold")))
        await until(lambda: scale.replicas == 1)
        assert scale.patches == [{"metadata": {"resourceVersion": "100"}, "spec": {"replicas": 1}}]
        assert server.routes["default/woken"].counts.held == 1
        upstream = await Upstream(port).start()
        try:
            # Not ready yet, then ready: only the ready endpoint is used.
            web.ready(False)
            await asyncio.sleep(0.1)
            assert not pending.done()
            web.ready()
            response = await pending
        finally:
            await upstream.stop()
        assert response.status == 200
        assert response.headers["x-zeroscale-cold-start"] == "true"
        assert wakes("woken", "patched") == 1
        cold_starts = REGISTRY.get_sample_value("zeroscale_proxy_cold_starts_total", {"route": "default/woken"})
        assert cold_starts == 1


async def test_a_target_above_zero_is_not_patched(kube: KubeStandIn, kube_client: KubeClient) -> None:
    scale = ScaleStandIn(kube, "default", "web", replicas=2)
    read = wakes("awake", "already_awake")
    # Held 3 s, longer than a loaded machine stalls the loop: the wake's read is counted while it is held (with
    # 0.5 s, a stall let the proxy stop before its read was answered).
    async with running_proxy([wake_route("awake", limits={"hold_timeout": 3})], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: wakes("awake", "already_awake") > read)
        assert (await pending).status == 504
    assert scale.patches == []
    assert scale.replicas == 2


async def test_a_conflicting_change_is_read_again_and_respected(kube: KubeStandIn, kube_client: KubeClient) -> None:
    scale = ScaleStandIn(kube, "default", "web", replicas=0)

    def hpa_scales_up_first(current: ScaleStandIn) -> None:
        current.before_patch = lambda _scale: None
        current.set(3)  # the HPA acted between our read and our patch

    scale.before_patch = hpa_scales_up_first
    read = wakes("racy", "already_awake")
    async with running_proxy([wake_route("racy", limits={"hold_timeout": 3})], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: wakes("racy", "already_awake") > read)  # read again after the conflict, while held
        await pending
    assert scale.conflicts == 1
    assert scale.replicas == 3  # re-read: no longer 0, so left alone
    assert len(scale.patches) == 1
    assert wakes("racy", "conflict") >= 1


async def test_a_target_its_hpa_did_not_scale_to_zero_is_not_woken_and_the_requests_say_why(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """A person's `kubectl scale --replicas=0`: the HPA has not ScaledToZero=True, so v1.37's HPA leaves it at
    zero, and so does the proxy: the held request is answered at once (not after hold_timeout) with 503 and
    how to start it. Once the HPA's condition turns True (it scaled it to zero itself), requests wake it."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_COLLECTION, hpa("False"))
    route = wake_route("stopped", limits={"hold_timeout": 30})
    async with running_proxy([route], kube=kube_client) as server:
        response = await asyncio.wait_for(request(server.port, get()), 5)
        assert response.status == 503
        body = response.body.decode()
        assert "Deployment default/web was stopped by hand" in body
        assert "its HorizontalPodAutoscaler web-hpa did not scale it there" in body
        assert "kubectl scale -n default deployment/web --replicas=1" in body
        assert scale.patches == []
        assert wakes("stopped", "refused") >= 1

        kube.put(HPA_COLLECTION, hpa("True"))  # the HPA scaled it to zero itself
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: scale.replicas == 1)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


async def test_wake_always_wakes_what_a_person_stopped(kube: KubeStandIn, kube_client: KubeClient) -> None:
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_COLLECTION, hpa(None))
    async with running_proxy([wake_route("always", wake="always")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: scale.replicas == 1)
        hpa_reads = [path for _, path, _ in kube.requests if "horizontalpodautoscalers" in path]
        assert hpa_reads == [], "wake: always reads no HPAs"
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


async def test_a_target_without_hpa_wakes_unless_the_route_says_otherwise(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_COLLECTION, hpa("True", target="other"))
    strict = wake_route("strict", wake_without_hpa=False)
    async with running_proxy([strict], kube=kube_client) as server:
        response = await asyncio.wait_for(request(server.port, get()), 5)
        assert response.status == 503
        assert "no HorizontalPodAutoscaler scales it" in response.body.decode()
        assert scale.patches == []
    async with running_proxy([wake_route("lenient")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: scale.replicas == 1)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


async def test_hpas_it_cannot_read_wake_nothing(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """No RBAC on HPAs (or the API refusing): whether a person stopped the target is unknown, so a client's
    request must not start it (it did: a refused list left the proxy waking as if no HPA watched it)."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.add_route("GET", HPAS, lambda _req, _m: Reply(403, status_body(403, "Forbidden", "no list")))
    async with running_proxy([wake_route("blind", limits={"hold_timeout": 30})], kube=kube_client) as server:
        response = await asyncio.wait_for(request(server.port, get()), 5)
        assert response.status == 503
        body = response.body.decode()
        assert "cannot be read" in body
        assert "wake: always" in body
        assert scale.patches == []


def route_target() -> ScaleTarget:
    return ScaleTarget(namespace="default", kind="Deployment", name="web")


async def test_hpa_mode_only_reports_counts(kube: KubeStandIn, kube_client: KubeClient) -> None:
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    async with running_proxy(
        [wake_route("counts-only", wake="hpa", limits={"hold_timeout": 0.3})], kube=kube_client
    ) as server:
        seen: list[int] = []
        server.routes["default/counts-only"].counts.subscribe(lambda _r, held, inflight: seen.append(held + inflight))
        assert (await request(server.port, get())).status == 504
    assert scale.patches == []
    assert 1 in seen


async def test_endpointslice_v1beta1_fallback(kube: KubeStandIn, kube_client: KubeClient) -> None:
    kube.add_route("GET", SLICES_V1, lambda _req, _m: Reply(404, status_body(404, "NotFound", "no v1")))
    kube.serve_collection(SLICES_V1BETA1, "EndpointSliceList")
    upstream = await Upstream().start()
    try:
        kube.put(
            slices_collection("default", "v1beta1"),
            endpoint_slice("web-old", "web", [("127.0.0.1", {})], upstream.port, version="v1beta1"),
        )
        async with running_proxy([wake_route("old", wake="none")], kube=kube_client) as server:
            await until(lambda: server.routes["default/old"].has_usable())
            assert (await request(server.port, get())).status == 200
    finally:
        await upstream.stop()


async def test_no_api_access_falls_back_to_connect_probes(kube: KubeStandIn, kube_client: KubeClient) -> None:
    kube.add_route("GET", SLICES_V1, lambda _req, _m: Reply(403, status_body(403, "Forbidden", "no list")))
    upstream = await Upstream().start()
    try:
        route = wake_route(
            "probing",
            wake="none",
            readiness="auto",
            upstream={"service": "web", "namespace": "default", "port": "http", "address": upstream.address},
        )
        async with running_proxy([route], kube=kube_client) as server:
            await until(lambda: server.routes["default/probing"].has_usable())
            assert (await request(server.port, get())).status == 200
    finally:
        await upstream.stop()


async def test_endpoints_follow_the_watch(kube: KubeStandIn, kube_client: KubeClient) -> None:
    collection = slices_collection("default")
    async with running_proxy([wake_route("watched", wake="none")], kube=kube_client) as server:
        route = server.routes["default/watched"]
        kube.put(collection, endpoint_slice("web-1", "web", [("10.0.0.1", {}), ("10.0.0.2", {})], 8080))
        await until(lambda: len(route.endpoints) == 2)
        kube.put(collection, endpoint_slice("web-2", "web", [("10.0.0.3", {"ready": True})], 8080))
        await until(lambda: len(route.endpoints) == 3)
        kube.end_watches()  # the watch ends: the proxy lists and watches again
        kube.delete(collection, "web-1")
        await until(lambda: [(e.host, e.port) for e in route.endpoints] == [("10.0.0.3", 8080)])


@pytest.mark.parametrize(("protocol", "h2c"), [("auto", True), ("http1", False)])
async def test_the_service_ports_app_protocol_says_h2c_unless_the_route_says_otherwise(
    kube: KubeStandIn, kube_client: KubeClient, protocol: str, h2c: bool
) -> None:
    """`upstream.protocol: auto` reads the slice port's appProtocol (kubernetes.io/h2c): a gRPC call held while the
    Service has no endpoint is forwarded over h2c once one is ready; `http1` overrides it."""
    collection = slices_collection("default")
    port = refused_port()
    kube.put(collection, endpoint_slice("web-abc", "web", [], port))  # at zero: no ports listed, no appProtocol
    upstream = {"service": "web", "namespace": "default", "port": "http", "protocol": protocol}
    async with running_proxy([wake_route("grpc", wake="none", upstream=upstream)], kube=kube_client) as server:
        route = server.routes["default/grpc"]
        await until(lambda: route.readiness_known)
        server_at_port = await EchoServer(port).start()
        try:
            async with echo_client(server.port, **{"grpc.enable_retries": 0}) as client:
                call = client.unary(b"held", timeout=10)
                await until(lambda: route.counts.held == 1)
                ready = endpoint_slice("web-abc", "web", [("127.0.0.1", {})], port, app_protocol="kubernetes.io/h2c")
                kube.put(collection, ready)
                await until(lambda: len(route.endpoints) == 1)
                assert route.endpoints[0].h2c is h2c
                if h2c:
                    assert await call == b"held"
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as lost:
                        await call  # HTTP/1.1 to a gRPC server: no answer it can relay
                    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server_at_port.stop()
        assert server_at_port.calls == ({"Unary": 1} if h2c else {})


def test_ready_addresses_follow_spec_8_1() -> None:
    slices = [
        endpoint_slice(
            "a",
            "web",
            [
                ("10.0.0.1", {}),  # nil ready: usable
                ("10.0.0.2", {"ready": True}),
                ("10.0.0.3", {"ready": False}),
                ("10.0.0.4", {"ready": False, "serving": True, "terminating": True}),
            ],
            8080,
        ),
        endpoint_slice("b", "web", [("10.0.0.5", {})], 9090, port_name="metrics"),
    ]
    assert ready_addresses(slices, "http") == [("10.0.0.1", 8080), ("10.0.0.2", 8080)]
    assert ready_addresses(slices, "metrics") == [("10.0.0.5", 9090)]
    assert ready_addresses(slices, 8080) == [("10.0.0.1", 8080), ("10.0.0.2", 8080)]
    # Nothing ready: drain into terminating endpoints that still serve.
    draining = [endpoint_slice("c", "web", [("10.0.0.6", {"ready": False, "serving": True, "terminating": True})], 80)]
    assert ready_addresses(draining, "http") == [("10.0.0.6", 80)]
    gone = [endpoint_slice("d", "web", [("10.0.0.7", {"ready": False, "serving": False, "terminating": True})], 80)]
    assert ready_addresses(gone, "http") == []


async def test_malformed_slices_and_hpas_neither_stop_the_watch_nor_the_wake(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Objects no real API server would send (wrong JSON types where a list or object belongs) are read as
    objects without those fields: the route keeps following the watch and an HPA that says nothing readable
    does not count as scaling the target."""
    collection = slices_collection("default")
    broken = endpoint_slice("web-0", "web", [], 8080)
    broken["ports"] = "junk"
    broken["endpoints"] = ["junk", {"conditions": "junk", "addresses": [5, None]}]
    kube.put(collection, broken)
    odd = {"kind": "Port", "ports": [{"name": "http", "port": "8080"}, {"name": "http", "port": True}]}
    kube.put(collection, {**endpoint_slice("web-1", "web", [("10.0.0.9", {})], 8080), **odd})
    kube.put(HPA_COLLECTION, {"metadata": {"name": "odd", "namespace": "default"}, "spec": "junk", "status": []})
    async with running_proxy([wake_route("watched")], kube=kube_client) as server:
        route = server.routes["default/watched"]
        kube.put(collection, endpoint_slice("web-2", "web", [("10.0.0.3", {"ready": True})], 8080))
        await until(lambda: [(e.host, e.port) for e in route.endpoints] == [("10.0.0.3", 8080)])
    # "odd" scales nothing readable: the target counts as one without an HPA.
    hpas = [HPA.read(obj) for obj in kube.objects(HPA_COLLECTION)]
    assert decide(hpas, route_target(), wake_without_hpa=True) is None
    assert decide(hpas, route_target(), wake_without_hpa=False) is not None
