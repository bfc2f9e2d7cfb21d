"""The fallback Service (docs/architecture.md#fallback): held requests the workload was not ready for within
`fallback.after` go to it; a full queue sends requests to it at once with `overflow: fallback`. The workload and the
fallback are real HTTP servers; their readiness comes from EndpointSlices on the Kubernetes API stand-in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from adapter.config.route import RouteConfig
from adapter.kube.client import KubeClient
from adapter.proxy.app import Proxy
from tests.fixtures.h2_peers import H2Upstream, h2_request
from tests.fixtures.kube_routes import endpoint_slice, slices_collection, wake_standin
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, post, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream

SLICES = slices_collection("default")


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


@pytest.fixture
async def workload() -> AsyncIterator[Upstream]:
    app = await Upstream().start()
    yield app
    await app.stop()


@pytest.fixture
async def fallback() -> AsyncIterator[Upstream]:
    app = await Upstream().start()
    yield app
    await app.stop()


def ready(
    kube: KubeStandIn, service: str, port: int, *, is_ready: bool = True, app_protocol: str | None = None
) -> None:
    """Service `service` has one endpoint, 127.0.0.1:`port`, ready or not (its slice replaced)."""
    endpoints = [("127.0.0.1", {"ready": is_ready})]
    kube.put(SLICES, endpoint_slice(f"{service}-abc", service, endpoints, port, app_protocol=app_protocol))


def none_ready(kube: KubeStandIn, service: str) -> None:
    kube.put(SLICES, endpoint_slice(f"{service}-abc", service, [], 9))


def fallback_route(name: str, after: float = 0.2, hold_timeout: float = 5, **overrides: Any) -> dict[str, Any]:
    """A route to Service default/web with Service default/static as its fallback after `after` seconds."""
    limits = overrides.pop("limits", {})
    fallback = {"service": "static", "port": "http", "after": after, **overrides.pop("fallback", {})}
    return {
        "name": name,
        "upstream": {"service": "web", "namespace": "default", "port": "http"},
        "wake": "none",
        "readiness": "endpointslice",
        "fallback": fallback,
        "limits": {"hold_timeout": hold_timeout, **limits},
        **overrides,
    }


def choices(route: str, choice: str) -> float:
    labels = {"route": f"default/{route}", "choice": choice}
    return REGISTRY.get_sample_value("zeroscale_proxy_cold_choices_total", labels) or 0.0


@asynccontextmanager
async def proxy_with(route: dict[str, Any], kube: KubeStandIn, client: KubeClient) -> AsyncIterator[Proxy]:
    """The proxy serving `route`, once both Services' readiness is known."""
    async with running_proxy([route], kube=client) as server:
        served = server.routes[f"default/{route['name']}"]
        assert served.fallback is not None
        await until(lambda: served.readiness_known and served.fallback is not None and served.fallback.readiness_known)
        yield server


async def test_held_requests_go_to_the_fallback_after_its_bound_each_once_with_its_body(
    kube: KubeStandIn, kube_client: KubeClient, workload: Upstream, fallback: Upstream
) -> None:
    ready(kube, "web", workload.port, is_ready=False)
    ready(kube, "static", fallback.port)
    async with proxy_with(fallback_route("late", after=0.3), kube, kube_client) as server:
        started = time.monotonic()
        bodies = [f"body-{n}".encode() for n in range(3)]
        responses = await asyncio.gather(*(request(server.port, post(body)) for body in bodies))
        waited = time.monotonic() - started
    assert [response.status for response in responses] == [200, 200, 200]
    assert [response.body for response in responses] == bodies
    assert waited >= 0.3
    assert sorted(seen.body for seen in fallback.requests) == bodies
    assert workload.requests == []
    assert choices("late", "fallback") == 3


async def test_requests_at_the_fallback_leave_the_workloads_held_count_and_bytes(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port)
    async with proxy_with(fallback_route("moved", after=0.2), kube, kube_client) as server:
        route = server.routes["default/moved"]
        assert route.fallback is not None
        pending = [asyncio.create_task(request(server.port, post(b"x" * 100, "/slow?s=1"))) for _ in range(2)]
        await until(lambda: route.counts.held == 2 and route.counts.held_bytes == 200)
        # At the fallback (its answer takes a second): no longer held for the workload, in flight at the fallback.
        await until(lambda: route.fallback is not None and route.fallback.counts.inflight == 2)
        assert (route.counts.held, route.counts.inflight, route.counts.held_bytes) == (0, 0, 0)
        held = REGISTRY.get_sample_value("zeroscale_proxy_held_requests", {"route": "default/moved"})
        assert held == 0
        assert [response.status for response in await asyncio.gather(*pending)] == [200, 200]
        assert (route.fallback.counts.inflight, route.fallback.counts.held_bytes) == (0, 0)


async def test_a_fallback_that_does_not_answer_in_time_is_answered_504_as_an_upstream_is(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port)
    route_config = fallback_route("slow-fallback", after=0.1, limits={"response_timeout": 0.4})
    async with proxy_with(route_config, kube, kube_client) as server:
        response = await request(server.port, get("/slow?s=3"))
    assert response.status == 504
    assert b"limits.response_timeout" in response.body
    assert [seen.path for seen in fallback.requests] == ["/slow?s=3"]


async def test_a_held_request_goes_to_the_workload_when_it_is_ready_within_the_bound(
    kube: KubeStandIn, kube_client: KubeClient, workload: Upstream, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port)
    async with proxy_with(fallback_route("in-time", after=3), kube, kube_client) as server:
        route = server.routes["default/in-time"]
        pending = asyncio.create_task(request(server.port, post(b"hello")))
        await until(lambda: route.counts.held == 1)
        ready(kube, "web", workload.port)
        response = await pending
    assert (response.status, response.body) == (200, b"hello")
    assert [seen.body for seen in workload.requests] == [b"hello"]
    assert fallback.requests == []


async def test_a_fallback_without_a_ready_endpoint_leaves_the_request_held_to_its_504(
    kube: KubeStandIn, kube_client: KubeClient, workload: Upstream, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port, is_ready=False)
    async with proxy_with(fallback_route("both-cold", after=0.1, hold_timeout=0.6), kube, kube_client) as server:
        started = time.monotonic()
        response = await request(server.port, get())
        waited = time.monotonic() - started
    assert response.status == 504
    assert response.body == (
        b"the workload did not become ready in 0.6 s (limits.hold_timeout); "
        b"the fallback Service static has no ready endpoint either\n"
    )
    assert waited >= 0.6
    assert fallback.requests == workload.requests == []
    assert choices("both-cold", "fallback") == 0


async def test_requests_held_past_the_bound_go_when_the_fallback_gets_ready(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    none_ready(kube, "static")
    async with proxy_with(fallback_route("fallback-late", after=0.5), kube, kube_client) as server:
        route = server.routes["default/fallback-late"]
        early = asyncio.create_task(request(server.port, post(b"early")))
        await asyncio.sleep(0.7)  # past its bound, held: the fallback has no endpoint
        late = asyncio.create_task(request(server.port, post(b"late")))
        await until(lambda: route.counts.held == 2)
        ready(kube, "static", fallback.port)
        assert (await early).body == b"early"
        assert route.counts.held == 1  # not yet at its own bound
        assert (await late).body == b"late"
    assert [seen.body for seen in fallback.requests] == [b"early", b"late"]


async def test_a_request_held_for_room_past_the_bound_goes_to_the_fallback_when_the_workload_turns_cold(
    kube: KubeStandIn, kube_client: KubeClient, workload: Upstream, fallback: Upstream
) -> None:
    """At its bound the workload was warm (its one endpoint full): the request stayed. Its pod then goes away: the
    workload has no usable endpoint, the request is past its bound, and the fallback has one: it goes there now,
    not 504 at the hold's end."""
    ready(kube, "web", workload.port)
    ready(kube, "static", fallback.port)
    config = fallback_route("pod-gone", after=0.2, hold_timeout=3, limits={"endpoint_concurrency": 1})
    async with proxy_with(config, kube, kube_client) as server:
        route = server.routes["default/pod-gone"]
        busy = asyncio.create_task(request(server.port, get("/slow?s=5")))
        await until(lambda: route.counts.inflight == 1)
        waiting = asyncio.create_task(request(server.port, post(b"second")))
        await until(lambda: route.counts.held == 1)
        await asyncio.sleep(0.3)  # past its bound, held for room: it stays
        assert route.counts.held == 1
        none_ready(kube, "web")
        response = await asyncio.wait_for(waiting, 1.5)
        busy.cancel()
    assert (response.status, response.body) == (200, b"second")
    assert [seen.body for seen in fallback.requests] == [b"second"]
    assert choices("pod-gone", "fallback") == 1


async def test_overflow_fallback_sends_a_request_over_max_held_requests_to_the_fallback_at_once(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port)
    route_config = fallback_route("full", after=3, overflow="fallback", limits={"max_held_requests": 1})
    async with proxy_with(route_config, kube, kube_client) as server:
        route = server.routes["default/full"]
        held = asyncio.create_task(request(server.port, get("/echo?first")))
        await until(lambda: route.counts.held == 1)
        response = await request(server.port, post(b"over", "/echo?second"))
        assert (response.status, response.body) == (200, b"over")
        assert not held.done()
        assert route.counts.held == 1
        held.cancel()
    assert [seen.path for seen in fallback.requests] == ["/echo?second"]
    assert choices("full", "overflow_fallback") == 1
    assert choices("full", "fallback") == 0


async def test_overflow_fallback_without_a_ready_fallback_is_503(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    none_ready(kube, "static")
    route_config = fallback_route("full-cold", after=3, overflow="fallback", limits={"max_held_requests": 1})
    async with proxy_with(route_config, kube, kube_client) as server:
        route = server.routes["default/full-cold"]
        held = asyncio.create_task(request(server.port, get()))
        await until(lambda: route.counts.held == 1)
        response = await request(server.port, get())
        held.cancel()
    assert response.status == 503
    assert b"max_held_requests" in response.body
    assert choices("full-cold", "overflow_fallback") == 0


async def test_an_http2_client_is_served_by_the_fallback(
    kube: KubeStandIn, kube_client: KubeClient, fallback: Upstream
) -> None:
    none_ready(kube, "web")
    ready(kube, "static", fallback.port)
    async with proxy_with(fallback_route("h2-client", after=0.1), kube, kube_client) as server:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", "/echo"), (":authority", "app.example")]
        response = await h2_request(server.port, headers, b"over h2")
    assert (response.header(":status"), response.body) == ("200", b"over h2")
    assert [seen.body for seen in fallback.requests] == [b"over h2"]


async def test_an_h2c_fallback_by_its_appprotocol_takes_an_http11_request(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    h2_fallback = await H2Upstream().start()
    try:
        none_ready(kube, "web")
        ready(kube, "static", h2_fallback.port, app_protocol="kubernetes.io/h2c")
        async with proxy_with(fallback_route("h2c-fallback", after=0.1), kube, kube_client) as server:
            response = await request(server.port, post(b"to h2c"))
    finally:
        await h2_fallback.stop()
    assert (response.status, response.body) == (200, b"to h2c")
    assert [seen.body for seen in h2_fallback.requests] == [b"to h2c"]


def file_route(readiness: str, port: str | int, upstream: str) -> dict[str, Any]:
    """A config-file route to a fixed address with a fallback Service in its namespace (`default`)."""
    fallback = {"service": "static", "port": port, "after": 0.1}
    return {"name": "addressed", "upstream": {"address": upstream}, "wake": "none", "readiness": readiness} | {
        "fallback": fallback,
        "limits": {"hold_timeout": 5},
    }


async def test_a_fallback_makes_a_file_route_read_slices_with_the_api_it_is_configured_with(
    kube: KubeStandIn, fallback: Upstream
) -> None:
    ready(kube, "static", fallback.port)
    routes = [file_route("auto", "http", f"127.0.0.1:{refused_port()}")]
    async with running_proxy(routes, kubernetes=kube.client_config()) as server:
        response = await request(server.port, post(b"via the API"))
    assert (response.status, response.body) == (200, b"via the API")
    assert [seen.body for seen in fallback.requests] == [b"via the API"]


async def test_without_slices_a_fallback_is_probed_at_its_service_address_which_needs_a_port_number() -> None:
    async with running_proxy([file_route("probe", 8080, "127.0.0.1:9")]) as server:
        fallback = server.routes["default/addressed"].fallback
        assert fallback is not None
        assert [(ep.host, ep.port) for ep in fallback.endpoints] == [("static.default.svc", 8080)]
    with pytest.raises(SystemExit, match=r"give fallback\.port as a number"):
        async with running_proxy([file_route("probe", "http", "127.0.0.1:9")]):
            pass


def test_an_activator_routes_fallback_cannot_be_the_service_it_writes() -> None:
    """Cold, activator.service's slices list the proxy's own pods: as the fallback, a request would come back to the
    route, be held, go to the fallback again, and so on."""
    route = fallback_route("loop", fallback={"service": "web-front"}, readiness="auto", mode="activator")
    route |= {
        "activator": {"service": "web-front", "port": 8081},
        "target": {"namespace": "default", "kind": "Deployment", "name": "web"},
    }
    with pytest.raises(ValidationError, match=r"fallback\.service is activator\.service"):
        RouteConfig.model_validate(route)
    route["fallback"]["service"] = "static"
    assert RouteConfig.model_validate(route).fallback is not None


async def test_a_navigation_the_fallback_refuses_is_held_for_it_not_lost(
    kube: KubeStandIn, kube_client: KubeClient, workload: Upstream
) -> None:
    """A request with a cold-start choice (here a navigation to a route with a waking page) that overflows to the
    fallback meets the fallback's refused connect there: the fallback has no choices of its own, so it holds it as
    any request (up to hold_timeout) instead of failing on the route's."""
    ready(kube, "web", workload.port)
    ready(kube, "static", refused_port())  # its slice says ready; its first connect is refused
    limits = {"max_held_requests": 1, "endpoint_concurrency": 1}
    options = {"waking_page": {}, "overflow": "fallback", "limits": limits}
    route_config = fallback_route("busy", after=0.4, hold_timeout=0.5, **options)
    async with proxy_with(route_config, kube, kube_client) as server:
        route = server.routes["default/busy"]
        busy = asyncio.create_task(request(server.port, get("/slow?s=2")))
        await until(lambda: route.counts.inflight == 1)
        held = asyncio.create_task(request(server.port, get("/echo?held")))
        await until(lambda: route.counts.held == 1)
        navigation = await request(server.port, get("/", extra="Accept: text/html\r\n"), within=3)
        await asyncio.gather(busy, held)
    assert navigation.status == 504
    assert b"did not become ready" in navigation.body
