"""Every phase of a proxy connection has a deadline: body, response body, a client that stops reading,
idle tunnels; and a tunnel is not a pending request."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import REGISTRY

from adapter.config.route import RouteLimits
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, post, read_response, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.security.h11_upstream import H11Upstream

UPGRADE = b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


def _hits(route_name: str, limit: str) -> float:
    labels = {"route": f"default/{route_name}" if route_name else "", "limit": limit}
    value = REGISTRY.get_sample_value("zeroscale_proxy_limit_hits_total", labels)
    return value or 0.0


async def _read_all(reader: asyncio.StreamReader, within: float = 5.0) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                data += chunk
    return data


def test_the_body_timeout_defaults_to_60_s_at_most() -> None:
    limits = RouteLimits()
    assert 0 < limits.body_timeout <= 60
    assert limits.tunnel_idle_timeout > 0
    assert limits.max_tunnels >= 1


@pytest.mark.parametrize(
    "partial",
    [
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly this",
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_body_that_stops_coming_is_408_and_stops_counting(upstream: Upstream, partial: bytes) -> None:
    async with running_proxy([route("body", upstream.address, limits={"body_timeout": 0.3})]) as server:
        counts = server.routes["default/body"].counts
        before = _hits("body", "body_timeout")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(partial)
        await until(lambda: counts.inflight == 1)
        answer = await _read_all(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"limits.body_timeout" in answer
        assert counts.inflight == 0
        assert server.routes["default/body"].endpoints[0].inflight == 0
        assert _hits("body", "body_timeout") == before + 1


async def test_a_pipelined_body_gets_its_deadline_when_it_is_served(upstream: Upstream) -> None:
    # The second request's body waits behind the first response through no fault of the client: its clock
    # starts only when it is served, so a slow first response does not make it 408.
    async with running_proxy([route("pipe", upstream.address, limits={"body_timeout": 0.5})]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/slow?s=0.8") + post(b"x" * 40_000, "/echo?second"))
        first = await asyncio.wait_for(read_response(reader), 5)
        second = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert (first.status, second.status, second.body) == (200, 200, b"x" * 40_000)


async def test_an_upstream_that_stalls_mid_body_is_cut_off_and_stops_counting() -> None:
    stalled = await H11Upstream(reply=lambda _r: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst bytes").start()
    try:
        async with running_proxy([route("stall", stalled.address, limits={"response_timeout": 0.3})]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(get())
            received = await _read_all(reader)
            writer.close()
            assert received.startswith(b"HTTP/1.1 200")
            assert received.endswith(b"first bytes"), "cut off: the client sees a short body and a close"
            assert server.routes["default/stall"].counts.inflight == 0
    finally:
        await stalled.stop()


async def test_a_client_that_stops_reading_is_cut_off_after_send_timeout(upstream: Upstream) -> None:
    async with running_proxy([route("reader", upstream.address)], send_timeout=0.3) as server:
        counts = server.routes["default/reader"].counts
        before = _hits("reader", "send_timeout")
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # 32 MB echoed back and never read: more than the socket buffers on both sides hold.
        body = b"z" * (32 * 1024 * 1024)
        writer.write(post(body))
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.drain(), 30)
        await until(lambda: _hits("reader", "send_timeout") == before + 1, within=30)
        await until(lambda: counts.inflight == 0)
        writer.close()


# --- tunnels ---


async def test_a_tunnel_leaves_the_pending_count_and_the_endpoint_slots(upstream: Upstream) -> None:
    async with running_proxy([route("ws", upstream.address, limits={"endpoint_concurrency": 2})]) as server:
        ws = server.routes["default/ws"]
        tunnels = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(UPGRADE)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 101")
            tunnels.append(writer)
        assert (ws.tunnels, ws.counts.pending, ws.endpoints[0].inflight) == (3, 0, 0)
        sample = REGISTRY.get_sample_value("zeroscale_proxy_open_tunnels", {"route": "default/ws"})
        assert sample == 3
        # Plain requests still find room on the endpoint.
        assert (await request(server.port, get(), within=5)).status == 200
        for writer in tunnels:
            writer.close()
        await until(lambda: ws.tunnels == 0)


async def test_tunnels_beyond_max_tunnels_are_503(upstream: Upstream) -> None:
    async with running_proxy([route("few", upstream.address, limits={"max_tunnels": 1})]) as server:
        before = _hits("few", "max_tunnels")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(UPGRADE)
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101")
        refused = await request(server.port, UPGRADE)
        assert refused.status == 503
        assert b"limits.max_tunnels" in refused.body
        assert _hits("few", "max_tunnels") == before + 1
        writer.close()


async def test_an_idle_tunnel_is_closed_after_tunnel_idle_timeout(upstream: Upstream) -> None:
    async with running_proxy([route("idle", upstream.address, limits={"tunnel_idle_timeout": 0.4})]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(UPGRADE)
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101")
        # Traffic keeps it open past the timeout; silence then closes it.
        for _ in range(4):
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
            await asyncio.sleep(0.15)
        assert server.routes["default/idle"].tunnels == 1
        assert await _read_all(reader) == b""
        await until(lambda: server.routes["default/idle"].tunnels == 0)
        writer.close()


async def test_bytes_sent_ahead_of_a_held_upgrade_are_bounded() -> None:
    """A client may send tunnel bytes before the 101 (they are kept for the tunnel); past 64 KiB, sent in
    many small segments as a peer trying to make the count expensive would, the connection is closed."""
    cold = f"127.0.0.1:{refused_port()}"  # nothing listens: the upgrade request is held
    async with running_proxy([route("early", cold, limits={"hold_timeout": 30})]) as server:
        counts = server.routes["default/early"].counts
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(UPGRADE)
        await until(lambda: counts.held == 1)
        with contextlib.suppress(ConnectionError):
            for _ in range(70):
                writer.write(b"x" * 1024)
                await writer.drain()
        assert await _read_all(reader) == b""  # closed unanswered
        await until(lambda: counts.held == 0)
        writer.close()
