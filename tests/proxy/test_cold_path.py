"""Holding: requests wait while nothing is ready, then go out in order, each exactly once, or get a clear error."""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import REGISTRY

from adapter.proxy.app import Proxy
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, post, read_response, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream


def errors(route_name: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "zeroscale_proxy_error_responses_total", {"route": f"default/{route_name}" if route_name else "", "code": code}
    )
    return value or 0.0


def limit_hits(route_name: str, limit: str) -> float:
    value = REGISTRY.get_sample_value(
        "zeroscale_proxy_limit_hits_total", {"route": f"default/{route_name}", "limit": limit}
    )
    return value or 0.0


async def test_thousand_held_requests_each_answered_once_with_its_own_body() -> None:
    port = refused_port()
    async with running_proxy([route("cold1k", f"127.0.0.1:{port}")], max_connections=5000) as server:
        counts = server.routes["default/cold1k"].counts
        connections = []
        for index in range(1000):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(post(b"request-%04d" % index, extra=f"X-Id: {index}\r\n"))
            connections.append((reader, writer))
        await until(lambda: counts.held == 1000)
        upstream = await Upstream(port).start()
        try:
            responses = await asyncio.gather(*(read_response(reader) for reader, _ in connections))
        finally:
            for _, writer in connections:
                writer.close()
            await upstream.stop()
        for index, response in enumerate(responses):
            assert response.status == 200
            assert response.body == b"request-%04d" % index
            assert response.headers["x-zeroscale-cold-start"] == "true"
            assert float(response.headers["x-zeroscale-hold-seconds"]) > 0
        ids = sorted(int(seen.headers["x-id"]) for seen in upstream.requests)
        assert ids == list(range(1000))  # each exactly once
        assert counts.held == 0
        assert counts.inflight == 0


async def test_held_requests_go_out_in_arrival_order() -> None:
    port = refused_port()
    routes = [route("ordered", f"127.0.0.1:{port}", limits={"endpoint_concurrency": 1})]
    async with running_proxy(routes) as server:
        counts = server.routes["default/ordered"].counts
        pending = []
        for index in range(30):
            pending.append(asyncio.create_task(request(server.port, get(f"/echo?n={index}"))))
            await until(lambda: counts.held == len(pending))
        upstream = await Upstream(port).start()
        try:
            await asyncio.gather(*pending)
        finally:
            await upstream.stop()
        assert [seen.path for seen in upstream.requests] == [f"/echo?n={index}" for index in range(30)]


async def test_counts_are_published_on_every_change() -> None:
    port = refused_port()
    async with running_proxy([route("counted", f"127.0.0.1:{port}")]) as server:
        seen: list[tuple[int, int]] = []
        server.routes["default/counted"].counts.subscribe(lambda _route, held, inflight: seen.append((held, inflight)))
        task = asyncio.create_task(request(server.port, get("/slow?s=0.1")))
        await until(lambda: (1, 0) in seen)
        upstream = await Upstream(port).start()
        try:
            assert (await task).status == 200
        finally:
            await upstream.stop()
        assert seen[0] == (0, 0)
        assert (1, 0) in seen
        assert (0, 1) in seen
        assert seen[-1] == (0, 0)


async def test_hold_timeout_answers_504_naming_the_wait() -> None:
    routes = [route("sleepy", f"127.0.0.1:{refused_port()}", limits={"hold_timeout": 0.3})]
    async with running_proxy(routes) as server:
        before = errors("sleepy", "504")
        response = await request(server.port, get())
        assert response.status == 504
        assert response.body == b"the workload did not become ready in 0.3 s (limits.hold_timeout)\n"
        assert errors("sleepy", "504") == before + 1
        assert server.routes["default/sleepy"].counts.held == 0


async def test_over_capacity_is_503_with_retry_after() -> None:
    routes = [route("small", f"127.0.0.1:{refused_port()}", limits={"max_held_requests": 2, "retry_after": 7})]
    async with running_proxy(routes) as server:
        held = [asyncio.create_task(request(server.port, get())) for _ in range(2)]
        await until(lambda: server.routes["default/small"].counts.held == 2)
        hits = limit_hits("small", "max_held_requests")
        response = await request(server.port, get())
        assert response.status == 503
        assert response.headers["retry-after"] == "7"
        assert limit_hits("small", "max_held_requests") == hits + 1  # what the hold-limit alert reads
        for task in held:
            task.cancel()


async def test_held_body_over_the_limit_is_413_and_route_bytes_over_the_bound_503() -> None:
    routes = [
        route("bodies", f"127.0.0.1:{refused_port()}", limits={"max_held_body_bytes": 1000, "max_held_bytes": 1500})
    ]
    async with running_proxy(routes) as server:
        assert (await request(server.port, post(b"x" * 1001))).status == 413
        first = asyncio.create_task(request(server.port, post(b"y" * 900)))
        await until(lambda: server.routes["default/bodies"].counts.held_bytes == 900)
        response = await request(server.port, post(b"z" * 900))
        assert response.status == 503
        assert "retry-after" in response.headers
        first.cancel()
        expect = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
        # Refused before the body is sent: the client need not upload what cannot be held.
        assert (await request(server.port, expect)).status == 413


async def test_client_that_disconnects_while_held_is_removed_and_counted() -> None:
    port = refused_port()
    async with running_proxy([route("quitter", f"127.0.0.1:{port}")]) as server:
        counts = server.routes["default/quitter"].counts
        before = errors("quitter", "499")
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/echo?gone"))
        await until(lambda: counts.held == 1)
        writer.close()
        await until(lambda: counts.held == 0)
        assert errors("quitter", "499") == before + 1
        upstream = await Upstream(port).start()
        try:
            assert (await request(server.port, get("/echo?stayed"))).status == 200
        finally:
            await upstream.stop()
        assert [seen.path for seen in upstream.requests] == ["/echo?stayed"]


async def test_slow_upstream_is_504_after_the_response_timeout(upstream: Upstream) -> None:
    routes = [route("slow", upstream.address, limits={"response_timeout": 0.3})]
    async with running_proxy(routes) as server:
        response = await request(server.port, get("/slow?s=3"))
        assert response.status == 504
        assert response.body == b"the upstream did not answer in 0.3 s (limits.response_timeout)\n"
        # The timed-out connection is not reused: the next request is answered normally.
        assert (await request(server.port, get())).status == 200


async def test_upstream_crash_mid_response_cuts_the_client_off_and_counts_502(proxy: Proxy) -> None:
    before = errors("app", "502")
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(post(b"", "/crash"))
    data = b""
    while chunk := await asyncio.wait_for(reader.read(65536), 5):
        data += chunk
    writer.close()
    # The head and the bytes that came were forwarded; the body is short of its Content-Length.
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert data.endswith(b"partial")
    assert errors("app", "502") == before + 1


async def test_upstream_closing_before_answering_is_502(upstream: Upstream) -> None:
    crasher = await asyncio.start_server(lambda r, w: w.transport.abort(), "127.0.0.1", 0)
    address = f"127.0.0.1:{crasher.sockets[0].getsockname()[1]}"
    try:
        async with running_proxy([route("crashy", address)]) as server:
            response = await request(server.port, post(b"once"))
            assert response.status == 502
            assert b"closed the connection" in response.body
    finally:
        crasher.close()


async def test_stale_keep_alive_connection_is_retried_for_idempotent_requests(proxy: Proxy, upstream: Upstream) -> None:
    assert (await request(proxy.port, get("/echo?first"))).status == 200
    # The upstream drops its idle connections (as a server with a short keep-alive timeout does).
    for conn in list(upstream.open):
        conn.transport.close()
    await asyncio.sleep(0.05)
    response = await request(proxy.port, get("/echo?second"))
    assert response.status == 200
    assert response.headers["x-seen-path"] == "/echo?second"


async def test_burst_is_spread_over_endpoints_as_they_become_ready() -> None:
    first, second = await Upstream().start(), await Upstream().start()
    try:
        routes = [route("spread", first.address, limits={"endpoint_concurrency": 2})]
        async with running_proxy(routes) as server:
            app = server.routes["default/spread"]
            app.set_endpoints([])
            tasks = [asyncio.create_task(request(server.port, get("/slow?s=0.2"))) for _ in range(8)]
            await until(lambda: app.counts.held == 8)
            app.set_endpoints([("127.0.0.1", first.port)])
            await until(lambda: app.counts.inflight == 2)
            app.set_endpoints([("127.0.0.1", first.port), ("127.0.0.1", second.port)])
            responses = await asyncio.gather(*tasks)
        assert all(response.status == 200 for response in responses)
        # Never more than two at once on one endpoint: the second took its share when it came up.
        assert len(first.requests) + len(second.requests) == 8
        assert len(second.requests) >= 2
    finally:
        await first.stop()
        await second.stop()


async def test_websocket_through_a_cold_start() -> None:
    port = refused_port()
    async with running_proxy([route("ws", f"127.0.0.1:{port}")]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await until(lambda: server.routes["default/ws"].counts.held == 1)
        upstream = await Upstream(port).start()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 101")
            assert b"x-zeroscale-cold-start: true" in head.lower()
            assert upstream.requests[0].headers["upgrade"] == "websocket"
            for message in (b"\x81\x05hello", b"\x81\x05again"):
                writer.write(message)
                assert await asyncio.wait_for(reader.readexactly(len(message)), 5) == message
            # An open tunnel is not a pending request: it is counted apart, and only while open.
            assert server.routes["default/ws"].counts.inflight == 0
            assert server.routes["default/ws"].tunnels == 1
            writer.close()
            await until(lambda: server.routes["default/ws"].tunnels == 0)
        finally:
            await upstream.stop()


async def test_held_chunked_body_is_forwarded_once_with_its_terminator() -> None:
    port = refused_port()
    async with running_proxy([route("chunks", f"127.0.0.1:{port}")]) as server:
        raw = (
            b"PUT /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        pending = asyncio.create_task(request(server.port, raw))
        await until(lambda: server.routes["default/chunks"].counts.held == 1)
        assert server.routes["default/chunks"].counts.held_bytes > 0
        upstream = await Upstream(port).start()
        try:
            response = await pending
        finally:
            await upstream.stop()
        assert response.body == b"hello world"
        assert [seen.body for seen in upstream.requests] == [b"hello world"]
        assert upstream.received.count(b"0\r\n\r\n") == 1
        assert server.routes["default/chunks"].counts.held_bytes == 0


async def test_idempotent_chunked_request_is_resent_once_after_a_lost_connection() -> None:
    attempts: list[bytes] = []

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readuntil(b"0\r\n\r\n")
        with contextlib.suppress(TimeoutError):
            data += await asyncio.wait_for(reader.read(65536), 0.1)  # anything sent twice arrives now
        attempts.append(data)
        if len(attempts) == 1:
            writer.transport.abort()  # dies before answering
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server_socket = await asyncio.start_server(flaky, "127.0.0.1", 0)
    address = f"127.0.0.1:{server_socket.sockets[0].getsockname()[1]}"
    try:
        async with running_proxy([route("flaky", address)]) as server:
            raw = b"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            response = await request(server.port, raw)
    finally:
        server_socket.close()
    assert response.status == 200
    assert len(attempts) == 2
    assert attempts[0] == attempts[1]
    assert attempts[1].count(b"0\r\n\r\n") == 1


async def test_an_endpoint_that_refused_is_probed_back_into_use() -> None:
    good = await Upstream().start()
    late_port = refused_port()
    try:
        async with running_proxy([route("mixed", good.address)]) as server:
            app = server.routes["default/mixed"]
            app.set_endpoints([("127.0.0.1", late_port), ("127.0.0.1", good.port)])
            # Every request is answered (a refused connect moves it to the other endpoint).
            for index in range(6):
                assert (await request(server.port, get(f"/echo?n={index}"))).status == 200
            assert app.usable_count() == 1
            late = await Upstream(late_port).start()
            try:
                await until(lambda: app.usable_count() == 2, within=5)
                for index in range(10):
                    await request(server.port, get(f"/echo?again={index}"))
                assert late.requests  # back in rotation
            finally:
                await late.stop()
    finally:
        await good.stop()
