"""Bytes a client may send ahead of its answers, bytes an upstream may send after a HEAD answer, and a
port in use: each bounded or refused with a message that names what to change."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from tests.fixtures.netutil import send_until_answered
from tests.fixtures.proxy import Responses, get, read_response, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.security.h11_upstream import H11Upstream


async def test_pipelined_bytes_past_the_limit_are_refused_after_the_answers_before_them(upstream: Upstream) -> None:
    async with running_proxy([route("pipe", upstream.address)], max_pipelined_bytes=64 * 1024) as server:
        before = REGISTRY.get_sample_value(
            "zeroscale_proxy_limit_hits_total", {"route": "", "limit": "max_pipelined_bytes"}
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # One slow request, then 256 KB of pipelined requests in the same write.
        flood = get("/echo?n") * (256 * 1024 // len(get("/echo?n")))
        writer.write(get("/slow?s=0.3") + flood)
        responses = Responses(reader)
        first = await responses.next()
        refused = await responses.next()
        rest = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert first.status == 200
        assert refused.status == 503
        assert b"proxy.max_pipelined_bytes" in refused.body
        assert rest == b""
        # Nothing past the limit was parsed into requests, let alone forwarded.
        assert [seen.path for seen in upstream.requests] == ["/slow?s=0.3"]
        after = REGISTRY.get_sample_value(
            "zeroscale_proxy_limit_hits_total", {"route": "", "limit": "max_pipelined_bytes"}
        )
        assert (after or 0) == (before or 0) + 1


async def test_pipelined_requests_within_the_limit_are_all_answered_in_order(upstream: Upstream) -> None:
    async with running_proxy([route("pipe", upstream.address)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/slow?s=0.1") + b"".join(get(f"/echo?i={i}") for i in range(50)))
        responses = Responses(reader)
        paths = [(await responses.next()).headers["x-seen-path"] for _ in range(51)]
        writer.close()
        assert paths == ["/slow?s=0.1", *(f"/echo?i={i}" for i in range(50))]


async def test_a_refused_pipelined_request_is_answered_after_the_ones_before_it(upstream: Upstream) -> None:
    async with running_proxy([route("pipe", upstream.address)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/slow?s=0.1") + get("/echo?second") + b"GET /echo HTTP/1.1\r\n\r\n")
        responses = Responses(reader)
        statuses = [(await responses.next()).status for _ in range(3)]
        writer.close()
        assert statuses == [200, 200, 400]


async def test_bytes_after_a_head_response_are_502_and_the_connection_is_not_pooled(upstream: Upstream) -> None:
    async with running_proxy([route("head", upstream.address)]) as server:
        response = await request(
            server.port, b"HEAD /echo?head_body=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
        )
        assert response.status == 502
        assert b"HEAD" in response.body
        # The next request goes on a new upstream connection and gets its own answer.
        follow = await request(server.port, get("/echo?next"))
        assert follow.headers["x-seen-path"] == "/echo?next"
        assert upstream.connections == 2


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nnot a response",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["second-response", "garbage", "chunked-body"],
)
async def test_anything_after_a_head_answer_is_502(reply: bytes) -> None:
    stand_in = await H11Upstream(reply=lambda _r: reply).start()
    try:
        async with running_proxy([route("head", stand_in.address)]) as server:
            assert (await request(server.port, b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n")).status == 502
    finally:
        await stand_in.stop()


async def test_a_clean_head_answer_keeps_the_connection() -> None:
    stand_in = await H11Upstream(reply=lambda _r: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").start()
    try:
        async with running_proxy([route("head", stand_in.address)]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for _ in range(2):
                writer.write(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n")
                head = await asyncio.wait_for(read_response(reader, head_only=True), 5)
                assert (head.status, head.headers["content-length"]) == (200, "5")
            writer.close()
            assert stand_in.connections == 1
    finally:
        await stand_in.stop()


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {
            **os.environ,
            "ZEROSCALE_PROXY__SIDECAR__UPSTREAM": "127.0.0.1:9",
            "ZEROSCALE_PROXY__BIND": "127.0.0.1",
            "ZEROSCALE_PROXY__PORT": str(taken.getsockname()[1]),
            "ZEROSCALE_PROXY__ADMIN_BIND": "127.0.0.1",
            "ZEROSCALE_PROXY__ADMIN_PORT": "0",
        }
        env.pop("ZEROSCALE_CONFIG", None)
        done = subprocess.run(
            [sys.executable, "-m", "adapter", "proxy"], env=env, capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "cannot listen" in line]
    assert len(errors) == 1, done.stderr


async def test_the_admin_port_bounds_its_connections(upstream: Upstream) -> None:
    async with running_proxy([route("admin", upstream.address)], admin_max_connections=2) as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.admin_port) for _ in range(2)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.admin_port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
        try:
            answer = await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            answer = b""  # reset: closed unanswered too
        writer.close()
        assert answer == b"", "over the limit: closed unanswered"
        for _, idle_writer in idle:
            idle_writer.close()
        # Once they are gone, the port answers again.
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.admin_port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_endless_trailers_are_431_not_buffered(upstream: Upstream) -> None:
    async with running_proxy([route("trailers", upstream.address)], max_header_bytes=1024) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: "
        )
        answer = await send_until_answered(reader, writer, b"a" * 1024, 256)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 431")
        assert server.routes["default/trailers"].counts.inflight == 0


async def test_chunks_larger_than_the_head_limit_are_not_taken_for_trailers(upstream: Upstream) -> None:
    """The trailer bound counts bytes read while a chunk header waits for its data: a read holding a chunk's data
    and the next chunk's header is body, however large (it was refused 431 as trailers)."""
    async with running_proxy(
        [route("chunks", upstream.address)], max_header_bytes=1024, max_request_line_bytes=1024
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n")
        for piece in (b"a" * 4096 + b"\r\n1000\r\n", b"b" * 4096 + b"\r\n0\r\n\r\n"):
            # Each in its own read: the chunk header before it has had no data yet.
            await until(lambda: server.routes["default/chunks"].counts.inflight == 1)
            await asyncio.sleep(0.05)
            writer.write(piece)
        response = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert (response.status, response.body) == (200, b"a" * 4096 + b"b" * 4096)


async def test_a_pipelined_body_cut_by_the_limit_gets_the_refusal_in_its_place(upstream: Upstream) -> None:
    async with running_proxy([route("cut", upstream.address)], max_pipelined_bytes=64 * 1024) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = b"b" * 200_000
        # In three writes: the POST's head is parsed while the first request is served, its body is cut.
        writer.write(get("/slow?s=0.3"))
        await asyncio.sleep(0.05)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body))
        await asyncio.sleep(0.05)
        writer.write(body)
        responses = Responses(reader)
        first, second = await responses.next(), await responses.next()
        writer.close()
        assert (first.status, second.status) == (200, 503)
        assert b"proxy.max_pipelined_bytes" in second.body
        assert [seen.path for seen in upstream.requests] == ["/slow?s=0.3"]


async def test_an_endless_response_head_is_502_not_buffered() -> None:
    endless = b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (512 * 1024)
    stand_in = await H11Upstream(reply=lambda _r: endless).start()
    try:
        async with running_proxy([route("endless", stand_in.address)]) as server:
            response = await request(server.port, get(), within=5)
            assert response.status == 502
            assert b"limits.max_response_head_bytes" in response.body
            assert server.routes["default/endless"].counts.inflight == 0
    finally:
        await stand_in.stop()


async def test_a_malformed_pipelined_request_is_400_after_the_answer_before_it(upstream: Upstream) -> None:
    async with running_proxy([route("bad", upstream.address)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        good = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        bad = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
        writer.write(good + bad)
        responses = Responses(reader)
        first, second = await responses.next(), await responses.next()
        writer.close()
        assert (first.status, first.body, second.status) == (200, b"hello", 400)
        assert [seen.body for seen in upstream.requests] == [b"hello"]
