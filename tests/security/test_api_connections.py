"""Issue 12 items 2, 6 and 11, issue 20 item 4 (API server side): every phase of every connection of
`zeroscale serve` has a deadline, connections count from accept on both listeners, one request gets
one answer, and requests read ahead of their answers are bounded per connection."""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapter.api.http import HTTPServer, Limits, Request, Response
from adapter.api.listeners import MetricsPage
from adapter.telemetry import api as telemetry
from tests.fixtures.replicas import spawn
from tests.security.api_serving import Ports, api_limits, connect, read_all, run, serving

ROOT = Path(__file__).resolve().parents[2]
STALLED_POST = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
# A TLS record header announcing a 512-byte ClientHello that never comes.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def _gauge(listener: str) -> float:
    value: float = telemetry.CONNECTIONS.labels(listener)._value.get()
    return value


def _counter(metric: object, *labels: str) -> float:
    value: float = metric.labels(*labels)._value.get()  # type: ignore[attr-defined]
    return value


async def _healthz_served(port: int, tls: bool) -> None:
    reader, writer = await connect(port, tls)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await read_all(reader)).startswith(b"HTTP/1.1 200 OK\r\n")
    writer.close()


def _listeners(ports: Ports) -> list[tuple[int, bool]]:
    return [(ports.api, True), (ports.metrics, False)]


def test_a_stalled_body_is_408_and_closed_on_both_listeners() -> None:
    async def scenario() -> None:
        async with serving({"body_timeout": 0.5}) as ports:
            for port, tls in _listeners(ports):
                timeouts = _counter(telemetry.TIMEOUTS, "api" if tls else "metrics", "body")
                reader, writer = await connect(port, tls)
                writer.write(STALLED_POST)
                answer = await read_all(reader)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
                assert b"server.body_timeout" in answer
                assert _counter(telemetry.TIMEOUTS, "api" if tls else "metrics", "body") == timeouts + 1

    run(scenario())


def test_stalled_bodies_do_not_keep_a_valid_request_out() -> None:
    """The reported case: stalled POSTs fill the connection budget; the HPA's request is answered once they time out."""

    async def scenario() -> None:
        async with serving({"body_timeout": 1, "max_connections": 50}) as ports:
            stalled = []
            for _ in range(50):
                reader, writer = await connect(ports.api, tls=True)
                writer.write(STALLED_POST)
                stalled.append((reader, writer))
            answer = b""
            for _ in range(100):  # refused while the budget is full, answered once the stalled bodies time out
                try:
                    reader, writer = await connect(ports.api, tls=True)
                except (ConnectionError, ssl.SSLError):
                    await asyncio.sleep(0.1)
                    continue
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await read_all(reader)
                writer.close()
                if answer:
                    break
                await asyncio.sleep(0.1)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
            for reader, writer in stalled:
                assert (await read_all(reader)).startswith(b"HTTP/1.1 408 ")
                writer.close()

    run(scenario())


def test_connections_count_from_accept_and_handshakes_have_a_deadline(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serving({"max_connections": 4, "header_timeout": 1}) as ports:
            refused = _counter(telemetry.CONNECTIONS_REFUSED, "api")
            timeouts = _counter(telemetry.TIMEOUTS, "api", "handshake")
            held = []
            for _ in range(4):
                reader, writer = await asyncio.open_connection("127.0.0.1", ports.api)
                writer.write(PARTIAL_CLIENT_HELLO)
                held.append((reader, writer))
            await asyncio.sleep(0.2)
            assert _gauge("api") == 4  # counted before their handshakes finish
            reader, writer = await asyncio.open_connection("127.0.0.1", ports.api)
            assert await read_all(reader, 5) == b""  # the fifth is refused at once
            writer.close()
            assert _counter(telemetry.CONNECTIONS_REFUSED, "api") == refused + 1
            assert "api listener: 4 connections open, refusing more; raise server.max_connections" in caplog.text
            for reader, writer in held:  # and the four are closed at the handshake deadline
                assert await read_all(reader, 10) == b""
                writer.close()
            await asyncio.sleep(0.1)
            assert _gauge("api") == 0
            assert _counter(telemetry.TIMEOUTS, "api", "handshake") == timeouts + 4
            # A good client is served again.
            reader, writer = await connect(ports.api, tls=True)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await read_all(reader)).startswith(b"HTTP/1.1 200 OK\r\n")
            writer.close()

    run(scenario())


def test_the_metrics_port_has_its_own_connection_cap() -> None:
    async def scenario() -> None:
        async with serving({"metrics_max_connections": 2}) as ports:
            refused = _counter(telemetry.CONNECTIONS_REFUSED, "metrics")
            held = [await asyncio.open_connection("127.0.0.1", ports.metrics) for _ in range(2)]
            await asyncio.sleep(0.1)
            assert _gauge("metrics") == 2
            reader, writer = await asyncio.open_connection("127.0.0.1", ports.metrics)
            assert await read_all(reader, 5) == b""
            writer.close()
            assert _counter(telemetry.CONNECTIONS_REFUSED, "metrics") == refused + 1
            await _healthz_served(ports.api, tls=True)  # the API port does not share that budget
            for _, held_writer in held:
                held_writer.close()

    run(scenario())


def test_an_upgrade_request_gets_exactly_one_answer() -> None:
    async def scenario() -> None:
        async with serving({}) as ports:
            for port, tls in _listeners(ports):
                reader, writer = await connect(port, tls)
                writer.write(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                    b"\x81\x85not-http-any-more"
                )
                answer = await read_all(reader)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
                assert answer.count(b"HTTP/1.1 ") == 1, answer

    run(scenario())


@contextlib.asynccontextmanager
async def _held_server(limits: Limits) -> AsyncIterator[tuple[int, HTTPServer, asyncio.Event, list[str]]]:
    """A server whose first request waits for `release`; answers echo the request target."""
    release = asyncio.Event()
    seen: list[str] = []

    async def handler(request: Request) -> Response:
        seen.append(request.target)
        if len(seen) == 1:
            await release.wait()
        return Response(200, request.target.encode(), "text/plain")

    server = HTTPServer(handler, limits, "api")
    port = await server.start("127.0.0.1", 0, None)
    try:
        yield port, server, release, seen
    finally:
        await server.stop()


def test_requests_read_ahead_of_their_answers_are_bounded_and_all_answered() -> None:
    limits = api_limits(
        max_header_bytes=4096, max_connections=8, header_timeout=5, idle_timeout=5, max_buffered_bytes=4096
    )

    async def scenario() -> None:
        async with _held_server(limits) as (port, server, release, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            count = 3000
            writer.write(b"".join(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(count)))
            await asyncio.sleep(0.5)
            (connection,) = server._connections
            # Parsed ahead of the held answer: the bound and at most one more parser step (1 KiB), not the burst.
            assert len(connection._pending) <= 16 + 1024 // len(b"GET /0 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert connection._pending_bytes <= limits.max_buffered_bytes + 1024
            release.set()
            received = b""
            while received.count(b"HTTP/1.1 200") < count:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
                assert chunk
                received += chunk
            bodies = re.findall(rb"\r\n\r\n(/\d+)", received)
            assert bodies == [f"/{i}".encode() for i in range(count)]  # every request answered, in order
            writer.close()

    run(scenario())


def test_an_answer_that_never_comes_closes_the_connection() -> None:
    limits = api_limits(
        max_header_bytes=4096, max_connections=8, header_timeout=5, idle_timeout=5, response_timeout=0.5
    )

    async def scenario() -> None:
        async with _held_server(limits) as (port, _, _, _):
            timeouts = _counter(telemetry.TIMEOUTS, "api", "response")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await read_all(reader, 5) == b""
            writer.close()
            assert _counter(telemetry.TIMEOUTS, "api", "response") == timeouts + 1

    run(scenario())


def test_header_values_lose_surrounding_whitespace() -> None:
    limits = api_limits(header_timeout=5, idle_timeout=5)

    async def scenario() -> None:
        values: list[str | None] = []

        async def handler(request: Request) -> Response:
            values.append(request.header("x-remote-user"))
            return Response(200, b"")

        server = HTTPServer(handler, limits, "api")
        port = await server.start("127.0.0.1", 0, None)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Remote-User: \t hpa \t \r\nConnection: close\r\n\r\n")
        assert (await read_all(reader)).startswith(b"HTTP/1.1 200")
        writer.close()
        await server.stop()
        assert values == ["hpa"]

    run(scenario())


def test_a_body_larger_than_allowed_is_413_naming_the_key() -> None:
    async def scenario() -> None:
        async with serving({"max_body_bytes": 16}) as ports:
            reader, writer = await connect(ports.metrics, tls=False)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\n" + b"x" * 17)
            answer = await read_all(reader)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 413 "), answer
            assert b"server.max_body_bytes" in answer

    run(scenario())


def test_serve_raises_the_open_files_limit_to_the_hard_limit_and_logs_it(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip("needs a finite hard open-files limit above 256")
    low = 256

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    env = {"ZEROSCALE_SERVER__PORT": "0", "ZEROSCALE_SERVER__METRICS_PORT": "0"}
    config = ROOT / "deploy" / "local" / "zeroscale.yaml"
    adapter = spawn("adapter", "serve", tmp_path, "--config", str(config), env=env, preexec_fn=lower, log_level="INFO")
    try:
        adapter.wait_ready(30)
        limits = Path(f"/proc/{adapter.process.pid}/limits").read_text()
        (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == [str(hard), str(hard)]  # soft raised from 256 to the hard limit
    finally:
        adapter.stop()
    output = adapter.log.read_text()
    assert f"open files limit: {hard} (hard limit {hard})" in output, output


def test_an_error_behind_a_request_in_progress_is_answered_after_it_in_order() -> None:
    limits = api_limits(max_header_bytes=1024, max_connections=8, header_timeout=5, idle_timeout=5)

    async def scenario() -> None:
        async with _held_server(limits) as (port, _, release, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nX-Big: " + b"a" * 2048 + b"\r\n\r\n"
            )
            await asyncio.sleep(0.2)
            release.set()
            answer = await read_all(reader)
            writer.close()
            first, _, rest = answer.partition(b"/first")
            assert first.startswith(b"HTTP/1.1 200 OK\r\n"), answer  # the request in progress is answered first
            assert rest.startswith(b"HTTP/1.1 431 "), answer
            assert answer.count(b"HTTP/1.1 ") == 2

    run(scenario())


def test_a_header_line_that_never_ends_is_431_once_it_passes_the_bound() -> None:
    """httptools gathers a header value silently until its line ends: without a bound on the raw bytes,
    one connection could buffer whatever it sent within header_timeout."""
    limits = api_limits(header_timeout=30, idle_timeout=30)

    async def scenario() -> None:
        async with _held_server(limits) as (port, _, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nX-Endless: " + b"a" * 200_000)
            answer = await read_all(reader, 10)  # well before header_timeout
            writer.close()
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
            assert b"server.max_header_bytes" in answer

    run(scenario())


async def _connections_closed(server: HTTPServer) -> None:
    for _ in range(200):
        if not server._connections:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the server still holds the connection")


def test_a_client_that_does_not_read_its_answer_is_closed_at_the_response_deadline() -> None:
    limits = api_limits(
        max_header_bytes=4096, max_connections=8, header_timeout=30, idle_timeout=30, response_timeout=0.5
    )
    body = b"x" * 32_000_000  # more than the socket buffers hold

    async def scenario() -> None:
        async def handler(request: Request) -> Response:
            return Response(200, body, "text/plain")

        for closing in (False, True):  # kept alive, and Connection: close (whose close waits for the flush)
            server = HTTPServer(handler, limits, "api")
            port = await server.start("127.0.0.1", 0, None)
            timeouts = _counter(telemetry.TIMEOUTS, "api", "response")
            _, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
            header = b"Connection: close\r\n" if closing else b""
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n")
            await _connections_closed(server)  # without reading a byte
            assert _counter(telemetry.TIMEOUTS, "api", "response") == timeouts + 1
            writer.close()
            await server.stop()

    run(scenario())


def test_a_connection_that_never_sends_a_request_is_closed_at_the_head_deadline() -> None:
    """Silent connections (after the TLS handshake, or on the plain port) had idle_timeout, not header_timeout."""

    async def scenario() -> None:
        async with serving({"header_timeout": 1, "idle_timeout": 60}) as ports:
            for port, tls in _listeners(ports):
                timeouts = _counter(telemetry.TIMEOUTS, "api" if tls else "metrics", "head")
                reader, writer = await connect(port, tls)
                assert await read_all(reader, 10) == b""
                writer.close()
                assert _counter(telemetry.TIMEOUTS, "api" if tls else "metrics", "head") == timeouts + 1

    run(scenario())


@pytest.mark.parametrize("listener", ["api", "metrics"])
def test_one_source_cannot_take_every_connection(listener: str, caplog: pytest.LogCaptureFixture) -> None:
    """Before: one address could hold the whole budget, and the kubelet's probes, the aggregator and
    Prometheus were refused; now each source address gets at most its share, on both listeners."""
    prefix = "metrics_" if listener == "metrics" else ""
    key = f"server.{prefix}max_connections_per_source"

    async def scenario() -> None:
        settings = {f"{prefix}max_connections": 8, f"{prefix}max_connections_per_source": 3}
        async with serving(settings) as ports:
            port, tls = (ports.api, True) if listener == "api" else (ports.metrics, False)
            refused = _counter(telemetry.CONNECTIONS_REFUSED, listener)
            held = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)) for _ in range(3)]
            await asyncio.sleep(0.2)
            assert _gauge(listener) == 3
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            assert await read_all(reader, 5) == b""  # the fourth from that source is refused at once
            writer.close()
            assert _counter(telemetry.CONNECTIONS_REFUSED, listener) == refused + 1
            assert f"3 connections open from 127.0.0.2, refusing more; raise {key}" in caplog.text
            await _healthz_served(port, tls)  # another source is served while the first holds its share
            for _, held_writer in held:
                held_writer.close()

    run(scenario())


def test_a_client_that_does_not_read_gets_no_more_answers_made_for_it() -> None:
    """Before: answers that complete at once (as /metrics does) were written for every request of a
    pipelined burst, read or not: 2,000 one-line requests made 2,000 answers of 1 MB each for one client."""
    limits = api_limits(max_header_bytes=4096, max_connections=8, header_timeout=30, idle_timeout=30)
    body = b"x" * 1_000_000
    calls = 0

    async def handler(request: Request) -> Response:
        nonlocal calls
        calls += 1
        return Response(200, body, "text/plain")

    async def scenario() -> None:
        server = HTTPServer(handler, limits, "metrics")
        port = await server.start("127.0.0.1", 0, None)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
        count = 2000
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        await asyncio.sleep(1.0)
        assert calls < 100  # the ones that fit the socket buffers (tens of MB on loopback), then reading stops
        (connection,) = server._connections
        assert connection._transport is not None
        assert connection._transport.get_write_buffer_size() <= 2 * len(body)
        received = 0  # and once the client reads, every request is answered
        while received < count * len(body):
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert chunk
            received += len(chunk)
        assert calls == count
        writer.close()
        await server.stop()

    run(scenario(), 120)


def test_a_scrape_flood_shares_one_rendering_of_the_metrics_page() -> None:
    """Before: every GET /metrics rendered the page on the event loop (70 ms over 10,000 series), for anyone."""

    async def scrape(port: int) -> bytes:
        reader, writer = await connect(port, False)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await read_all(reader)
        writer.close()
        return answer.partition(b"\r\n\r\n")[2]

    def served(page: bytes) -> list[bytes]:
        return [line for line in page.splitlines() if line.startswith(b"zeroscale_api_requests_total{")]

    async def scenario() -> None:
        limits = api_limits(header_timeout=5, idle_timeout=5)
        for ttl, shared in ((3600.0, True), (0.0, False)):  # within the page's lifetime, and past it
            server = HTTPServer(MetricsPage(ttl), limits, "metrics")
            port = await server.start("127.0.0.1", 0, None)
            first = await scrape(port)
            telemetry.observe_request("health", 200, 0.001)  # what a request on the API port counts
            again = await scrape(port)
            assert (served(again) == served(first)) is shared
            await server.stop()

    run(scenario())
