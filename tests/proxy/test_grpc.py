"""gRPC through the proxy to h2c upstreams, with a real grpcio client and server: every kind of call is held through
a cold start and reaches the server exactly once; the hold's limits answer with a gRPC status a gRPC client
understands; the server's statuses and metadata are relayed both ways. And the two protocols crossed: an HTTP/1.1
client to an h2c upstream, an HTTP/2 client (curl) to an HTTP/1.1 upstream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from tests.fixtures.grpc_echo import EchoClient, EchoServer, echo_client, messages, method_path
from tests.fixtures.h2_peers import H2Upstream, grpc_message, grpc_request, h2_request
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import Responses, get, post, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream

# Every call's own deadline: long enough for any hold in these tests, short enough that a lost call fails the test
# instead of hanging it.
DEADLINE = 10.0
UNARY_CALLS = 20
CALLS = 16  # through a server that takes two at once


def h2c_route(name: str, address: str, **overrides: Any) -> dict[str, Any]:
    return route(name, address, upstream={"address": address, "protocol": "h2c"}, **overrides)


@dataclass
class EveryKind:
    """One call of each kind (and many unary ones) on one channel: all streams of one HTTP/2 connection."""

    unary: list[grpc.aio.UnaryUnaryCall[bytes, bytes]]
    server_stream: grpc.aio.UnaryStreamCall[bytes, bytes]
    client_stream: grpc.aio.StreamUnaryCall[bytes, bytes]
    bidi: grpc.aio.StreamStreamCall[bytes, bytes]

    streams = UNARY_CALLS + 3

    @classmethod
    async def start(cls, client: EchoClient) -> EveryKind:
        calls = cls(
            [client.unary(b"unary-%d" % index, timeout=DEADLINE) for index in range(UNARY_CALLS)],
            client.server_stream(b"down", timeout=DEADLINE, metadata=[("x-repeat", "5")]),
            client.client_stream(messages(b"a", b"b", b"c"), timeout=DEADLINE),
            client.bidi(None, timeout=DEADLINE),
        )
        await calls.bidi.write(b"first")
        return calls

    async def check(self, server: EchoServer) -> None:
        """Every call answered as the server answers it, each having reached the server once."""
        assert await self.bidi.read() == b"first"
        # A message written after the first answer is relayed at once: the stream is live both ways, not buffered
        # until its end.
        await self.bidi.write(b"second")
        assert await self.bidi.read() == b"second"
        await self.bidi.done_writing()
        assert await self.bidi.read() is grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs lack it
        assert await asyncio.gather(*self.unary) == [b"unary-%d" % index for index in range(UNARY_CALLS)]
        assert [message async for message in self.server_stream] == [b"down-%d" % index for index in range(5)]
        assert await self.client_stream == b"a|b|c"
        assert server.calls == {"Unary": UNARY_CALLS, "ServerStream": 1, "ClientStream": 1, "Bidi": 1}


async def test_every_kind_of_call_is_held_through_a_cold_start_and_reaches_the_server_once() -> None:
    port = refused_port()
    async with running_proxy([h2c_route("g", f"127.0.0.1:{port}")]) as proxy, echo_client(proxy.port) as client:
        counts = proxy.routes["default/g"].counts
        calls = await EveryKind.start(client)
        # Each stream is a held request in the pending counts (what the HPA scales on), all on one connection.
        await until(lambda: counts.held == EveryKind.streams)
        server = await EchoServer(port).start()
        try:
            await calls.check(server)
        finally:
            await server.stop()
        await until(lambda: (counts.held, counts.inflight) == (0, 0))


async def test_every_kind_of_call_to_a_warm_server() -> None:
    server = await EchoServer().start()
    try:
        async with running_proxy([h2c_route("g", server.address)]) as proxy, echo_client(proxy.port) as client:
            await (await EveryKind.start(client)).check(server)
            counts = proxy.routes["default/g"].counts
            await until(lambda: (counts.held, counts.inflight) == (0, 0))
    finally:
        await server.stop()


async def test_calls_over_the_endpoint_concurrency_wait_and_take_each_freed_stream_at_once() -> None:
    server = await EchoServer().start()
    try:
        routes = [h2c_route("g", server.address, limits={"endpoint_concurrency": 2})]
        async with running_proxy(routes) as proxy, echo_client(proxy.port) as client:
            sleepy = [("x-sleep", "0.05")]
            calls = [client.unary(b"%d" % index, timeout=DEADLINE, metadata=sleepy) for index in range(CALLS)]
            # Streams end and new ones go out while handling the same read from the upstream.
            assert await asyncio.gather(*calls) == [b"%d" % index for index in range(CALLS)]
        assert server.calls == {"Unary": CALLS}
        assert server.peak == 2
    finally:
        await server.stop()


async def test_the_servers_max_concurrent_streams_bounds_the_calls_sent_to_it() -> None:
    # The route allows more (endpoint_concurrency 100): the server's SETTINGS are the endpoint's concurrency. Many
    # calls: grpc's server refuses a stream for a moment after the one before ended (REFUSED_STREAM), and each
    # such stream must be sent again, never answered as lost.
    port = refused_port()
    async with running_proxy([h2c_route("g", f"127.0.0.1:{port}")]) as proxy, echo_client(proxy.port) as client:
        calls = [
            client.unary(b"%d" % index, timeout=DEADLINE, metadata=[("x-sleep", "0.05")]) for index in range(CALLS)
        ]
        await until(lambda: proxy.routes["default/g"].counts.held == CALLS)
        server = await EchoServer(port, max_concurrent_streams=2).start()
        try:
            assert await asyncio.gather(*calls) == [b"%d" % index for index in range(CALLS)]
        finally:
            await server.stop()
        assert server.calls == {"Unary": CALLS}
        assert server.peak == 2


async def test_a_call_cancelled_while_held_is_removed_and_never_reaches_the_server() -> None:
    port = refused_port()
    async with running_proxy([h2c_route("g", f"127.0.0.1:{port}")]) as proxy, echo_client(proxy.port) as client:
        counts = proxy.routes["default/g"].counts
        gone = client.unary(b"gone", timeout=DEADLINE)
        await until(lambda: counts.held == 1)
        gone.cancel()  # RST_STREAM(CANCEL): the connection stays, the stream goes
        await until(lambda: counts.held == 0)
        server = await EchoServer(port).start()
        try:
            assert await client.unary(b"stayed", timeout=DEADLINE) == b"stayed"
        finally:
            await server.stop()
        assert server.calls == {"Unary": 1}


async def test_hold_limit_reached_is_unavailable_naming_max_held_requests() -> None:
    routes = [h2c_route("g", f"127.0.0.1:{refused_port()}", limits={"max_held_requests": 2})]
    async with running_proxy(routes) as proxy, echo_client(proxy.port) as client:
        held = [client.unary(b"held", timeout=DEADLINE) for _ in range(2)]
        await until(lambda: proxy.routes["default/g"].counts.held == 2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.unary(b"one too many", timeout=DEADLINE)
        # An HTTP 503 would also reach the client as UNAVAILABLE, with grpcio's own words: the details tell the
        # proxy's gRPC answer from it.
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "max_held_requests" in str(refused.value.details())
        assert proxy.routes["default/g"].counts.held == 2  # the held calls are still held
        for call in held:
            call.cancel()


async def test_hold_timeout_is_deadline_exceeded_naming_hold_timeout() -> None:
    routes = [h2c_route("g", f"127.0.0.1:{refused_port()}", limits={"hold_timeout": 0.3})]
    async with running_proxy(routes) as proxy, echo_client(proxy.port) as client:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await client.unary(b"waits", timeout=DEADLINE)
        waited = time.monotonic() - started
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "hold_timeout" in str(expired.value.details())
        assert 0.25 <= waited < 5
        await until(lambda: proxy.routes["default/g"].counts.held == 0)


async def test_a_calls_own_grpc_timeout_bounds_its_hold_with_a_trailers_only_answer() -> None:
    # A raw HTTP/2 client: a grpcio client enforces its deadline itself (it would cancel the stream at the same
    # moment), so only a client that sends `grpc-timeout` and waits shows that the proxy honours it.
    async with running_proxy([h2c_route("g", f"127.0.0.1:{refused_port()}")]) as proxy:
        headers = grpc_request(proxy.port, method_path("Unary"), ("grpc-timeout", "300m"))
        started = time.monotonic()
        response = await h2_request(proxy.port, headers, grpc_message(b"waits"))
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5  # the call's 300 ms, not the route's 10 s hold_timeout (5 s: a stall's margin)
        # Trailers-only (one HEADERS frame ending the stream), as gRPC answers a call it will not serve.
        assert (response.body, response.trailers) == (b"", [])
        assert response.header(":status") == "200"
        assert response.header("content-type") == "application/grpc"
        assert response.header("grpc-status") == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        assert response.header("grpc-message")
        await until(lambda: proxy.routes["default/g"].counts.held == 0)


async def test_a_held_call_whose_messages_outgrow_the_held_body_limit_is_refused_naming_it() -> None:
    port = refused_port()
    routes = [h2c_route("g", f"127.0.0.1:{port}", limits={"max_held_body_bytes": 1000})]
    async with running_proxy(routes) as proxy, echo_client(proxy.port) as client:
        counts = proxy.routes["default/g"].counts
        big = client.client_stream(messages(*[b"x" * 600] * 3), timeout=DEADLINE)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await big
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_held_body_bytes" in str(refused.value.details())
        await until(lambda: (counts.held, counts.held_bytes) == (0, 0))
        server = await EchoServer(port).start()
        try:
            assert await client.client_stream(messages(b"small"), timeout=DEADLINE) == b"small"
        finally:
            await server.stop()
        assert server.calls == {"ClientStream": 1}


async def test_a_plain_http2_request_gets_the_proxys_http_answer_not_a_grpc_status() -> None:
    routes = [route("web", f"127.0.0.1:{refused_port()}", limits={"hold_timeout": 0.3})]
    async with running_proxy(routes) as proxy:
        headers = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "app.example")]
        response = await h2_request(proxy.port, headers)
    assert response.header(":status") == "504"
    assert response.header("grpc-status") is None
    assert response.body == b"the workload did not become ready in 0.3 s (limits.hold_timeout)\n"


async def test_a_call_held_when_the_proxy_drains_is_forwarded_within_the_grace_period() -> None:
    port = refused_port()
    async with running_proxy([h2c_route("g", f"127.0.0.1:{port}")]) as proxy, echo_client(proxy.port) as client:
        call = client.unary(b"held through the drain", timeout=DEADLINE)
        await until(lambda: proxy.routes["default/g"].counts.held == 1)
        draining = asyncio.create_task(proxy.shutdown(grace=DEADLINE))
        await until(lambda: proxy.data.draining)  # listeners closed, GOAWAY sent (stop_delay is 0)
        server = await EchoServer(port).start()
        try:
            assert await call == b"held through the drain"
            await asyncio.wait_for(draining, DEADLINE)  # drained: nothing was left to cut off
        finally:
            await server.stop()
        assert server.calls == {"Unary": 1}


async def test_a_call_still_held_when_the_grace_period_ends_is_unavailable() -> None:
    async with (
        running_proxy([h2c_route("g", f"127.0.0.1:{refused_port()}")]) as proxy,
        echo_client(proxy.port) as client,
    ):
        call = client.unary(b"held past the grace period", timeout=DEADLINE)
        await until(lambda: proxy.routes["default/g"].counts.held == 1)
        await proxy.shutdown(grace=0.3)
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await call
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in str(cut.value.details())


async def test_the_servers_status_details_and_trailing_metadata_are_relayed() -> None:
    server = await EchoServer().start()
    try:
        async with running_proxy([h2c_route("g", server.address)]) as proxy, echo_client(proxy.port) as client:
            # Trailers-only from the server (no message before the status).
            failing = [("x-fail-code", "NOT_FOUND"), ("x-fail-details", "no such echo")]
            call = client.unary(b"missing", timeout=DEADLINE, metadata=failing)
            with pytest.raises(grpc.aio.AioRpcError) as not_found:
                await call
            assert not_found.value.code() == grpc.StatusCode.NOT_FOUND
            assert not_found.value.details() == "no such echo"
            assert (await call.trailing_metadata()).get("x-method") == "Unary"
            # The status in trailers after messages.
            bidi = client.bidi(messages(b"1", b"2"), timeout=DEADLINE, metadata=[("x-fail-code", "ABORTED")])
            assert [await bidi.read(), await bidi.read()] == [b"1", b"2"]
            with pytest.raises(grpc.aio.AioRpcError) as aborted:
                await bidi.read()
            assert aborted.value.code() == grpc.StatusCode.ABORTED
        assert server.calls == {"Unary": 1, "Bidi": 1}
    finally:
        await server.stop()


async def test_initial_and_trailing_metadata_are_relayed_both_ways() -> None:
    server = await EchoServer().start()
    try:
        async with running_proxy([h2c_route("g", server.address)]) as proxy, echo_client(proxy.port) as client:
            call = client.unary(b"hello", timeout=DEADLINE, metadata=[("x-tenant", "blue"), ("x-trace", "t-1")])
            assert await call == b"hello"
            initial, trailing = await call.initial_metadata(), await call.trailing_metadata()
            # The server saw the request's metadata (it sends it back) and its answer's came through.
            assert (initial.get("x-seen-x-tenant"), initial.get("x-seen-x-trace")) == ("blue", "t-1")
            assert trailing.get("x-method") == "Unary"
    finally:
        await server.stop()


async def test_http1_client_to_an_h2c_upstream() -> None:
    upstream = await H2Upstream().start()
    try:
        async with running_proxy([h2c_route("web", upstream.address)]) as proxy:
            posted = await request(proxy.port, post(b"hello h2c", "/echo?posted=1"))
            fetched = await request(proxy.port, get("/echo?fetched=1"))
        assert (posted.status, posted.body, posted.headers["x-seen-path"]) == (200, b"hello h2c", "/echo?posted=1")
        assert (fetched.status, fetched.body, fetched.headers["x-seen-method"]) == (200, b"", "GET")
        assert [(seen.header(":method"), seen.body) for seen in upstream.requests] == [
            ("POST", b"hello h2c"),
            ("GET", b""),
        ]
    finally:
        await upstream.stop()


async def test_an_h2c_upstream_ending_its_response_with_an_empty_data_frame() -> None:
    upstream = await H2Upstream().start()
    try:
        async with running_proxy([h2c_route("web", upstream.address)]) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            responses = Responses(reader)
            try:
                writer.write(post(b"ends apart", "/echo?empty_end=1"))
                first = await responses.next()
                writer.write(get("/echo?empty_end=1"))
                second = await responses.next()
            finally:
                writer.close()
        # Whole (its length), and the connections on both sides still good for the next request.
        assert (first.status, first.body, second.status) == (200, b"ends apart", 200)
        assert [seen.header(":path") for seen in upstream.requests] == ["/echo?empty_end=1"] * 2
        assert len(upstream.open) <= 1
    finally:
        await upstream.stop()


async def test_http2_client_to_an_http1_upstream(upstream: Upstream) -> None:
    async with running_proxy([route("web", upstream.address)]) as proxy:
        authority = f"127.0.0.1:{proxy.port}"
        curl = await asyncio.create_subprocess_exec(
            *("curl", "--http2-prior-knowledge", "--silent", "--show-error", "--max-time", "10"),
            *("--data-binary", "hello h1", "--write-out", "\n%{http_code} %{http_version}"),
            f"http://{authority}/echo?q=1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(curl.communicate(), 15)
    assert curl.returncode == 0, err
    body, _, status = out.rpartition(b"\n")
    assert status == b"200 2"  # answered over HTTP/2
    assert body == b"hello h1"
    assert [(seen.method, seen.path, seen.body) for seen in upstream.requests] == [("POST", "/echo?q=1", b"hello h1")]
    assert upstream.requests[0].headers["host"] == authority  # :authority becomes Host


async def test_a_sidecar_in_front_of_a_grpc_server_holds_and_forwards_its_calls() -> None:
    port = refused_port()
    async with (
        running_proxy([], sidecar={"upstream": f"127.0.0.1:{port}", "protocol": "h2c"}) as proxy,
        echo_client(proxy.port) as client,
    ):
        (route,) = proxy.routes.values()
        calls = [client.unary(b"%d" % index, timeout=DEADLINE) for index in range(3)]
        await until(lambda: route.counts.held == 3)
        server = await EchoServer(port).start()
        try:
            assert await asyncio.gather(*calls) == [b"0", b"1", b"2"]
        finally:
            await server.stop()
        assert server.calls == {"Unary": 3}


async def test_a_stream_begun_before_the_servers_graceful_goaway_finishes_through_it() -> None:
    """A pod stopping gracefully says GOAWAY and lets its calls finish: so does the proxy, for the streams it
    relays (h2 alone would close the connection's state on the GOAWAY and break them)."""
    server = await EchoServer().start()
    try:
        async with running_proxy([h2c_route("g", server.address)]) as proxy, echo_client(proxy.port) as client:
            outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[bytes]:
                while (message := await outgoing.get()) is not None:
                    yield message

            call = client.bidi(requests(), timeout=DEADLINE)
            for index in range(3):
                await outgoing.put(b"before-%d" % index)
                assert await call.read() == b"before-%d" % index
            stopping = asyncio.create_task(server.stop(grace=DEADLINE))
            # The GOAWAY came: the connection takes no new stream (it left the pool), the begun one goes on.
            await until(lambda: not proxy.routes["default/g"].endpoints[0].pool)
            for index in range(3):
                await outgoing.put(b"after-%d" % index)
                assert await call.read() == b"after-%d" % index
            await outgoing.put(None)
            assert await call.code() == grpc.StatusCode.OK
            await stopping
    finally:
        await server.stop()


async def test_request_trailers_reach_an_h2c_upstream() -> None:
    upstream = await H2Upstream().start()
    try:
        async with running_proxy([h2c_route("h2", upstream.address)]) as proxy:
            head = [(":method", "POST"), (":scheme", "http"), (":authority", "app.example"), (":path", "/t")]
            response = await h2_request(proxy.port, head, b"body", trailers=[("x-checksum", "abc")])
        assert response.header(":status") == "200"
        (seen,) = upstream.requests
        assert (seen.body, seen.trailers) == (b"body", [("x-checksum", "abc")])
    finally:
        await upstream.stop()


async def test_h2load_through_the_proxy_sees_every_request_answered() -> None:
    """A real HTTP/2 load generator (nghttp2's h2load): many streams over few connections, each answered 200."""
    upstream = await H2Upstream().start()
    try:
        async with running_proxy([h2c_route("h2", upstream.address)]) as proxy:
            run = await asyncio.create_subprocess_exec(
                *("h2load", "-n", "300", "-c", "3", "-m", "10", f"http://127.0.0.1:{proxy.port}/load"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await asyncio.wait_for(run.communicate(), 60)
        report = out.decode()
        assert run.returncode == 0, report
        assert "300 succeeded, 0 failed, 0 errored, 0 timeout" in report, report
        assert "status codes: 300 2xx" in report, report
        assert len(upstream.requests) == 300
    finally:
        await upstream.stop()


async def test_an_upstream_that_answers_before_the_body_frees_its_stream_for_the_next_request() -> None:
    """An early answer (401 to an upload) ends the response while the request's side is open: the proxy resets that
    side, or the stream would count against the upstream's SETTINGS_MAX_CONCURRENT_STREAMS for good."""
    upstream = await H2Upstream(max_concurrent_streams=2).start()
    try:
        async with running_proxy([h2c_route("h2", upstream.address)]) as proxy:
            for _ in range(5):  # more than the upstream's 2 streams
                upload = b"POST /up?early=1 HTTP/1.1\r\nHost: app.example\r\nContent-Length: 100\r\n\r\nabc"
                assert (await request(proxy.port, upload)).status == 401
            assert (await request(proxy.port, get("/after"))).status == 200
            (connection,) = proxy.routes["default/h2"].endpoints[0].pool
            assert connection.h2.open_outbound_streams == 0
    finally:
        await upstream.stop()


async def test_an_upstream_allowing_no_stream_is_not_dialled_again_and_again() -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS 0: the request waits (its hold bound answers it), on the one connection."""
    upstream = await H2Upstream(max_concurrent_streams=0).start()
    try:
        routes = [h2c_route("h2", upstream.address, limits={"hold_timeout": 0.5})]
        async with running_proxy(routes) as proxy:
            response = await request(proxy.port, get("/none"))
        assert response.status == 504
        assert upstream.accepted <= 2  # the first dial (and the prober's), not one per loop turn
        assert upstream.requests == []
    finally:
        await upstream.stop()
