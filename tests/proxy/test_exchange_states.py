"""Every edge of the exchange's state diagram (adapter/proxy/exchange.py), for an HTTP/1.1 request and an HTTP/2
stream, without a socket: the way uvicorn tests its protocols, a fake transport at each end and explicit clocks.

The ends are the real ones: a ClientConnection fed request bytes (it hands an HTTP/2 connection over to a real
H2ClientConnection, fed frames an `h2` client connection built), a real Route with no endpoint or with one whose
connections are FakeTransports too (tests/proxy/socketless.py: the loop hands the dialling Endpoint one, or refuses).

Two clocks, as the proxy has two:

- the loop's, for what it schedules (an exchange's hold timer, a dial's `asyncio.timeout`, the route's prober):
  these tests run on `VirtualClockLoop` (LOOP_FACTORIES below, honoured by tests/fixtures/proxy.py's loop hook),
  whose time moves only by `clock.advance(ms)`, so "held at 249 ms, answered at 250 ms" is exact;
- `time.monotonic`, for the deadlines the server's sweeper checks (body, response): a test reads the monotonic time
  around the moment a deadline starts and calls the connection's `check_deadlines(now)` with explicit values, a
  millisecond before and at it, as the sweeper would.

Each test asserts the route's counts as they changed ((held, inflight) after every change, the pending count the
HPA scales on), that they and the held bytes end at zero, and that the client was answered exactly once: one
response, nothing written after the connection's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from time import monotonic
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import httptools
import pytest
from prometheus_client import REGISTRY

from adapter.config.proxy import ProxyConfig
from adapter.config.route import RouteConfig
from adapter.proxy.client import ClientConnection
from adapter.proxy.exchange import QUEUED
from adapter.proxy.route import Route
from adapter.proxy.routing import Router
from adapter.proxy.server import ProxyServer
from adapter.proxy.table import Listener
from tests.proxy.socketless import FakeTransport, VirtualClockLoop

LOOP_FACTORIES = {"virtual_clock": VirtualClockLoop}

ENDPOINT = ("10.0.0.1", 8080)
CLIENT = ("192.0.2.7", 51000)
HOLD_MS = 250


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- the proxy's side: a server that listens nowhere, one route ---


class Stage:
    """One route (`default/held`) as the proxy serves it, and what its counts did."""

    def __init__(
        self,
        clock: VirtualClockLoop,
        *,
        endpoint: bool,
        upstream: str,
        proxy: dict[str, Any],
        limits: dict[str, Any],
        options: dict[str, Any],
    ) -> None:
        self.clock = clock
        self.server = ProxyServer(ProxyConfig(port=0, admin_port=0, **proxy))
        config = RouteConfig.model_validate(
            {
                "name": "held",
                "upstream": {"address": f"{ENDPOINT[0]}:{ENDPOINT[1]}", "protocol": upstream},
                "wake": "none",
                "readiness": "probe",
                "limits": {"hold_timeout": HOLD_MS / 1000, **limits},
                **options,
            }
        )
        self.route = Route(config)
        self.listener = Listener(Router([(config, self.route)]))
        # (held, inflight) after every change, the first being the counts as they were.
        self.counts: list[tuple[int, int]] = []
        self.route.counts.subscribe(lambda _route, held, inflight: self.counts.append((held, inflight)))
        self._peer = H2Upstream if upstream == "h2c" else H1Upstream
        self._upstreams: dict[int, H1Upstream | H2Upstream] = {}
        clock.on_dial = self._accepted
        if endpoint:
            self.route.set_endpoints([ENDPOINT])

    def connect(self) -> FakeTransport:
        """A client connection accepted by the proxy."""
        connection = ClientConnection(self.server, self.listener)
        transport = FakeTransport(connection, CLIENT)
        connection.connection_made(transport)
        return transport

    def upstream(self, index: int = -1) -> H1Upstream | H2Upstream:
        """The upstream's end of the `index`-th connection the proxy dialled."""
        return self._accepted(self.clock.dialled[index][1])

    def _accepted(self, transport: FakeTransport) -> H1Upstream | H2Upstream:
        if id(transport) not in self._upstreams:
            self._upstreams[id(transport)] = self._peer(transport)
        return self._upstreams[id(transport)]

    def pooled(self) -> list[Any]:
        """The endpoint's connections no request holds (HTTP/1.1), or kept for new streams (HTTP/2)."""
        endpoint = self.route.endpoints[0]
        return [*endpoint.idle, *endpoint.pool]

    @property
    def now(self) -> tuple[int, int]:
        return self.route.counts.held, self.route.counts.inflight

    def assert_idle(self) -> None:
        counts = self.route.counts
        assert (counts.held, counts.inflight, counts.held_bytes) == (0, 0, 0)
        assert not self.route.queue
        assert self.route.assigned == 0
        assert all(endpoint.inflight == 0 for endpoint in self.route.endpoints)
        for _, transport in self.clock.dialled:
            assert transport.late == []


Stages = Callable[..., Stage]


@pytest.fixture
async def clock() -> VirtualClockLoop:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    return loop


@pytest.fixture
async def stages(clock: VirtualClockLoop) -> AsyncIterator[Stages]:
    made: list[Stage] = []

    def stage(
        *,
        endpoint: bool = False,
        upstream: str = "http1",
        proxy: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
        **limits: Any,
    ) -> Stage:
        made.append(
            Stage(clock, endpoint=endpoint, upstream=upstream, proxy=proxy or {}, limits=limits, options=options or {})
        )
        return made[-1]

    yield stage
    for each in made:
        await each.route.close()


# --- the upstream's side: one connection, in either protocol ---


@dataclass
class Seen:
    method: bytes
    path: bytes
    body: bytes = b""


class _H1RequestReader:
    """httptools callbacks collecting every request in some bytes."""

    def __init__(self) -> None:
        self.done: list[Seen] = []
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.done.append(Seen(self.parser.get_method(), url))

    def on_body(self, body: bytes) -> None:
        self.done[-1].body += body


class H1Upstream:
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self._received = b""

    def requests(self) -> list[Seen]:
        """Every request received on the connection so far."""
        self._received += self.transport.take()
        reader = _H1RequestReader()
        reader.parser.feed_data(self._received)
        return reader.done

    def respond(self, body: bytes = b"ok", *, length: int | None = None) -> None:
        """A response to the latest request: `body` of a Content-Length (`length`: a larger one, the body cut short)."""
        size = len(body) if length is None else length
        self.transport.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (size, body))

    def hang_up(self) -> None:
        self.transport.hang_up()

    def cancelled(self) -> bool:
        """The latest request was given up: its connection closed (its framing is lost)."""
        return self.transport.is_closing() or self.transport.lost


class H2Upstream:
    """An HTTP/2 server's end (h2's server side) of a connection the proxy dialled."""

    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.initiate_connection()
        self.seen: dict[int, Seen] = {}
        self.reset: set[int] = set()
        self._send()  # its SETTINGS at once, as a server does: the proxy opens no stream before them

    def _exchange(self) -> None:
        """Read what the proxy sent, answer what h2 answers by itself (SETTINGS, their ACKs, WINDOW_UPDATE)."""
        data = self.transport.take()
        # After our GOAWAY what still comes is not read (h2 refuses frames on a closed connection).
        events = (
            [] if self.h2.state_machine.state is h2.connection.ConnectionState.CLOSED else self.h2.receive_data(data)
        )
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                fields = dict(event.headers or [])
                self.seen[event.stream_id or 0] = Seen(fields[b":method"], fields[b":path"])
            elif isinstance(event, h2.events.DataReceived):
                self.seen[event.stream_id or 0].body += event.data or b""
                self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
            elif isinstance(event, h2.events.StreamReset):
                self.reset.add(event.stream_id or 0)
        self._send()

    def _send(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.transport.lost:
            self.transport.feed(data)

    def requests(self) -> list[Seen]:
        self._exchange()
        return list(self.seen.values())

    def respond(self, body: bytes = b"ok", *, length: int | None = None) -> None:
        self._exchange()
        stream_id = max(self.seen)
        size = len(body) if length is None else length
        self.h2.send_headers(stream_id, [(b":status", b"200"), (b"content-length", b"%d" % size)])
        self.h2.send_data(stream_id, body, end_stream=length is None)
        self._send()

    def hang_up(self) -> None:
        self.transport.hang_up()

    def cancelled(self) -> bool:
        """The latest request was given up: its stream reset (the connection goes on for others)."""
        self._exchange()
        return max(self.seen) in self.reset and not self.transport.is_closing()


# --- the client's side: one request, in either protocol ---


@dataclass
class Answer:
    status: int
    fields: dict[str, str]
    body: bytes


class Caller(Protocol):
    """One request of a client, and what it was answered."""

    def get(self, path: bytes = b"/", extra: list[tuple[bytes, bytes]] | None = None) -> None: ...

    def post(self, body: bytes, *, length: int | None = None) -> None:
        """A POST of `body` (`length`: a larger Content-Length, the body cut short)."""

    def gone(self) -> None:
        """The client goes away: HTTP/1.1 closes its connection, HTTP/2 resets the stream."""

    def sweep(self, now: float) -> None:
        """The server's sweeper checks the client connection's deadlines at `now` (monotonic)."""

    def answers(self) -> list[Answer]: ...

    def cut_off(self) -> bool:
        """The response was cut off: HTTP/1.1 aborts the connection, HTTP/2 resets the stream."""


class _H1Reader:
    """httptools callbacks collecting every response in some bytes."""

    def __init__(self) -> None:
        self.done: list[Answer] = []
        self._fields: dict[str, str] = {}
        self._body: list[bytes] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done.append(Answer(self.parser.get_status_code(), self._fields, b"".join(self._body)))
        self._fields, self._body = {}, []


class H1Caller:
    def __init__(self, stage: Stage) -> None:
        self.transport = stage.connect()
        self._received = b""

    def get(self, path: bytes = b"/", extra: list[tuple[bytes, bytes]] | None = None) -> None:
        lines = b"".join(b"%b: %b\r\n" % pair for pair in extra or [])
        self.transport.feed(b"GET %b HTTP/1.1\r\nHost: app.example\r\n%b\r\n" % (path, lines))

    def post(self, body: bytes, *, length: int | None = None) -> None:
        size = len(body) if length is None else length
        self.transport.feed(b"POST / HTTP/1.1\r\nHost: app.example\r\nContent-Length: %d\r\n\r\n%b" % (size, body))

    def gone(self) -> None:
        self.transport.hang_up()

    def sweep(self, now: float) -> None:
        self.transport.protocol.check_deadlines(now)  # type: ignore[attr-defined]

    def cut_off(self) -> bool:
        return self.transport.aborted

    def answers(self) -> list[Answer]:
        assert self.transport.late == [], "written after the connection's end"
        self._received += self.transport.take()
        reader = _H1Reader()
        reader.parser.feed_data(self._received)
        return reader.done


class H2Client:
    """A client's HTTP/2 connection: h2's client side, its frames fed to the proxy, the proxy's read back."""

    def __init__(self, stage: Stage) -> None:
        self.transport = stage.connect()
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.events: dict[int, list[h2.events.Event]] = {}

    def send(self) -> None:
        self.transport.feed(self.h2.data_to_send())

    def read(self) -> None:
        assert self.transport.late == [], "written after the connection's end"
        for event in self.h2.receive_data(self.transport.take()):
            stream_id = getattr(event, "stream_id", 0)
            if stream_id:
                self.events.setdefault(stream_id, []).append(event)


class H2Caller:
    def __init__(self, stage: Stage, connection: H2Client | None = None) -> None:
        self.client = connection or H2Client(stage)
        self.stream_id = 0

    def request(self, fields: list[tuple[bytes, bytes]], body: bytes = b"", *, end: bool = True) -> None:
        h2c = self.client.h2
        self.stream_id = h2c.get_next_available_stream_id()
        h2c.send_headers(self.stream_id, fields, end_stream=end and not body)
        size = h2c.max_outbound_frame_size
        for at in range(0, len(body), size):
            h2c.send_data(self.stream_id, body[at : at + size], end_stream=end and at + size >= len(body))
        self.client.send()

    def get(self, path: bytes = b"/", extra: list[tuple[bytes, bytes]] | None = None) -> None:
        self.request([*_h2_head(b"GET", path), *(extra or [])])

    def post(self, body: bytes, *, length: int | None = None) -> None:
        size = len(body) if length is None else length
        self.request([*_h2_head(b"POST", b"/"), (b"content-length", b"%d" % size)], body, end=length is None)

    def grpc(self, message: bytes, timeout: bytes | None = None) -> None:
        """A unary gRPC call (its message in gRPC's length-prefixed framing)."""
        fields = [*_h2_head(b"POST", b"/demo.Echo/Say"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        if timeout is not None:
            fields.append((b"grpc-timeout", timeout))
        self.request(fields, b"\0" + len(message).to_bytes(4, "big") + message)

    def gone(self) -> None:
        self.client.h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
        self.client.send()

    def sweep(self, now: float) -> None:
        self.client.transport.protocol.check_deadlines(now)  # type: ignore[attr-defined]

    def cut_off(self) -> bool:
        self.client.read()
        return any(isinstance(event, h2.events.StreamReset) for event in self.client.events.get(self.stream_id, []))

    def answers(self) -> list[Answer]:
        """The stream's responses; one that ended is asserted to have ended once, by END_STREAM or by RST_STREAM."""
        self.client.read()
        found: list[Answer] = []
        ends = 0
        for event in self.client.events.get(self.stream_id, []):
            if isinstance(event, h2.events.ResponseReceived):
                fields = {name.decode(): value.decode() for name, value in event.headers or []}
                found.append(Answer(int(fields.pop(":status")), fields, b""))
            elif isinstance(event, h2.events.DataReceived):
                found[-1].body += event.data or b""
            elif isinstance(event, h2.events.StreamReset) and ends and event.error_code == 0:
                pass  # NO_ERROR after a whole answer: stop sending the request (RFC 9113 8.1), not a second end
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                ends += 1
        assert ends <= 1
        assert not found or ends == 1, "an answer whose stream never ended"
        return found


def _h2_head(method: bytes, path: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", method), (b":scheme", b"http"), (b":authority", b"app.example"), (b":path", path)]


CALLERS: dict[str, Callable[[Stage], Caller]] = {"http1": H1Caller, "h2": H2Caller}
both = pytest.mark.parametrize("protocol", sorted(CALLERS))
# The client's protocol and the upstream's (the route's upstream.protocol).
each_pair = pytest.mark.parametrize(
    ("protocol", "upstream"), [(c, u) for c in sorted(CALLERS) for u in ("http1", "h2c")]
)


def one_answer(caller: Caller) -> Answer:
    answers = caller.answers()
    assert len(answers) == 1, answers
    return answers[0]


def _grpc_status(answer: Answer) -> tuple[int, str, str, bytes]:
    """A gRPC answer's HTTP status, grpc-status, grpc-message and body (none for the proxy's trailers-only ones)."""
    fields = answer.fields
    return answer.status, fields["grpc-status"], fields["grpc-message"], answer.body


# --- NEW -> QUEUED -> DONE (fail) ---


@both
async def test_held_while_no_endpoint_then_504_at_the_hold_timeouts_millisecond(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.settle()
    assert stage.now == (1, 0)
    assert stage.route.queue[0].state == QUEUED
    await clock.advance(HOLD_MS - 1)
    assert caller.answers() == []
    await clock.advance(1)
    answer = one_answer(caller)
    assert (answer.status, answer.body) == (504, b"the workload did not become ready in 0.25 s (limits.hold_timeout)\n")
    assert clock.ms == HOLD_MS
    stage.assert_idle()
    assert stage.counts == [(0, 0), (1, 0), (0, 0)]
    await clock.advance(10 * HOLD_MS)
    assert len(caller.answers()) == 1


@both
async def test_one_over_max_held_requests_is_503_and_the_held_one_stays(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(max_held_requests=1, retry_after=7)
    held, refused = CALLERS[protocol](stage), CALLERS[protocol](stage)
    held.get()
    refused.get()
    await clock.settle()
    answer = one_answer(refused)
    assert answer.status == 503
    assert answer.fields["retry-after"] == "7"
    assert answer.body == b"the proxy already holds 1 requests for this route (limits.max_held_requests)\n"
    assert held.answers() == []
    assert stage.now == (1, 0)
    held.gone()
    await clock.settle()
    stage.assert_idle()
    assert stage.counts == [(0, 0), (1, 0), (0, 0)]


# --- NEW -> ASSIGNED -> DONE (response_done) ---


@each_pair
async def test_sent_at_once_to_a_ready_endpoint_and_done_with_the_response(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.get(b"/now")
    assert stage.now == (0, 1)
    await clock.settle()
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"GET", b"/now")]
    peer.respond()
    await clock.settle()
    answer = one_answer(caller)
    assert (answer.status, answer.body) == (200, b"ok")
    assert "x-zeroscale-cold-start" not in answer.fields
    stage.assert_idle()
    assert stage.counts == [(0, 0), (0, 1), (0, 0)]
    assert stage.pooled() == [peer.transport.protocol]  # kept for the next request
    assert clock.ms == 0


# --- QUEUED -> ASSIGNED (pump) ---


@each_pair
async def test_held_body_goes_out_whole_when_an_endpoint_appears_and_no_504_follows(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.post(b"x" * 100)
    await clock.settle()
    assert stage.now == (1, 0)
    assert stage.route.counts.held_bytes == 100
    await clock.advance(HOLD_MS - 1)
    stage.route.set_endpoints([ENDPOINT])
    assert stage.now == (0, 1)
    await clock.settle()
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"POST", b"/", b"x" * 100)]
    assert stage.route.counts.held_bytes == 0
    await clock.advance(10 * HOLD_MS)
    assert caller.answers() == []
    peer.respond()
    await clock.settle()
    answer = one_answer(caller)
    assert (answer.status, answer.fields["x-zeroscale-cold-start"]) == (200, "true")
    stage.assert_idle()
    assert stage.counts == [(0, 0), (1, 0), (0, 1), (0, 0)]


@each_pair
async def test_a_request_finding_its_endpoint_full_is_held_until_the_one_before_it_is_answered(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream, endpoint_concurrency=1)
    first, second = CALLERS[protocol](stage), CALLERS[protocol](stage)
    first.get(b"/1")
    second.get(b"/2")
    await clock.settle()
    assert stage.now == (1, 1)
    assert not stage.route.queue[0].cold  # held for room, not for a cold start
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"GET", b"/1")]
    peer.respond()
    await clock.settle()
    assert one_answer(first).status == 200
    assert stage.now == (0, 1)
    assert peer.requests()[-1] == Seen(b"GET", b"/2")  # on the same connection
    peer.respond()
    await clock.settle()
    answer = one_answer(second)
    assert (answer.status, "x-zeroscale-cold-start" in answer.fields) == (200, False)
    stage.assert_idle()
    # The first leaves its slot, then the pump gives it to the second.
    assert stage.counts == [(0, 0), (0, 1), (1, 1), (1, 0), (0, 1), (0, 0)]
    assert len(clock.dialled) == 1


@both
async def test_an_h2_upstreams_max_concurrent_streams_is_its_endpoints_concurrency(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream="h2c")
    first, second = CALLERS[protocol](stage), CALLERS[protocol](stage)
    first.get(b"/1")
    await clock.settle()
    peer = stage.upstream()
    assert isinstance(peer, H2Upstream)
    peer.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    peer.requests()
    await clock.settle()
    assert stage.route.endpoints[0].cap == 1
    second.get(b"/2")
    assert stage.now == (1, 1)
    peer.respond()
    await clock.settle()
    assert one_answer(first).status == 200
    assert peer.requests()[-1] == Seen(b"GET", b"/2")
    peer.respond()
    await clock.settle()
    assert one_answer(second).status == 200
    stage.assert_idle()


# --- QUEUED -> NEW on the fallback's route -> ASSIGNED there (docs/architecture.md#fallback) ---

FALLBACK = ("10.0.0.2", 8081)
AFTER_MS = 100


def with_fallback(stages: Stages, upstream: str = "http1", **limits: Any) -> tuple[Stage, Route]:
    """A stage whose route has a fallback (speaking `upstream`'s protocol) `AFTER_MS` into a hold."""
    fallback = {"service": "static", "port": FALLBACK[1], "after": AFTER_MS / 1000, "protocol": upstream}
    stage = stages(upstream=upstream, options={"fallback": fallback}, **limits)
    assert stage.route.fallback is not None
    return stage, stage.route.fallback


@each_pair
async def test_held_past_fallback_after_goes_to_the_fallback_with_its_body_and_no_504_follows(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage, fallback = with_fallback(stages, upstream)
    fallback.set_endpoints([FALLBACK])
    chosen = metric("zeroscale_proxy_cold_choices_total", route="default/held", choice="fallback")
    caller = CALLERS[protocol](stage)
    caller.post(b"x" * 100)
    await clock.settle()
    assert (stage.now, stage.route.counts.held_bytes) == ((1, 0), 100)
    await clock.advance(AFTER_MS - 1)
    assert clock.dialled == []
    await clock.advance(1)
    assert [address for address, _ in clock.dialled] == [FALLBACK]
    assert (stage.now, stage.route.counts.held_bytes) == ((0, 0), 0)
    assert (fallback.counts.held, fallback.counts.inflight) == (0, 1)
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"POST", b"/", b"x" * 100)]
    await clock.advance(10 * HOLD_MS)
    assert caller.answers() == []
    peer.respond()
    await clock.settle()
    assert one_answer(caller).status == 200
    stage.assert_idle()
    assert (fallback.counts.inflight, fallback.counts.held_bytes, fallback.assigned) == (0, 0, 0)
    assert stage.counts == [(0, 0), (1, 0), (0, 0)]
    assert metric("zeroscale_proxy_cold_choices_total", route="default/held", choice="fallback") == chosen + 1


@both
async def test_a_fallback_without_an_endpoint_leaves_the_hold_to_its_504_at_the_hold_timeouts_millisecond(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage, fallback = with_fallback(stages)
    fallback.set_endpoints([])
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.settle()
    await clock.advance(HOLD_MS - 1)
    assert caller.answers() == []
    assert stage.now == (1, 0)
    await clock.advance(1)
    assert one_answer(caller).status == 504
    assert clock.dialled == []
    stage.assert_idle()


@both
async def test_a_full_queue_sends_the_next_request_to_the_fallback_with_overflow_fallback(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    fallback_options = {"service": "static", "port": FALLBACK[1], "after": AFTER_MS / 1000}
    stage = stages(options={"fallback": fallback_options, "overflow": "fallback"}, max_held_requests=1)
    assert stage.route.fallback is not None
    stage.route.fallback.set_endpoints([FALLBACK])
    held, over = CALLERS[protocol](stage), CALLERS[protocol](stage)
    held.get(b"/held")
    over.get(b"/over")
    await clock.settle()
    assert clock.ms == 0
    assert [address for address, _ in clock.dialled] == [FALLBACK]
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"GET", b"/over")]
    peer.respond()
    await clock.settle()
    assert one_answer(over).status == 200
    assert held.answers() == []
    assert stage.now == (1, 0)
    held.gone()
    await clock.settle()
    stage.assert_idle()


# --- ASSIGNED -> QUEUED (retry) -> ASSIGNED ---


@each_pair
async def test_a_refused_connect_holds_the_request_until_a_probe_connects(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    # The request's own dial, the prober's first at once and its second 10 ms later (probe_interval) are refused.
    clock.refuse(ENDPOINT, times=3)
    caller = CALLERS[protocol](stage)
    caller.get()
    assert stage.now == (0, 1)
    await clock.settle()
    assert stage.now == (1, 0)
    assert stage.route.queue[0].cold
    await clock.advance(19)
    assert stage.now == (1, 0)
    assert clock.dialled == []
    await clock.advance(1)  # the prober's third dial connects: its connection takes the request
    assert stage.now == (0, 1)
    assert len(clock.dialled) == 1
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"GET", b"/")]
    peer.respond()
    await clock.settle()
    assert one_answer(caller).status == 200
    stage.assert_idle()
    assert stage.counts == [(0, 0), (0, 1), (1, 0), (0, 1), (0, 0)]


@both
async def test_a_refused_connect_keeps_the_hold_timeout_from_when_it_was_first_held(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True)
    clock.refuse(ENDPOINT)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.advance(HOLD_MS - 1)
    assert caller.answers() == []
    await clock.advance(1)
    assert one_answer(caller).status == 504
    stage.assert_idle()
    assert stage.counts == [(0, 0), (0, 1), (1, 0), (0, 0)]


@each_pair
async def test_a_stale_pooled_connection_sends_the_request_again_on_a_new_one(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    first = CALLERS[protocol](stage)
    first.get()
    await clock.settle()
    stale = stage.upstream()
    stale.respond()
    await clock.settle()
    assert one_answer(first).status == 200
    retries = metric("zeroscale_proxy_retries_total", route="default/held")
    caller = CALLERS[protocol](stage)
    caller.get(b"/again")
    await clock.settle()  # HTTP/2 frames go out at the end of the loop's turn (h2conn.Outbox)
    assert stale.requests()[-1] == Seen(b"GET", b"/again")  # on the pooled connection, in the same turn
    stale.hang_up()  # it had been closed by the upstream: no byte of an answer
    await clock.settle()
    fresh = stage.upstream()
    assert fresh is not stale
    assert fresh.requests() == [Seen(b"GET", b"/again")]
    fresh.respond()
    await clock.settle()
    assert one_answer(caller).status == 200
    assert metric("zeroscale_proxy_retries_total", route="default/held") == retries + 1
    stage.assert_idle()
    assert stage.counts[-5:] == [(0, 0), (0, 1), (1, 0), (0, 1), (0, 0)]


# --- ASSIGNED -> DONE (fail) ---


@each_pair
async def test_a_request_the_upstream_may_have_acted_on_is_not_sent_again_but_answered_502(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.post(b"once")
    await clock.settle()
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"POST", b"/", b"once")]
    peer.hang_up()
    await clock.settle()
    answer = one_answer(caller)
    assert (answer.status, answer.body) == (502, b"the upstream closed the connection before answering\n")
    assert len(clock.dialled) == 1
    stage.assert_idle()


@each_pair
async def test_a_response_the_upstream_breaks_off_is_cut_off_for_the_client(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.settle()
    peer = stage.upstream()
    peer.respond(b"half", length=10)
    await clock.settle()
    broken = metric("zeroscale_proxy_error_responses_total", route="default/held", code="502")
    peer.hang_up()
    await clock.settle()
    assert caller.cut_off()
    assert metric("zeroscale_proxy_error_responses_total", route="default/held", code="502") == broken + 1
    assert len(clock.dialled) == 1  # begun to answer: never sent again
    stage.assert_idle()


@each_pair
async def test_the_sweeper_answers_504_at_the_response_timeout(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream, response_timeout=2.0)
    caller = CALLERS[protocol](stage)
    before = monotonic()
    caller.get()
    await clock.settle()  # sent whole: the response is due 2 s from now
    after = monotonic()
    caller.sweep(before + 2.0 - 0.001)
    assert caller.answers() == []
    caller.sweep(after + 2.0)
    await clock.settle()
    answer = one_answer(caller)
    assert (answer.status, answer.body) == (504, b"the upstream did not answer in 2 s (limits.response_timeout)\n")
    await clock.settle()
    assert stage.upstream().cancelled()
    stage.assert_idle()


@both
async def test_the_sweeper_answers_408_when_a_held_body_stops_at_the_body_timeout(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(body_timeout=3.0)
    caller = CALLERS[protocol](stage)
    before = monotonic()
    caller.post(b"half", length=10)
    after = monotonic()
    await clock.settle()
    assert (stage.now, stage.route.counts.held_bytes) == ((1, 0), 4)
    caller.sweep(before + 3.0 - 0.001)
    assert caller.answers() == []
    caller.sweep(after + 3.0)
    await clock.settle()
    assert one_answer(caller).status == 408
    stage.assert_idle()


# --- QUEUED -> DONE (fail) by the route or the server ---


@both
async def test_a_refused_wake_answers_every_held_request_503(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    callers = [CALLERS[protocol](stage) for _ in range(2)]
    for caller in callers:
        caller.get()
    await clock.settle()
    stage.route.wake_refused("the target was scaled to 0 by hand", "stopped_by_hand")
    await clock.settle()
    for caller in callers:
        answer = one_answer(caller)
        assert (answer.status, answer.body) == (503, b"the target was scaled to 0 by hand\n")
    stage.assert_idle()
    assert stage.counts == [(0, 0), (1, 0), (2, 0), (1, 0), (0, 0)]


async def test_a_refused_wake_is_unavailable_to_a_held_grpc_call(stages: Stages, clock: VirtualClockLoop) -> None:
    stage = stages()
    caller = H2Caller(stage)
    caller.grpc(b"hello")
    await clock.settle()
    stage.route.wake_refused("the target was scaled to 0 by hand", "stopped_by_hand")
    await clock.settle()
    assert _grpc_status(one_answer(caller)) == (200, "14", "the target was scaled to 0 by hand", b"")
    stage.assert_idle()


@both
async def test_the_end_of_the_grace_period_answers_a_held_request_503(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.settle()
    for connection in list(stage.server.connections):
        connection.shut_down()
    answer = one_answer(caller)
    assert (answer.status, answer.body) == (503, b"the proxy is shutting down\n")
    stage.assert_idle()


# --- DONE by the client going away ---


@both
async def test_a_client_gone_while_held_leaves_nothing_held_and_no_timer(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    caller = CALLERS[protocol](stage)
    caller.post(b"y" * 100)
    await clock.settle()
    assert stage.route.counts.held_bytes == 100
    gone = metric("zeroscale_proxy_error_responses_total", route="default/held", code="499")
    caller.gone()
    await clock.settle()
    stage.assert_idle()
    assert metric("zeroscale_proxy_error_responses_total", route="default/held", code="499") == gone + 1
    await clock.advance(10 * HOLD_MS)
    assert caller.answers() == []
    assert stage.counts == [(0, 0), (1, 0), (0, 0)]


@each_pair
async def test_a_client_gone_while_connecting_leaves_the_new_connection_unused_in_the_pool(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.get()
    caller.gone()  # before the dial completes
    stage.assert_idle()
    await clock.settle()
    peer = stage.upstream()
    assert peer.requests() == []
    assert stage.pooled() == [peer.transport.protocol]
    assert stage.counts == [(0, 0), (0, 1), (0, 0)]


@each_pair
async def test_a_client_gone_while_the_upstream_answers_gives_that_request_up_upstream(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.settle()
    peer = stage.upstream()
    peer.respond(b"half", length=10)
    await clock.settle()
    caller.gone()
    await clock.settle()
    assert peer.cancelled()  # HTTP/1.1: the connection's framing is lost, closed; HTTP/2: the stream reset
    stage.assert_idle()


async def test_http1_connection_lost_with_a_pipelined_request_behind_a_held_one_leaves_nothing_held(
    stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    caller = H1Caller(stage)
    caller.transport.feed(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
    await clock.settle()
    assert stage.now == (1, 0)  # the second waits behind the first, unparsed
    caller.gone()
    await clock.settle()
    stage.assert_idle()


async def test_h2_connection_lost_ends_every_held_stream(stages: Stages, clock: VirtualClockLoop) -> None:
    stage = stages()
    client = H2Client(stage)
    callers = [H2Caller(stage, client) for _ in range(3)]
    for caller in callers:
        caller.get()
    await clock.settle()
    assert stage.now == (3, 0)
    client.transport.hang_up()
    await clock.settle()
    stage.assert_idle()
    await clock.advance(10 * HOLD_MS)
    assert stage.counts[-1] == (0, 0)


# --- DONE by tunnel_opened (HTTP/1.1 only: an HTTP/2 stream carries no Upgrade) ---


async def test_an_upgrade_leaves_the_counts_for_the_tunnel_count(stages: Stages, clock: VirtualClockLoop) -> None:
    stage = stages(endpoint=True)
    caller = H1Caller(stage)
    caller.get(b"/ws", [(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")])
    await clock.settle()
    upstream = stage.upstream().transport
    assert b"Upgrade: websocket" in upstream.take()
    upstream.feed(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert caller.transport.take().startswith(b"HTTP/1.1 101 ")
    assert stage.route.tunnels == 1
    stage.assert_idle()
    caller.transport.feed(b"frame")
    assert upstream.take() == b"frame"
    caller.gone()
    await clock.settle()
    assert stage.route.tunnels == 0
    assert upstream.is_closing()


# --- gRPC: the proxy's own answers are statuses (trailers-only) ---


@pytest.mark.parametrize(
    ("grpc_timeout", "held_ms", "message"),
    [
        (b"100m", 100, "the call's grpc-timeout (0.1 s) ran out while it was held"),
        (None, HOLD_MS, "the workload did not become ready in 0.25 s (limits.hold_timeout)"),
    ],
)
async def test_a_held_grpc_call_ends_deadline_exceeded_at_its_deadline(
    grpc_timeout: bytes | None, held_ms: int, message: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages()
    caller = H2Caller(stage)
    caller.grpc(b"hello", grpc_timeout)
    await clock.settle()
    assert stage.route.counts.held_bytes == 10
    await clock.advance(held_ms - 1)
    assert caller.answers() == []
    await clock.advance(1)
    assert _grpc_status(one_answer(caller)) == (200, "4", message, b"")  # DEADLINE_EXCEEDED, no DATA
    stage.assert_idle()


async def test_a_grpc_call_over_max_held_requests_is_unavailable_and_its_neighbour_stays_held(
    stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(max_held_requests=1)
    client = H2Client(stage)
    held, refused = H2Caller(stage, client), H2Caller(stage, client)
    held.grpc(b"first")
    refused.grpc(b"second")
    await clock.settle()
    status = _grpc_status(one_answer(refused))
    assert status == (200, "14", "the proxy already holds 1 requests for this route (limits.max_held_requests)", b"")
    assert held.answers() == []
    assert stage.now == (1, 0)
    held.gone()
    await clock.settle()
    stage.assert_idle()


@each_pair
async def test_a_request_sent_after_its_hold_and_sent_back_keeps_its_hold_deadline(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    """Held at 0 ms, sent at 100 ms, its connection lost unanswered at 150 ms, and its endpoint gone: it is held
    again, and still answered 504 at 250 ms, the deadline of its first hold."""
    stage = stages(upstream=upstream)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.advance(100)
    stage.route.set_endpoints([ENDPOINT])
    await clock.advance(50)
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"GET", b"/")]
    clock.refuse(ENDPOINT)
    peer.hang_up()
    await clock.settle()
    assert stage.now == (1, 0)
    await clock.advance(HOLD_MS - 150 - 1)
    assert caller.answers() == []
    await clock.advance(1)
    assert one_answer(caller).status == 504
    stage.assert_idle()


# --- the dial's own time: ASSIGNED while connecting ---


@each_pair
async def test_a_held_request_still_connecting_at_its_hold_deadline_is_answered_504_then(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(upstream=upstream)
    clock.slow(ENDPOINT, 500)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.advance(100)
    stage.route.set_endpoints([ENDPOINT])
    assert stage.now == (0, 1)  # assigned, connecting
    await clock.advance(HOLD_MS - 100 - 1)
    assert caller.answers() == []
    await clock.advance(1)
    assert one_answer(caller).status == 504
    stage.assert_idle()
    await clock.advance(600 - HOLD_MS)  # the dial completes: the connection is kept, nothing sent on it
    peer = stage.upstream()
    assert peer.requests() == []
    assert stage.pooled() == [peer.transport.protocol]


@each_pair
async def test_a_dial_over_the_connect_timeout_holds_the_request_from_then_on(
    protocol: str, upstream: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(endpoint=True, upstream=upstream, connect_timeout=0.1)
    clock.slow(ENDPOINT, 1000)
    caller = CALLERS[protocol](stage)
    caller.get()
    await clock.advance(99)
    assert stage.now == (0, 1)
    await clock.advance(1)
    assert stage.now == (1, 0)
    assert not stage.route.has_usable()
    await clock.advance(HOLD_MS - 1)  # the prober's dials time out too
    assert caller.answers() == []
    await clock.advance(1)
    assert one_answer(caller).status == 504
    assert clock.ms == 100 + HOLD_MS
    stage.assert_idle()
    assert clock.dialled == []


# --- held bytes: the bounds on bodies buffered while held ---


@both
async def test_held_bodies_over_their_bounds_are_413_and_503(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    stage = stages(max_held_body_bytes=1000, max_held_bytes=1500, retry_after=3)
    too_large, held, over_route = (CALLERS[protocol](stage) for _ in range(3))
    too_large.post(b"x" * 1001)
    held.post(b"y" * 900)
    over_route.post(b"z" * 900)
    await clock.settle()
    assert one_answer(too_large).status == 413
    answer = one_answer(over_route)
    assert (answer.status, answer.fields["retry-after"]) == (503, "3")
    assert held.answers() == []
    assert (stage.now, stage.route.counts.held_bytes) == ((1, 0), 900)
    held.gone()
    await clock.settle()
    stage.assert_idle()


# --- HTTP/2 upstreams: a stream the upstream did not process is sent again, whatever its method ---


def _refuse_stream(peer: H2Upstream) -> None:
    peer.h2.reset_stream(max(peer.seen), h2.errors.ErrorCodes.REFUSED_STREAM)


def _go_away(peer: H2Upstream) -> None:
    peer.h2.close_connection(last_stream_id=0)


@pytest.mark.parametrize("method", [b"GET", b"POST"])
@pytest.mark.parametrize(
    ("unprocessed", "again_on"),
    [(_refuse_stream, "a new stream"), (_go_away, "a new connection")],
    ids=["REFUSED_STREAM", "GOAWAY"],
)
@both
async def test_a_stream_the_upstream_did_not_process_is_sent_again(
    protocol: str,
    unprocessed: Callable[[H2Upstream], None],
    again_on: str,
    method: bytes,
    stages: Stages,
    clock: VirtualClockLoop,
) -> None:
    """RFC 9113 8.7: a stream refused, or above the last stream a GOAWAY says was processed, was not acted on."""
    stage = stages(endpoint=True, upstream="h2c")
    caller = CALLERS[protocol](stage)
    caller.get() if method == b"GET" else caller.post(b"body")
    await clock.settle()
    peer = stage.upstream()
    assert isinstance(peer, H2Upstream)
    request = peer.requests()[0]
    assert request.method == method
    unprocessed(peer)
    peer.requests()
    await clock.settle()
    assert caller.answers() == []
    if again_on == "a new stream":
        assert len(peer.requests()) == 1  # a refusing endpoint gets no new stream for a pause (Endpoint.refused)
        await clock.advance(5)
    again = stage.upstream()
    assert isinstance(again, H2Upstream)
    assert (again is peer) == (again_on == "a new stream")
    assert again.requests()[-1] == request
    again.respond()
    await clock.settle()
    assert one_answer(caller).status == 200
    stage.assert_idle()
    assert stage.counts == [(0, 0), (0, 1), (1, 0), (0, 1), (0, 0)]


async def _posted_to_h2c(stages: Stages, protocol: str, clock: VirtualClockLoop) -> tuple[Stage, Caller, H2Upstream]:
    """A POST from a `protocol` client, sent on to an h2c upstream: the stage, the client, the upstream."""
    stage = stages(endpoint=True, upstream="h2c")
    caller = CALLERS[protocol](stage)
    caller.post(b"body")
    await clock.settle()
    peer = stage.upstream()
    assert isinstance(peer, H2Upstream)
    return stage, caller, peer


async def _answered(peer: H2Upstream, caller: Caller, stage: Stage, clock: VirtualClockLoop) -> None:
    """The upstream answers: the client gets its 200 once, and nothing is left held or in flight."""
    peer.respond()
    await clock.settle()
    assert one_answer(caller).status == 200
    stage.assert_idle()


@both
async def test_a_stream_refused_again_and_again_waits_longer_each_time_and_is_never_failed_for_it(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    """grpc's server refuses a stream for a moment after its previous one ended: each refusal pauses the endpoint
    (5 ms, doubling), and refusals spend none of the request's attempts (three connection failures would have failed
    it with a 502 before)."""
    stage, caller, peer = await _posted_to_h2c(stages, protocol, clock)
    request = peer.requests()[0]
    for sent, pause in enumerate((5, 10, 20, 40, 80), start=1):
        _refuse_stream(peer)
        peer.requests()  # sends the reset
        await clock.settle()
        await clock.advance(pause - 1)
        assert len(peer.requests()) == sent, pause
        await clock.advance(1)
        assert len(peer.requests()) == sent + 1, pause
        assert peer.requests()[-1] == request
    await _answered(peer, caller, stage, clock)


@both
async def test_settings_arriving_during_a_refusal_pause_take_effect_when_it_ends(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    """A SETTINGS frame (more streams allowed) read while the endpoint is paused for a refusal does not end the pause
    early, and is its concurrency once the pause is over (never left at the pause's 0)."""
    stage, caller, peer = await _posted_to_h2c(stages, protocol, clock)
    endpoint = stage.route.endpoints[0]
    assert len(peer.requests()) == 1
    _refuse_stream(peer)
    peer.requests()
    await clock.settle()
    assert endpoint.cap == 0
    await clock.advance(2)
    peer.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 3})
    peer.requests()
    await clock.settle()
    assert (endpoint.cap, len(peer.requests())) == (0, 1)
    await clock.advance(3)
    assert (endpoint.cap, len(peer.requests())) == (3, 2)
    await _answered(peer, caller, stage, clock)


@both
async def test_an_endpoint_removed_and_added_again_during_a_refusal_pause_takes_the_request(
    protocol: str, stages: Stages, clock: VirtualClockLoop
) -> None:
    """The paused endpoint leaves the slices and comes back (a pod's readiness flapping): the one that comes back is a
    new endpoint, with room, and the held request goes there; the old one's pause ends without a trace."""
    stage, caller, peer = await _posted_to_h2c(stages, protocol, clock)
    assert len(peer.requests()) == 1
    _refuse_stream(peer)
    peer.requests()
    await clock.settle()
    stage.route.set_endpoints([])
    stage.route.set_endpoints([ENDPOINT])
    await clock.settle()
    assert stage.route.endpoints[0].cap > 0
    await clock.advance(10)  # the old endpoint's pause is over
    again = stage.upstream()
    assert isinstance(again, H2Upstream)
    assert again is not peer  # the new endpoint dials its own connection
    assert (len(peer.requests()), len(again.requests())) == (1, 1)
    await _answered(again, caller, stage, clock)


# --- HTTP/2 flow control: what a paused stream read is given back to the connection ---


_WINDOW = 65535  # a stream's: its first DATA frame is acknowledged at once, the rest read while paused


async def _sent_once_connected(stage: Stage, clock: VirtualClockLoop, caller: H2Caller, upload: int) -> None:
    clock.slow(ENDPOINT, 1)
    caller.post(b"x" * _WINDOW)
    await clock.advance(1)  # connected: the body goes upstream, reading resumes
    peer = stage.upstream()
    assert peer.requests() == [Seen(b"POST", b"/", b"x" * _WINDOW)]
    peer.transport.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await clock.settle()
    assert one_answer(caller).status == 200


async def _reset_by_the_client(stage: Stage, clock: VirtualClockLoop, caller: H2Caller, upload: int) -> None:
    clock.slow(ENDPOINT, 60_000)
    caller.post(b"x" * _WINDOW)
    caller.gone()
    await clock.settle()


async def _answered_by_the_proxy(stage: Stage, clock: VirtualClockLoop, caller: H2Caller, upload: int) -> None:
    # Each upload to a new endpoint, that refuses: held again, over max_held_body_bytes, 413.
    endpoint = (ENDPOINT[0], 10_000 + upload)
    clock.refuse(endpoint)
    stage.route.set_endpoints([endpoint])
    caller.post(b"x" * _WINDOW)
    await clock.settle()
    assert one_answer(caller).status == 413


@pytest.mark.parametrize("upload", [_sent_once_connected, _reset_by_the_client, _answered_by_the_proxy])
async def test_body_read_while_a_stream_is_paused_is_given_back_to_the_connections_window(
    upload: Callable[[Stage, VirtualClockLoop, H2Caller, int], Awaitable[None]], stages: Stages, clock: VirtualClockLoop
) -> None:
    """A stream connecting upstream with more than max_held_body_bytes stops acknowledging its body (reading paused);
    what arrives meanwhile must still be given back to the connection's window once the stream goes on, or ends,
    whether or not the request ended meanwhile: else each such upload keeps up to a stream's window (64 KiB) of the
    connection's 16 MiB, and after a few hundred the client can send no byte on any stream of that connection."""
    resets = {"http2": {"max_stream_resets": 1000}}  # not the rapid-reset defence under test here
    stage = stages(endpoint=True, max_held_body_bytes=0, proxy=resets)
    client = H2Client(stage)
    for index in range(400):
        client.read()  # the proxy's WINDOW_UPDATEs
        assert client.h2.outbound_flow_control_window >= _WINDOW, f"upload {index}"
        await upload(stage, clock, H2Caller(stage, client), index)
    stage.assert_idle()


async def test_an_h2c_upstream_socket_that_stops_draining_keeps_the_uploading_client_paused(
    stages: Stages, clock: VirtualClockLoop
) -> None:
    """The upstream connection's socket is full (asyncio's pause_writing): every stream's client is paused, and a
    stream's own DATA going out (its window has room) does not lift the connection's pause for its client."""
    stage = stages(endpoint=True, upstream="h2c")
    caller = H1Caller(stage)
    caller.post(b"first", length=10)
    await clock.settle()
    stage.upstream().requests()
    connection = stage.route.endpoints[0].pool[0]
    connection.pause_writing()
    assert not caller.transport.reading
    caller.transport.feed(b"more!")  # the rest of the body: its DATA goes into h2's buffer, the socket still full
    await clock.settle()
    assert not caller.transport.reading
    connection.resume_writing()
    assert caller.transport.reading
