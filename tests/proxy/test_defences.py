"""Defences: smuggling, oversized and malformed heads, slow clients; and a bounded fuzz of parsing and routing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter.proxy.app import Proxy
from adapter.proxy.routing import Match, Router, normalise_host
from tests.fixtures.netutil import send_until_answered
from tests.fixtures.proxy import get, post, read_response, request, route, running_proxy
from tests.fixtures.upstream_app import Upstream

SMUGGLING = [
    # Content-Length and Transfer-Encoding together: the classic CL.TE / TE.CL desync.
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\nX",
    # Two different lengths, and a repeated one.
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    # Lengths that are not plain digits.
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\nabc",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3 3\r\n\r\nabc",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
    # Transfer codings other than a lone chunked, and obfuscated ones.
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n",
    # Folded headers, bare LF, control bytes, bad chunk sizes.
    b"GET /echo HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
    b"GET /echo HTTP/1.1\r\nHost: a\r\nX-A: b\rX-B: c\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    # Two Host headers.
    b"GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    # HTTP/1.1 without Host, a target that is not a path, CONNECT.
    b"GET /echo HTTP/1.1\r\n\r\n",
    b"GET echo HTTP/1.1\r\nHost: a\r\n\r\n",
    b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
]


@pytest.mark.parametrize("raw", SMUGGLING)
async def test_smuggling_and_malformed_requests_are_refused(proxy: Proxy, upstream: Upstream, raw: bytes) -> None:
    response = await request(proxy.port, raw)
    assert 400 <= response.status < 600
    assert response.headers.get("connection") == "close"
    assert upstream.requests == []


async def test_a_smuggled_second_request_never_reaches_the_upstream(proxy: Proxy, upstream: Upstream) -> None:
    smuggled = b"GET /admin HTTP/1.1\r\nHost: a\r\n\r\n"
    raw = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n%b" % (
        5 + len(smuggled),
        smuggled,
    )
    await request(proxy.port, raw)
    await asyncio.sleep(0.05)
    assert all(seen.path != "/admin" for seen in upstream.requests)


async def test_header_limits_are_431_and_414(upstream: Upstream) -> None:
    async with running_proxy(
        [route("limits", upstream.address)], max_header_bytes=1024, max_headers=10, max_request_line_bytes=256
    ) as server:
        assert (await request(server.port, get(extra="X-Big: " + "a" * 2000 + "\r\n"))).status == 431
        many = "".join(f"X-{i}: v\r\n" for i in range(20))
        assert (await request(server.port, get(extra=many))).status == 431
        assert (await request(server.port, get("/" + "p" * 300))).status == 414
        assert (await request(server.port, get())).status == 200


async def test_slow_headers_get_408_and_idle_connections_are_closed(upstream: Upstream) -> None:
    async with running_proxy([route("slowloris", upstream.address)], header_timeout=0.2, idle_timeout=0.2) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: a\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        assert data.startswith(b"HTTP/1.1 408")
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get())
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        # After the response the connection idles, and is closed after idle_timeout.
        assert await asyncio.wait_for(reader.read(), 5) is not None
        writer.close()


async def test_connections_over_the_limit_are_refused(upstream: Upstream) -> None:
    async with running_proxy([route("few", upstream.address)], max_connections=2) as server:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get())
        data = b"unread"
        with contextlib.suppress(ConnectionError):
            data = await asyncio.wait_for(reader.read(), 5)
        assert data == b"", "refused: closed without an answer"
        for _, held_writer in held:
            held_writer.close()


# --- fuzzing: random request heads never crash a connection, never forward what was refused ---

_TOKENS = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"HEAD",
        b" ",
        b"/",
        b"/echo",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"\r\n",
        b"\n",
        b":",
        b"Host",
        b"Content-Length",
        b"Transfer-Encoding",
        b"chunked",
        b"Connection",
        b"Upgrade",
        b"close",
        b"0",
        b"5",
        b"-1",
        b"\x00",
        b"\x7f",
        b"a.example",
        b"*.",
        b",",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TOKENS | st.binary(max_size=8), max_size=40).map(b"".join))
async def test_fuzzed_requests_get_an_answer_or_a_close(proxy: Proxy, raw: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(raw)
        writer.write_eof()
        # Whatever arrives: the proxy answers or closes, within the header timeout, and keeps serving.
        await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        pass
    finally:
        writer.close()
    assert (await request(proxy.port, get())).status == 200


@settings(max_examples=300, deadline=None)
@given(
    hosts=st.lists(st.sampled_from(["a.example", "*.example", "*.b.example", "*", "c.example"]), min_size=1),
    prefix=st.sampled_from(["/", "/api", "/api/", "/x"]),
    host=st.binary(max_size=30),
    path=st.binary(max_size=30),
)
def test_routing_matches_only_configured_hosts_and_prefixes(
    hosts: list[str], prefix: str, host: bytes, path: bytes
) -> None:
    router: Router[str] = Router([(Match(hosts, prefix), "route")])
    found = router.match(host, path, [])
    if found is not None:
        name = normalise_host(host).decode("latin-1")
        assert "*" in hosts or name in hosts or any(h.startswith("*.") and name.endswith(h[1:]) for h in hosts)
        assert path.startswith(prefix.encode())


async def test_one_endless_header_line_is_431_not_buffered(upstream: Upstream) -> None:
    async with running_proxy([route("endless", upstream.address)], max_header_bytes=1024) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /echo HTTP/1.1\r\nHost: a\r\nX-Endless: ")
        answer = await send_until_answered(reader, writer, b"a" * 1024, 64)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 431")


async def test_large_response_to_a_slow_client_is_streamed_and_the_connection_reused(upstream: Upstream) -> None:
    async with running_proxy([route("big", upstream.address)]) as server:
        body = bytes(range(256)) * 40_000  # 10 MB: more than any socket buffer
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post(body))
        response = await asyncio.wait_for(read_response(reader), 30)
        assert response.body == body
        for index in range(3):
            writer.write(get(f"/echo?after={index}"))
            follow_up = await asyncio.wait_for(read_response(reader), 10)
            assert follow_up.headers["x-seen-path"] == f"/echo?after={index}"
        writer.close()
