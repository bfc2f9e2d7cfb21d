"""Hostile HTTP/2 is normal input: each known attack class against the proxy's HTTP/2 listener, with what must hold
for it. The defence fires (GOAWAY with its code, RST_STREAM, or the connection closed) within a bound and is counted;
another client, HTTP/1.1 and HTTP/2, is answered during and after; and nothing of the attack stays behind (no client
connection, no pending request, the upstream connection freed). Limits are set low so that each case is quick."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    ExtensionFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from prometheus_client import REGISTRY

from adapter.proxy.app import Proxy
from tests.fixtures.proxy import get, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.security.h2_peer import PREFACE, RawPeer, h2_get, request_fields
from tests.security.h11_upstream import H11Upstream

ROUTE = "default/app"
# Every deadline of these tests: header, send, body (idle is longer: a quiet moment must not end a test).
TIMEOUT = 0.4
# The sweeper checks deadlines every quarter of the shortest timeout: a deadline fires at most 25% late; the rest
# is the test's own scheduling on a shared machine.
LATE = TIMEOUT * 0.25 + 0.5
HTTP2 = {"max_concurrent_streams": 8, "max_stream_resets": 40, "max_control_frames": 100, "abuse_window": 10}
ENHANCE_YOUR_CALM, PROTOCOL_ERROR, NO_ERROR, INTERNAL_ERROR, REFUSED_STREAM = 0xB, 0x1, 0x0, 0x2, 0x7


@asynccontextmanager
async def attacked(address: str, **settings: Any) -> AsyncIterator[Proxy]:
    """The proxy with one route to `address` and every limit and deadline small."""
    limits = {"body_timeout": TIMEOUT}
    settings = {
        "header_timeout": TIMEOUT,
        "send_timeout": TIMEOUT,
        "idle_timeout": 5,
        "http2": HTTP2,
        **settings,
    }
    async with running_proxy([route("app", address, limits=limits)], **settings) as server:
        yield server


def hits(limit: str, route_key: str = "") -> float:
    return REGISTRY.get_sample_value("zeroscale_proxy_limit_hits_total", {"route": route_key, "limit": limit}) or 0.0


def goaways(code: str) -> float:
    return REGISTRY.get_sample_value("zeroscale_proxy_http2_goaways_total", {"code": code}) or 0.0


async def bystanders(server: Proxy) -> None:
    """Another client's requests, one HTTP/1.1 and one HTTP/2, answered as usual."""
    assert (await request(server.port, get("/echo?bystander=1"), within=3)).status == 200
    assert (await h2_get(server.port, "/echo?bystander=2", within=3))[0] == 200


async def settled(server: Proxy) -> None:
    """Nothing of the attack is left: no client connection and no pending request on the route."""
    counts = server.routes[ROUTE].counts
    await until(lambda: not server.data.connections and counts.pending == 0, within=3)


async def flood(peer: RawPeer, frames: list[bytes], batch: int = 10) -> int:
    """Write `frames` in batches, letting the proxy (and bystanders) run between them, until the proxy closes the
    connection; how many were written."""
    for start in range(0, len(frames), batch):
        peer.write(b"".join(frames[start : start + batch]))
        if not await peer.drain():
            return start
        await asyncio.sleep(0.001)
    return len(frames)


@pytest.mark.parametrize("batch", [10, 4000], ids=["ten-a-write", "all-in-one-write"])
async def test_rapid_reset_is_goaway_enhance_your_calm_and_cancels_the_streams(upstream: Upstream, batch: int) -> None:
    """CVE-2023-44487: streams opened and reset at once cost the client nothing and the server a request each."""
    async with attacked(upstream.address) as server:
        before = hits("http2.max_stream_resets"), goaways("ENHANCE_YOUR_CALM")
        peer = await RawPeer.connect(server.port)
        opened = [peer.headers(n, "/slow?s=2") + RstStreamFrame(n, 0x8).serialize() for n in range(1, 8000, 2)]
        start = time.monotonic()
        _, goaway = await asyncio.gather(
            asyncio.gather(flood(peer, opened, batch), bystanders(server)), peer.goaway(within=3)
        )
        elapsed = time.monotonic() - start
        assert goaway.error_code == ENHANCE_YOUR_CALM
        assert b"proxy.http2.max_stream_resets" in goaway.additional_data
        # The streams h2 parsed before the proxy stopped it: all 4,000 of one read (h2 parses what it is given
        # whole, some 75 us a stream) but for the slices of 16 KB it is given, the last one's streams at most past
        # the limit.
        per_slice = 16 * 1024 // len(opened[-1]) + 1
        assert goaway.last_stream_id <= 2 * (HTTP2["max_stream_resets"] + 1 + per_slice) - 1
        assert await peer.closed(within=1) < 1
        assert elapsed < 1
        assert (hits("http2.max_stream_resets"), goaways("ENHANCE_YOUR_CALM")) == (before[0] + 1, before[1] + 1)
        await settled(server)
        # The reset streams' requests were withdrawn before they reached the upstream, or cut off there.
        attacked_requests = [seen for seen in upstream.requests if seen.path == "/slow?s=2"]
        assert len(attacked_requests) <= HTTP2["max_stream_resets"] + 1
        peer.close()
        await bystanders(server)


async def test_made_you_reset_counts_the_resets_the_client_provokes(upstream: Upstream) -> None:
    """MadeYouReset (CVE-2025-8671): frames that make the server reset the stream itself (here DATA after the
    request's END_STREAM) count as the client's resets, and their requests are withdrawn too."""
    async with attacked(upstream.address) as server:
        peer = await RawPeer.connect(server.port)
        provoked = [peer.headers(n, "/slow?s=2") + DataFrame(n, b"x").serialize() for n in range(1, 2000, 2)]
        _, goaway = await asyncio.gather(
            asyncio.gather(flood(peer, provoked), bystanders(server)), peer.goaway(within=3)
        )
        assert goaway.error_code == ENHANCE_YOUR_CALM
        assert b"proxy.http2.max_stream_resets" in goaway.additional_data
        await settled(server)
        peer.close()


async def test_continuation_flood_is_goaway_once_the_block_passes_max_header_bytes(upstream: Upstream) -> None:
    """CVE-2024-27316 and kin: a header block that never ends, sent as fast as the proxy reads it. HPACK-encoded, a
    header list is no larger than decoded, so the block is refused as soon as its bytes pass proxy.max_header_bytes,
    long before h2's own bound (64 CONTINUATION frames: a megabyte per connection)."""
    async with attacked(upstream.address, max_header_bytes=4096) as server:
        before = hits("max_header_bytes"), goaways("ENHANCE_YOUR_CALM")
        peer = await RawPeer.connect(server.port)
        head = HeadersFrame(1, peer.block(request_fields())).serialize()
        filler = ContinuationFrame(1, b"\x00" * 1024).serialize()
        start = time.monotonic()
        _, goaway = await asyncio.gather(
            asyncio.gather(flood(peer, [head] + [filler] * 1000, batch=1), bystanders(server)), peer.goaway(within=3)
        )
        assert time.monotonic() - start < 1
        assert goaway.error_code == ENHANCE_YOUR_CALM
        assert b"proxy.max_header_bytes" in goaway.additional_data
        assert (hits("max_header_bytes"), goaways("ENHANCE_YOUR_CALM")) == (before[0] + 1, before[1] + 1)
        assert await peer.closed(within=1) < 1
        await settled(server)


async def test_hpack_bomb_is_goaway_at_max_header_bytes_without_decoding_it_all(upstream: Upstream) -> None:
    """A header block of a few KB that decodes to megabytes: one 4 KB field put in the dynamic table, then
    referenced a thousand times by its one-byte index."""
    async with attacked(upstream.address) as server:
        before = hits("max_header_bytes"), goaways("ENHANCE_YOUR_CALM")
        peer = await RawPeer.connect(server.port)
        seed = peer.block([*request_fields(), ("x-bomb", "b" * 4000)])
        bomb = HeadersFrame(1, seed + b"\xbe" * 1000)  # 0xbe: the indexed field 62, the newest in the dynamic table
        bomb.flags.add("END_HEADERS")
        bomb.flags.add("END_STREAM")
        start = time.monotonic()
        peer.send(bomb)
        goaway = await peer.goaway(within=2)
        assert time.monotonic() - start < 0.5
        assert goaway.error_code == ENHANCE_YOUR_CALM
        assert b"proxy.max_header_bytes" in goaway.additional_data
        assert (hits("max_header_bytes"), goaways("ENHANCE_YOUR_CALM")) == (before[0] + 1, before[1] + 1)
        assert await peer.closed(within=1) < 1
        assert [seen for seen in upstream.requests if "x-bomb" in seen.headers] == []
        await bystanders(server)
        await settled(server)


CONTROL_FLOODS: dict[str, Frame] = {
    "settings": SettingsFrame(0),
    "ping": PingFrame(0, b"12345678"),
    "priority": PriorityFrame(1, depends_on=0, stream_weight=15),
    "unknown": ExtensionFrame(0xFA, 0),
}


@pytest.mark.parametrize("kind", list(CONTROL_FLOODS))
async def test_control_frame_floods_are_goaway_enhance_your_calm(upstream: Upstream, kind: str) -> None:
    """SETTINGS, PING (each answered: the answers pile up in a client that does not read), PRIORITY and unknown
    frames: cheap to send, some work each, no request."""
    async with attacked(upstream.address) as server:
        before = hits("http2.max_control_frames"), goaways("ENHANCE_YOUR_CALM")
        peer = await RawPeer.connect(server.port)
        frame = CONTROL_FLOODS[kind].serialize()
        start = time.monotonic()
        _, goaway = await asyncio.gather(
            asyncio.gather(flood(peer, [frame] * 100_000, batch=50), bystanders(server)), peer.goaway(within=3)
        )
        assert time.monotonic() - start < 1
        assert goaway.error_code == ENHANCE_YOUR_CALM
        assert b"proxy.http2.max_control_frames" in goaway.additional_data
        # Answers (SETTINGS ACK, PING ACK) went only for the frames within the limit.
        answered = [f for f in peer.received if isinstance(f, SettingsFrame | PingFrame) and "ACK" in f.flags]
        assert len(answered) <= HTTP2["max_control_frames"] + 1
        assert (hits("http2.max_control_frames"), goaways("ENHANCE_YOUR_CALM")) == (before[0] + 1, before[1] + 1)
        assert await peer.closed(within=1) < 1
        await settled(server)


async def test_requests_whose_headers_carry_a_priority_are_not_control_frames(upstream: Upstream) -> None:
    """nghttp2's client (and browsers) set the PRIORITY flag on every HEADERS frame: more requests than
    max_control_frames on one connection are all answered."""
    async with attacked(upstream.address) as server:
        peer = await RawPeer.connect(server.port)
        for n in range(1, 4 * HTTP2["max_control_frames"], 2):
            peer.write(peer.headers(n, priority=True))
            assert await peer.until(lambda f: isinstance(f, DataFrame) and "END_STREAM" in f.flags, within=2)
        assert not [f for f in peer.received if isinstance(f, GoAwayFrame)]
        peer.close()
        await settled(server)


@asynccontextmanager
async def big_responses() -> AsyncIterator[H11Upstream]:
    """An upstream answering /big with 16 MB (more than any socket buffer takes), anything else with nothing."""
    body = 16 * 1024 * 1024
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body + b"z" * body
    small = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    stand_in = await H11Upstream(reply=lambda seen: big if seen.target == b"/big" else small).start()
    try:
        yield stand_in
    finally:
        await stand_in.stop()


async def dribble(peer: RawPeer, stream_id: int) -> None:
    """Open the stream's window a byte at a time, a little faster than the send timeout."""
    while True:
        await asyncio.sleep(TIMEOUT / 8)
        peer.send(WindowUpdateFrame(stream_id, 1))


@pytest.mark.parametrize("dribbled", [False, True], ids=["window-never-opened", "window-opened-a-byte-at-a-time"])
async def test_a_zero_window_stall_resets_the_stream_after_send_timeout_and_frees_the_upstream(dribbled: bool) -> None:
    """A client that lets a response start and never opens its window for the body, or opens it a byte at a time
    (CVE-2019-9511, data dribble): the stream is reset once response bytes have waited proxy.send_timeout, the
    upstream connection (paused with the rest of the response unread) is closed, and the client's connection
    goes on."""
    async with big_responses() as stand_in, attacked(stand_in.address) as server:
        before = hits("send_timeout", ROUTE)
        peer = await RawPeer.connect(server.port, {SettingsFrame.INITIAL_WINDOW_SIZE: 0})
        peer.write(peer.headers(1, "/big"))
        start = time.monotonic()
        await peer.until(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 1, within=2)
        stalled = next(seen.connection for seen in stand_in.requests if seen.target == b"/big")
        opener = asyncio.create_task(dribble(peer, 1)) if dribbled else None
        await bystanders(server)  # while the stalled stream waits
        reset = await peer.reset(1, within=TIMEOUT + LATE)
        if opener is not None:
            opener.cancel()
        assert reset.error_code == INTERNAL_ERROR
        assert TIMEOUT <= time.monotonic() - start < TIMEOUT + LATE
        assert hits("send_timeout", ROUTE) == before + 1
        await until(lambda: stalled not in stand_in.open and server.routes[ROUTE].counts.pending == 0)
        # The connection itself is still served: a new stream on it is answered (its window is open).
        peer.send(SettingsFrame(0, {SettingsFrame.INITIAL_WINDOW_SIZE: 65535}))
        peer.write(peer.headers(3, "/big"))
        assert await peer.until(lambda f: isinstance(f, DataFrame) and f.stream_id == 3, within=2)
        peer.close()
        await bystanders(server)
        await settled(server)


async def test_a_client_that_reads_nothing_loses_the_connection_after_send_timeout() -> None:
    """Windows wide open and the socket never read: the proxy's send buffer fills; once it has stayed full for
    proxy.send_timeout the connection is cut off, and the upstream connection with it."""
    async with big_responses() as stand_in, attacked(stand_in.address) as server:
        before = hits("send_timeout")
        peer = await RawPeer.connect(server.port, {SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1})
        peer.send(WindowUpdateFrame(0, 2**31 - 1 - 65535))
        peer.write(peer.headers(1, "/big"))
        await until(lambda: any(seen.target == b"/big" for seen in stand_in.requests))
        stalled = stand_in.requests[-1].connection
        await bystanders(server)
        await until(lambda: hits("send_timeout") == before + 1, within=TIMEOUT + LATE + 1)
        await until(lambda: stalled not in stand_in.open)
        await settled(server)
        peer.close()


async def test_more_streams_than_max_concurrent_streams_is_goaway_naming_the_limit(upstream: Upstream) -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS said how many: one more ends the connection (h2 makes it a connection error),
    and the streams it had are withdrawn."""
    async with attacked(upstream.address) as server:
        before = hits("http2.max_concurrent_streams"), goaways("PROTOCOL_ERROR")
        peer = await RawPeer.connect(server.port)
        limit = HTTP2["max_concurrent_streams"]
        peer.write(b"".join(peer.headers(n, "/slow?s=3") for n in range(1, 2 * limit + 1, 2)))
        await until(lambda: server.routes[ROUTE].counts.pending == limit)
        (connection,) = server.data.connections
        assert len(connection.streams) == limit  # type: ignore[union-attr]
        await bystanders(server)
        peer.write(peer.headers(2 * limit + 1, "/slow?s=3"))
        goaway = await peer.goaway(within=1)
        assert goaway.error_code == PROTOCOL_ERROR
        assert b"proxy.http2.max_concurrent_streams" in goaway.additional_data
        assert (hits("http2.max_concurrent_streams"), goaways("PROTOCOL_ERROR")) == (before[0] + 1, before[1] + 1)
        assert await peer.closed(within=1) < 1
        await settled(server)
        assert len([seen for seen in upstream.requests if seen.path == "/slow?s=3"]) <= limit
        await bystanders(server)


@pytest.mark.parametrize(
    ("continued", "beside"),
    [(False, False), (True, False), (False, True)],
    ids=["silence", "slow-continuations", "begun-after-a-frame-beside-an-open-stream"],
)
async def test_a_header_block_that_never_ends_is_closed_after_header_timeout(
    upstream: Upstream, continued: bool, beside: bool
) -> None:
    """HEADERS without END_HEADERS, then silence, or CONTINUATIONs too slow to finish it (each one that does not end
    the block leaves its deadline as it was). Beside: the block begins in the same read as a whole frame, while
    another stream of the connection waits for its response: neither stands for progress on the block."""
    async with attacked(upstream.address) as server:
        before = hits("header_timeout"), goaways("PROTOCOL_ERROR")
        peer = await RawPeer.connect(server.port)
        if beside:
            peer.write(peer.headers(1, "/slow?s=5"))
            await until(lambda: server.routes[ROUTE].counts.pending == 1)
        unfinished = HeadersFrame(3, peer.block(request_fields())).serialize()
        peer.write((PingFrame(0, b"p" * 8).serialize() if beside else b"") + unfinished)
        start = time.monotonic()
        for _ in range(3 if continued else 0):
            await asyncio.sleep(TIMEOUT / 4)
            peer.send(ContinuationFrame(3, b""))
        await bystanders(server)
        goaway = await peer.goaway(within=TIMEOUT + LATE)
        assert TIMEOUT <= time.monotonic() - start < TIMEOUT + LATE
        assert goaway.error_code == PROTOCOL_ERROR
        assert b"proxy.header_timeout" in goaway.additional_data
        assert (hits("header_timeout"), goaways("PROTOCOL_ERROR")) == (before[0] + 1, before[1] + 1)
        assert await peer.closed(within=1) < 1
        await settled(server)


@pytest.mark.parametrize(
    ("sent", "after", "code", "timed_out"),
    [
        (PREFACE[:10], TIMEOUT, None, 1),
        (PREFACE, TIMEOUT, PROTOCOL_ERROR, 1),
        (PREFACE + SettingsFrame(0).serialize(), 1.0, NO_ERROR, 0),
    ],
    ids=["part-of-the-preface", "the-preface-alone", "preface-and-settings-then-idle"],
)
async def test_a_connection_that_stops_early_is_closed_after_its_timeout(
    upstream: Upstream, sent: bytes, after: float, code: int | None, timed_out: int
) -> None:
    """Part of the preface (still an HTTP/1.1 connection: closed at header_timeout, nothing answered, counted), the
    preface without the SETTINGS that must follow (GOAWAY at header_timeout), a connection with nothing in flight
    (GOAWAY NO_ERROR at idle_timeout)."""
    async with attacked(upstream.address, idle_timeout=1.0) as server:
        before = hits("header_timeout")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        peer = RawPeer(reader, writer)
        peer.write(sent)
        start = time.monotonic()
        await bystanders(server)
        await peer.closed(within=after + LATE)
        assert after <= time.monotonic() - start < after + LATE
        goaway_codes = [f.error_code for f in peer.received if isinstance(f, GoAwayFrame)]
        assert goaway_codes == ([] if code is None else [code])
        assert hits("header_timeout") == before + timed_out
        peer.close()
        await settled(server)


async def test_a_request_body_that_stops_is_408_after_body_timeout(upstream: Upstream) -> None:
    async with attacked(upstream.address) as server:
        before = hits("body_timeout", ROUTE)
        peer = await RawPeer.connect(server.port)
        head = HeadersFrame(1, peer.block([*request_fields("/echo", "POST"), ("content-length", "100")]))
        head.flags.add("END_HEADERS")
        peer.send(head, DataFrame(1, b"x" * 10))
        start = time.monotonic()
        await bystanders(server)
        await peer.until(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 1, within=2)
        assert peer.heads[1][0][b":status"] == b"408"
        assert TIMEOUT <= time.monotonic() - start < TIMEOUT + LATE
        assert hits("body_timeout", ROUTE) == before + 1
        await peer.reset(1, within=1)  # the rest of the body is not wanted
        await until(lambda: server.routes[ROUTE].counts.pending == 0)
        # The connection goes on.
        peer.write(peer.headers(3, "/echo?after"))
        await peer.until(lambda f: isinstance(f, HeadersFrame) and f.stream_id == 3, within=2)
        assert peer.heads[3][0][b":status"] == b"200"
        peer.close()
        await settled(server)


@pytest.mark.parametrize(("grace", "status"), [(5, b"200"), (0.3, b"503")], ids=["finishes", "outlasts-the-grace"])
async def test_draining_sends_goaway_and_lets_an_open_stream_finish(
    upstream: Upstream, grace: float, status: bytes
) -> None:
    """SIGTERM: GOAWAY NO_ERROR naming the last stream taken; that stream's response still comes within the grace
    period (or a 503 once it is over), a stream opened after the GOAWAY is refused (REFUSED_STREAM: the client may
    retry it elsewhere)."""
    async with attacked(upstream.address) as server:
        peer = await RawPeer.connect(server.port)
        peer.write(peer.headers(1, "/slow?s=1"))
        await until(lambda: server.routes[ROUTE].counts.pending == 1)
        start = time.monotonic()
        drain = asyncio.create_task(server.shutdown(grace=grace))
        goaway = await peer.goaway(within=1)
        assert (goaway.error_code, goaway.last_stream_id) == (NO_ERROR, 1)
        peer.write(peer.headers(3, "/echo?late"))
        assert (await peer.reset(3, within=1)).error_code == REFUSED_STREAM
        await peer.closed(within=2)
        assert time.monotonic() - start < min(grace, 1) + LATE
        answered = [f for f in peer.received if f.stream_id == 1 and isinstance(f, HeadersFrame | DataFrame)]
        assert peer.heads[1][0][b":status"] == status
        assert "END_STREAM" in answered[-1].flags
        await asyncio.wait_for(drain, 2)
        assert [seen.path for seen in upstream.requests] == ["/slow?s=1"]


async def test_a_client_goaway_lets_its_open_stream_finish(upstream: Upstream) -> None:
    """A client saying GOAWAY (it will take no new streams: it is closing) still gets the responses it waits for;
    then the connection closes."""
    async with attacked(upstream.address) as server:
        peer = await RawPeer.connect(server.port)
        peer.write(peer.headers(1, "/slow?s=0.3"))
        await until(lambda: server.routes[ROUTE].counts.pending == 1)
        # The GOAWAY and a frame after it in one read, as a client closing its side writes them.
        peer.send(GoAwayFrame(0, last_stream_id=0, error_code=NO_ERROR), PingFrame(0, b"12345678"))
        assert await peer.until(lambda f: isinstance(f, PingFrame) and "ACK" in f.flags, within=1)
        assert await peer.until(lambda f: isinstance(f, DataFrame) and "END_STREAM" in f.flags, within=2)
        await peer.closed(within=1)
        await settled(server)


async def test_a_huge_header_table_size_does_not_grow_the_proxys_encoder(upstream: Upstream) -> None:
    """SETTINGS_HEADER_TABLE_SIZE is the client's decoder's room, up to 4 GiB: an encoder that used all of it would
    keep every distinct response field of the connection (here each response's X-Seen-Path) in memory."""
    async with attacked(upstream.address) as server:
        peer = await RawPeer.connect(server.port, {SettingsFrame.HEADER_TABLE_SIZE: 2**31})
        peer.decoder.max_allowed_table_size = 2**31
        paths = [f"/echo?{n}={'p' * 1000}" for n in range(100)]
        streams = HTTP2["max_concurrent_streams"]
        peer.write(b"".join(peer.headers(2 * n + 1, path) for n, path in enumerate(paths[:streams])))
        for n in range(len(paths)):  # one more stream each time one ends
            await peer.until(lambda f: isinstance(f, DataFrame) and "END_STREAM" in f.flags, within=2)
            if n + streams < len(paths):
                peer.write(peer.headers(2 * (n + streams) + 1, paths[n + streams]))
        assert [head[0][b"x-seen-path"] for _, head in sorted(peer.heads.items())] == [p.encode() for p in paths]
        (connection,) = server.data.connections
        table = connection.h2.encoder.header_table  # type: ignore[union-attr]
        assert sum(32 + len(name) + len(value) for name, value in table.dynamic_entries) <= 4096
        peer.close()
        await settled(server)


async def test_a_busy_client_that_cancels_fewer_calls_than_it_lets_finish_keeps_its_connection(
    upstream: Upstream,
) -> None:
    """More resets than max_stream_resets, but among more answered streams: cancellations (gRPC deadlines, users
    leaving), not a rapid reset. The connection stays and keeps serving."""
    async with attacked(upstream.address) as server:
        before = hits("http2.max_stream_resets")
        peer = await RawPeer.connect(server.port)

        async def answered(stream_id: int) -> bool:
            peer.write(peer.headers(stream_id, "/echo"))
            ended = await peer.until(lambda frame: frame.stream_id == stream_id and "END_STREAM" in frame.flags, 3)
            return ended is not None

        stream_id = 1
        for _ in range(HTTP2["max_stream_resets"] + 10):
            for _answered in range(2):  # two answered for each one cancelled
                assert await answered(stream_id)
                stream_id += 2
            peer.write(peer.headers(stream_id, "/slow?s=2") + RstStreamFrame(stream_id, 0x8).serialize())
            stream_id += 2
        assert await answered(stream_id)  # still served after more resets than the limit
        assert hits("http2.max_stream_resets") == before
        peer.close()
        await bystanders(server)
