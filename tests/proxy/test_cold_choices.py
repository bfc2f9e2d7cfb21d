"""A route's cold-start choices against real sockets (docs/architecture.md#cold-start-choices): a person opening a page
gets the waking page at once and the workload wakes, a program is held as before, a health check is answered without
waking anything, and a `when: always` rule never reaches the upstream; over HTTP/1.1 and HTTP/2."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.config.route import RouteConfig
from adapter.kube.client import KubeClient
from adapter.telemetry import proxy as telemetry
from tests.fixtures.h2_peers import Headers, h2_request
from tests.fixtures.kube_routes import (
    ColdWeb,
    ScaleStandIn,
    endpoint_slice,
    slices_collection,
    wake_route,
    wake_standin,
)
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import Response, Responses, get, known_cold, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream

CHROME_ACCEPT = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,"
    "application/signed-exchange;v=b3;q=0.7"
)
NAVIGATION = f"Accept: {CHROME_ACCEPT}\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n"
HEALTH = {"path": "/healthz", "when": "cold", "response": {"status": 200, "body": "ok"}}
ROBOTS = {
    "path": "/robots.txt",
    "when": "always",
    "response": {"body": "User-agent: *\nDisallow: /\n", "headers": {"X-Robots": "fixed"}},
}
CHOICES: dict[str, Any] = {"waking_page": {"refresh": 1}, "never_wake": [HEALTH, ROBOTS]}


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


def chosen(route_name: str, choice: str) -> float:
    labels = {"route": f"default/{route_name}", "choice": choice}
    return REGISTRY.get_sample_value("zeroscale_proxy_cold_choices_total", labels) or 0.0


def assert_waking_page(response: Response, route_key: str) -> None:
    assert response.status == 503
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["retry-after"] == "1"
    assert response.headers["cache-control"] == "no-store"
    assert '<meta http-equiv="refresh" content="1">' in response.body.decode()
    assert route_key in response.body.decode()


async def test_a_browser_navigation_to_a_cold_route_gets_the_page_at_once_and_wakes_the_workload(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    scale, port = web.scale, web.port
    pages = chosen("paged", "waking_page")
    async with running_proxy([wake_route("paged", wake="always", **CHOICES)], kube=kube_client) as server:
        page = await request(server.port, get("/", extra=NAVIGATION), within=2)
        assert_waking_page(page, "default/paged")
        assert chosen("paged", "waking_page") == pages + 1
        await until(lambda: scale.replicas == 1)  # woken, as a held request would have
        upstream = await Upstream(port).start()
        try:
            web.ready()
            await until(lambda: server.routes["default/paged"].has_usable())
            again = await request(server.port, get("/echo", extra=NAVIGATION))
        finally:
            await upstream.stop()
    assert again.status == 200  # warm: the same navigation goes to the workload
    assert [seen.path for seen in upstream.requests] == ["/echo"]
    assert chosen("paged", "waking_page") == pages + 1


@pytest.mark.parametrize(
    "extra",
    [
        "Accept: application/json\r\n",
        # A page's own fetch() asking for HTML: a program, held.
        "Accept: text/html\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\n",
    ],
)
async def test_a_program_is_held_and_answered_when_warm(extra: str) -> None:
    port = refused_port()
    async with running_proxy([route("held", f"127.0.0.1:{port}", **CHOICES)]) as server:
        counts = server.routes["default/held"].counts
        pending = asyncio.create_task(request(server.port, get("/echo", extra=extra)))
        await until(lambda: counts.held == 1)
        upstream = await Upstream(port).start()
        try:
            response = await pending
        finally:
            await upstream.stop()
    assert response.status == 200
    assert response.headers["x-zeroscale-cold-start"] == "true"


async def test_a_health_check_while_cold_is_answered_wakes_nothing_and_is_counted_on_its_own(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    scale, port = web.scale, web.port
    answered = chosen("checked", "never_wake")
    async with running_proxy([wake_route("checked", wake="always", **CHOICES)], kube=kube_client) as server:
        route_now = server.routes["default/checked"]
        seen: list[tuple[int, int]] = []
        unsubscribe = route_now.counts.subscribe(lambda _route, held, inflight: seen.append((held, inflight)))
        check = await request(server.port, get("/healthz?probe=1"), within=2)
        unsubscribe()
        assert (check.status, check.body) == (200, b"ok")
        assert seen == [(0, 0)]  # never held, never in flight: no change at all
        assert chosen("checked", "never_wake") == answered + 1
        await asyncio.sleep(0.2)
        assert scale.patches == []  # nothing woken
        assert not route_now.cold
        upstream = await Upstream(port).start()
        try:
            web.ready()
            await until(route_now.has_usable)
            warm = await request(server.port, get("/healthz"))
        finally:
            await upstream.stop()
    assert warm.status == 200
    assert [seen.path for seen in upstream.requests] == ["/healthz"]  # when: cold: forwarded once warm
    assert chosen("checked", "never_wake") == answered + 1


async def test_a_when_always_rule_is_answered_even_when_warm(upstream: Upstream) -> None:
    async with running_proxy([route("robots", f"127.0.0.1:{upstream.port}", **CHOICES)]) as server:
        await until(server.routes["default/robots"].has_usable)
        robots = await request(server.port, get("/robots.txt"))
        forwarded = await request(server.port, get("/echo", extra="Accept: application/json\r\n"))
    assert (robots.status, robots.body) == (200, b"User-agent: *\nDisallow: /\n")
    assert robots.headers["x-robots"] == "fixed"
    assert robots.headers["content-type"] == "text/plain; charset=utf-8"
    assert forwarded.status == 200
    assert [seen.path for seen in upstream.requests] == ["/echo"]


@pytest.mark.parametrize(("extra", "path"), [(NAVIGATION, "/"), ("", "/healthz")])
async def test_a_probe_route_s_first_refused_connect_leads_to_the_choice_not_the_hold(extra: str, path: str) -> None:
    """A probe-readiness route takes its endpoint as usable until a connect is refused: a navigation or a health check
    sent to it then meets its choice (the page, the rule's answer) instead of being held."""
    port = refused_port()
    async with running_proxy([route("probed", f"127.0.0.1:{port}", **CHOICES)]) as server:
        assert server.routes["default/probed"].has_usable()
        answer = await request(server.port, get(path, extra=extra), within=2)
        assert server.routes["default/probed"].counts.held == (1 if path == "/" else 0)  # the page's count only
    assert answer.status == (503 if path == "/" else 200)


async def test_a_head_gets_the_length_and_no_body_and_the_connection_goes_on() -> None:
    port = refused_port()
    async with running_proxy([route("headed", f"127.0.0.1:{port}", **CHOICES)]) as server:
        await known_cold(server, "headed")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: app.example\r\n\r\n")
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            # Keep-alive after a local answer: the next requests on the same connection are read and answered, and
            # the bytes after the HEAD's head are the next response's (a body there would not parse as one).
            writer.write(get("/", extra=NAVIGATION))
            responses = Responses(reader)
            page = await responses.next()
            writer.write(get("/robots.txt"))
            robots = await responses.next()
        finally:
            writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 2\r\n" in head
    assert b"connection:" not in head
    assert_waking_page(page, "default/headed")
    assert robots.body == b"User-agent: *\nDisallow: /\n"


async def test_a_body_left_unread_by_a_local_answer_is_never_read_as_a_request(upstream: Upstream) -> None:
    """A request the proxy answers itself before its body is read: answered, then the connection closes, so what
    the body carries (here a whole request) never reaches the upstream."""
    always = {"path_prefix": "/", "when": "always", "response": {"body": "no"}}
    async with running_proxy([route("smuggle", f"127.0.0.1:{upstream.port}", never_wake=[always])]) as server:
        inner = get("/echo?smuggled")
        raw = b"POST /form HTTP/1.1\r\nHost: app.example\r\nContent-Length: %d\r\n\r\n%b" % (len(inner), inner)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(raw + get("/echo?next"))
            responses = Responses(reader)
            first = await responses.next()
            async with asyncio.timeout(5):
                rest = await reader.read()
        finally:
            writer.close()
    assert (first.status, first.body) == (200, b"no")
    assert first.headers["connection"] == "close"
    assert rest == b""  # closed: nothing after it was answered
    assert upstream.requests == []


async def test_a_full_queue_gives_a_navigation_the_page_and_a_program_the_503(upstream: Upstream) -> None:
    settings = {
        **CHOICES,
        "overflow": "waking_page",
        "limits": {"endpoint_concurrency": 1, "max_held_requests": 1},
    }
    overflowed = chosen("full", "overflow_waking_page")
    async with running_proxy([route("full", f"127.0.0.1:{upstream.port}", **settings)]) as server:
        counts = server.routes["default/full"].counts
        await until(server.routes["default/full"].has_usable)
        busy = asyncio.create_task(request(server.port, get("/slow?s=1")))
        held = asyncio.create_task(request(server.port, get("/echo")))
        await until(lambda: counts.held == 1 and counts.inflight == 1)
        page = await request(server.port, get("/", extra=NAVIGATION), within=2)
        program = await request(server.port, get("/echo", extra="Accept: application/json\r\n"), within=2)
        assert counts.held == 1  # the page to a warm route adds no count (nothing to wake)
        await asyncio.gather(busy, held)
    assert_waking_page(page, "default/full")
    assert program.status == 503
    assert program.headers["content-type"] == "text/plain; charset=utf-8"
    assert chosen("full", "overflow_waking_page") == overflowed + 1


async def test_a_page_keeps_an_hpa_woken_route_pending_until_the_browser_asks_again() -> None:
    """wake: hpa: the HPA wakes the workload from the pending count; a page answered would count nothing, so the route
    counts one held request for the page's refresh (and a grace), as long as browsers keep asking."""
    port = refused_port()
    async with running_proxy([route("hpa", f"127.0.0.1:{port}", wake="hpa", **CHOICES)]) as server:
        routed = await known_cold(server, "hpa")
        assert (await request(server.port, get("/", extra=NAVIGATION), within=2)).status == 503
        assert routed.counts.held == 1
        assert routed.cold  # its waker (a wake: scale route's) keeps going while the page is out
        await asyncio.sleep(2)
        assert (await request(server.port, get("/", extra=NAVIGATION), within=2)).status == 503
        await asyncio.sleep(2)
        assert routed.counts.held == 1  # the second page extended the wait
        await until(lambda: routed.counts.held == 0, within=3)
        assert not routed.cold


async def test_a_page_counts_nothing_once_the_workload_is_ready() -> None:
    """The browser's reload will be forwarded (and counted as any request): a page's count kept on past the wake
    would be a held request that is not there, in the HPA's pending count for up to `refresh` seconds more."""
    port = refused_port()
    slow = {**CHOICES, "waking_page": {"refresh": 600}}
    async with running_proxy([route("ready", f"127.0.0.1:{port}", wake="hpa", **slow)]) as server:
        routed = await known_cold(server, "ready")
        assert (await request(server.port, get("/", extra=NAVIGATION), within=2)).status == 503
        assert routed.counts.held == 1
        upstream = await Upstream(port).start()
        try:
            await until(routed.has_usable)
            await until(lambda: routed.counts.held == 0, within=1)
            reload = await request(server.port, get("/echo", extra=NAVIGATION))
        finally:
            await upstream.stop()
    assert reload.status == 200
    assert routed.counts.pending == 0


async def test_a_navigation_after_a_refused_wake_is_told_why_not_shown_a_page_promising_one(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """A target the route may not wake (here: no HPA scales it, and the route says not to wake it then): the first
    page goes out before the refusal is known; after it, a navigation is held as any request and gets the refusal's
    503 with its words, and no page keeps the route counted (nor its waker reading the HPAs) meanwhile."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    collection = slices_collection("default")
    kube.put(collection, endpoint_slice("web-abc", "web", [], refused_port()))
    refused = {"route": "default/stopped", "reason": "no_hpa"}
    refusals = REGISTRY.get_sample_value("zeroscale_proxy_wake_refusals_total", refused) or 0
    stopped = wake_route("stopped", wake_without_hpa=False, wake_retry_interval=0.2, **CHOICES)
    async with running_proxy([stopped], kube=kube_client) as server:
        routed = server.routes["default/stopped"]
        await until(lambda: routed.readiness_known)
        assert_waking_page(await request(server.port, get("/", extra=NAVIGATION), within=2), "default/stopped")
        await until(lambda: REGISTRY.get_sample_value("zeroscale_proxy_wake_refusals_total", refused) == refusals + 1)
        assert routed.counts.held == 0
        told = await request(server.port, get("/", extra=NAVIGATION), within=5)
    assert told.status == 503
    assert told.headers["content-type"] == "text/plain; charset=utf-8"
    assert "no HorizontalPodAutoscaler scales it" in told.body.decode()
    assert scale.patches == []


def h2_headers(port: int, path: str, method: str = "GET", *extra: tuple[str, str]) -> Headers:
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", f"127.0.0.1:{port}"), *extra]


async def test_http2_streams_meet_the_same_choices() -> None:
    port = refused_port()
    navigation = (("accept", CHROME_ACCEPT), ("sec-fetch-mode", "navigate"))
    async with running_proxy([route("streams", f"127.0.0.1:{port}", hosts=["*"], **CHOICES)]) as server:
        counts = (await known_cold(server, "streams")).counts
        page = await h2_request(server.port, h2_headers(server.port, "/", "GET", *navigation), within=2)
        check = await h2_request(server.port, h2_headers(server.port, "/healthz"), within=2)
        head = await h2_request(server.port, h2_headers(server.port, "/robots.txt", "HEAD"), within=2)
        held = asyncio.create_task(
            h2_request(server.port, h2_headers(server.port, "/echo", "GET", ("accept", "application/json")))
        )
        await until(lambda: counts.held == 2)  # the API call, and the page's count
        upstream = await Upstream(port).start()
        try:
            await until(server.routes["default/streams"].has_usable)
            forwarded = await h2_request(server.port, h2_headers(server.port, "/echo", "GET", *navigation))
            api = await held
        finally:
            await upstream.stop()
    assert page.header(":status") == "503"
    assert page.header("content-type") == "text/html; charset=utf-8"
    assert page.header("cache-control") == "no-store"
    assert b"default/streams" in page.body
    assert (check.header(":status"), check.body) == ("200", b"ok")
    assert head.header(":status") == "200"
    assert head.header("content-length") == str(len(ROBOTS["response"]["body"]))  # type: ignore[index]
    assert head.body == b""
    assert forwarded.header(":status") == "200"
    assert api.header(":status") == "200"
    assert sorted(seen.path for seen in upstream.requests) == ["/echo", "/echo"]


def test_a_route_s_choice_series_go_with_the_route() -> None:
    telemetry.COLD_CHOICES.labels("gone/route", "never_wake").inc()
    telemetry.forget_route("gone/route")
    labels = {"route": "gone/route", "choice": "never_wake"}
    assert REGISTRY.get_sample_value("zeroscale_proxy_cold_choices_total", labels) is None


@pytest.mark.parametrize("field", ["never_wake", "match_headers"])
def test_the_host_is_matched_by_hosts_never_as_a_header(field: str) -> None:
    """HTTP/1.1 carries it in Host, HTTP/2 in :authority (or an absolute target): one way to match it, `hosts`."""
    rule = {"path": "/h", "headers": {"Host": "checker.example"}}
    with pytest.raises(ValueError, match="a header condition cannot name host"):
        RouteConfig.model_validate(
            route("host", "127.0.0.1:1", **({field: [rule]} if field == "never_wake" else {field: {"Host": "a"}}))
        )
