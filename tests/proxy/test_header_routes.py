"""Routes that match request headers (`match_headers`), through the proxy's real sockets, from an HTTP/1.1 client and
an HTTP/2 one: a request goes to the route the one precedence rule picks (docs/architecture.md#route-precedence)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from adapter.config.route import RouteConfig
from adapter.proxy.app import Proxy
from tests.fixtures.h2_peers import h2_request
from tests.fixtures.proxy import get, request, route, running_proxy
from tests.fixtures.upstream_app import Upstream

CANARY = {"x-canary": "1"}


@pytest.fixture
async def canary() -> AsyncIterator[Upstream]:
    app = await Upstream().start()
    yield app
    await app.stop()


@pytest.fixture
async def proxy(upstream: Upstream, canary: Upstream) -> AsyncIterator[Proxy]:
    """Two routes of one host and prefix: the stable one, then the canary taking requests with `x-canary: 1`."""
    routes = [
        route("stable", upstream.address, hosts=["shop.example"]),
        route("canary", canary.address, hosts=["shop.example"], match_headers={"X-Canary": "1"}),
    ]
    async with running_proxy(routes) as server:
        yield server


async def served_by(port: int, host: str, extra: str = "", path: str = "/echo") -> int:
    """The status of a GET (whichever upstream answered it is read from their records)."""
    return (await request(port, get(path, host=host, extra=extra))).status


@pytest.mark.parametrize("spelled", ["x-canary: 1", "X-Canary: 1", "X-CANARY:1  "])
async def test_requests_with_the_header_go_to_its_route_and_the_others_to_the_plain_one(
    proxy: Proxy, upstream: Upstream, canary: Upstream, spelled: str
) -> None:
    assert await served_by(proxy.port, "shop.example", f"{spelled}\r\n") == 200
    assert (len(canary.requests), len(upstream.requests)) == (1, 0)
    # The condition is the route's: the header itself is forwarded as any other.
    assert canary.requests[0].headers["x-canary"].strip() == "1"
    assert await served_by(proxy.port, "shop.example") == 200
    assert await served_by(proxy.port, "shop.example", "x-canary: 2\r\n") == 200
    assert (len(canary.requests), len(upstream.requests)) == (1, 2)


async def test_a_header_sent_twice_does_not_meet_a_condition(
    proxy: Proxy, upstream: Upstream, canary: Upstream
) -> None:
    assert await served_by(proxy.port, "shop.example", "x-canary: 1\r\nX-Canary: 1\r\n") == 200
    assert (len(canary.requests), len(upstream.requests)) == (0, 1)


@pytest.mark.parametrize("name", ["Host", "cookie"])
def test_a_header_http2_carries_otherwise_cannot_be_a_condition(name: str) -> None:
    """HTTP/1.1 sends `Host: shop.example`, HTTP/2 `:authority` and no host field; `cookie: a=1; b=2` may come over
    HTTP/2 as two fields: a condition on either would route one request two ways, by the client's protocol."""
    with pytest.raises(ValidationError, match=f"a header condition cannot name {name.lower()}"):
        RouteConfig.model_validate(route("canary", "127.0.0.1:9", match_headers={name: "shop.example"}))


async def test_an_http2_stream_is_routed_by_its_headers(proxy: Proxy, upstream: Upstream, canary: Upstream) -> None:
    head = [(":method", "GET"), (":scheme", "http"), (":path", "/echo"), (":authority", "shop.example")]
    assert (await h2_request(proxy.port, [*head, ("x-canary", "1")])).header(":status") == "200"
    assert (await h2_request(proxy.port, head)).header(":status") == "200"
    assert (len(canary.requests), len(upstream.requests)) == (1, 1)


# (routes as (hosts, path_prefix, match_headers) in claim order, the request's host, path and extra headers,
# the index of the route that takes it)
PRECEDENCE: list[tuple[list[tuple[list[str], str, dict[str, str]]], str, str, str, int]] = [
    # A longer prefix without headers beats a shorter one with them.
    ([(["*"], "/api", CANARY), (["*"], "/api/v2", {})], "a.example", "/api/v2/echo", "x-canary: 1\r\n", 1),
    # The same prefix: the route with the headers, though claimed later.
    ([(["*"], "/api", {}), (["*"], "/api", CANARY)], "a.example", "/api/echo", "x-canary: 1\r\n", 1),
    # An exact host beats a wildcard with headers.
    ([(["*.example"], "/", CANARY), (["shop.example"], "/", {})], "shop.example", "/echo", "x-canary: 1\r\n", 1),
    # A header that does not match falls through to the shorter prefix of the same host.
    ([(["shop.example"], "/api", CANARY), (["shop.example"], "/", {})], "shop.example", "/api/echo", "", 1),
]


@pytest.mark.parametrize(("claims", "host", "path", "extra", "taker"), PRECEDENCE)
async def test_one_precedence_rule_picks_the_route(
    claims: list[tuple[list[str], str, dict[str, str]]], host: str, path: str, extra: str, taker: int
) -> None:
    apps = [await Upstream().start() for _ in claims]
    try:
        routes: list[dict[str, Any]] = [
            route(f"r{index}", app.address, hosts=hosts, path_prefix=prefix, match_headers=wanted)
            for index, (app, (hosts, prefix, wanted)) in enumerate(zip(apps, claims, strict=True))
        ]
        async with running_proxy(routes) as proxy:
            assert await served_by(proxy.port, host, extra, path) == 200
        assert [len(app.requests) for app in apps] == [int(index == taker) for index in range(len(apps))]
    finally:
        for app in apps:
            await app.stop()


async def test_a_host_whose_only_route_asks_for_headers_is_404_without_them(upstream: Upstream) -> None:
    routes = [
        route("canary", upstream.address, hosts=["shop.example"], match_headers=CANARY),
        route("any", upstream.address),
    ]
    async with running_proxy(routes) as proxy:
        assert await served_by(proxy.port, "shop.example") == 404
        assert await served_by(proxy.port, "shop.example", "x-canary: 1\r\n") == 200
        assert await served_by(proxy.port, "other.example") == 200
