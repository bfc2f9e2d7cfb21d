"""HTTP/1.1 serving at the protocol level: one asyncio Protocol per connection, parsed by httptools.

No framework objects on the request path: a Request is a small slotted object, a Response a
status, a body and a content type, written with one `transport.write`. Requests on a
keep-alive connection are answered in order, one at a time.

Every resource is bounded and every phase of a connection has a deadline (docs/reference/
security.md): connections are counted from accept, before any TLS handshake (`max_connections`);
the handshake and the request head get `header_timeout`, a body `body_timeout` (then 408),
an answer `response_timeout`, and a connection between requests `idle_timeout`. A head is at
most `max_header_bytes` (431), a body `max_body_bytes` (413), and requests read ahead of their
answers at most `max_buffered_bytes` (reading pauses until answers catch up).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar, cast

import httptools

from adapter.redact import redact
from adapter.telemetry import api as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)

# Pipelined requests buffered before the connection stops reading.
_MAX_PENDING = 16
# Bytes handed to the parser at once: a pipelined burst is parsed piecewise, so the requests parsed
# ahead of their answers overshoot `max_buffered_bytes` by at most one piece.
_FEED_STEP = 1024
# Whitespace RFC 9110 5.5 lets a field value carry on either side (httptools keeps the trailing part).
_OWS = b" \t"
# Bodies up to this size are joined with their head into one write; larger ones are written as they are.
_JOIN_LIMIT = 16384
_REASONS = {status.value: status.phrase for status in HTTPStatus}
_T = TypeVar("_T")


@dataclass(frozen=True)
class Limits:
    """The bounds of one listener (from `server:`, see adapter.api.listeners.listener_limits); `connections_key` and
    `per_source_key` are the config keys its connection limits come from."""

    max_header_bytes: int
    max_connections: int
    max_connections_per_source: int
    header_timeout: float
    idle_timeout: float
    body_timeout: float
    response_timeout: float
    max_body_bytes: int
    max_buffered_bytes: int
    connections_key: str
    per_source_key: str


class Phase(enum.Enum):
    """What a connection waits for; each phase has its own deadline."""

    HANDSHAKE = "handshake"
    HEAD = "head"
    BODY = "body"
    RESPONSE = "response"
    IDLE = "idle"


class Request:
    __slots__ = ("connection", "headers", "method", "target")

    def __init__(self, connection: Connection, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        self.connection = connection
        self.method = method
        self.target = target  # path and query, still percent-encoded
        self.headers = headers  # (lower-cased name, value without surrounding whitespace), in order, repeats kept

    def header(self, name: str) -> str | None:
        """The first value of a header (name in lower case)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Response:
    __slots__ = ("body", "content_type", "status")

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.status = status
        self.body = body
        self.content_type = content_type


# A handler's first step runs eagerly inside data_received, outside any Task (see Connection._start):
# until it first suspends it must not need asyncio.current_task(): run such code (asyncio.timeout) in a task.
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
_INTERNAL_ERROR = Response(500, b"internal error\n", "text/plain; charset=utf-8")


@types.coroutine
def _resume(coroutine: Coroutine[Any, Any, _T], suspended: Any) -> Generator[Any, Any, _T]:
    """Go on driving a coroutine that already ran its first step (what `yield from` would do).

    Deliberate, see docs/architecture.md#hot-eager-handler."""
    while True:
        try:
            sent = yield suspended
        except BaseException as error:  # cancellation included: the coroutine gets to handle it
            try:
                suspended = coroutine.throw(error)
            except StopIteration as done:
                return cast(_T, done.value)
        else:
            try:
                suspended = coroutine.send(sent)
            except StopIteration as done:
                return cast(_T, done.value)


class Connection(asyncio.Protocol):
    """One client connection. `peer_certificate` is the DER client certificate, if one was presented."""

    def __init__(self, server: HTTPServer) -> None:
        self._server = server
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body_bytes = 0
        self._pending: deque[tuple[Request, bool, int]] = deque()  # request, keep-alive, head bytes
        self._pending_bytes = 0  # head bytes of the requests in _pending
        self._held = b""  # bytes read but not parsed yet, while _pending is full
        self._early: list[bytes] = []  # bytes that arrived while the TLS handshake was finishing
        self._worker: asyncio.Task[None] | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._phase = Phase.IDLE
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._accepted_at = 0.0
        self._message_started = 0.0
        self._head_done_at = 0.0
        self._in_message = False
        self._parser_head_done = False
        self._head_fed = 0  # raw bytes fed since the current head began (approximately, to one piece)
        self._reading = True
        self._write_paused = False
        self._stopped = False  # after an Upgrade or a refused request: nothing more is parsed
        self._failure: tuple[int, str] | None = None  # an error answer owed after the requests in progress
        self._closing = False
        self.peer_certificate: bytes | None = None
        self.source = ""  # the peer's address, without its port: connections are capped per source too
        # Per-connection memo for the authenticator (keyed by what it depends on).
        self.auth_memo: object = None

    # -- connection lifetime ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Called at accept, before any TLS: the connection counts against max_connections from here.
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._accepted_at = self._loop.time()
        peer = transport.get_extra_info("peername")
        self.source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._server.admit(self):
            self._closing = True
            self._transport.abort()
            return
        tls = self._server.tls
        if tls is None:
            self._ready(self._transport)
            return
        self._arm(Phase.HANDSHAKE, self._limits.header_timeout)
        # start_tls's first step must run now, before this callback returns: uvloop starts reading right
        # after connection_made, and the ClientHello must reach the TLS protocol, not this one.
        # (docs/architecture.md#hot-eager-handler)
        handshake = self._loop.start_tls(
            self._transport,
            self,
            tls,
            server_side=True,
            ssl_handshake_timeout=self._limits.header_timeout + 1.0,  # a backstop: our own deadline fires first
            ssl_shutdown_timeout=self._limits.header_timeout,
        )
        try:
            suspended = handshake.send(None)
        except StopIteration as done:  # never in practice: the handshake needs the peer
            self._secured(cast(asyncio.Transport, done.value))
            return
        self._handshake = self._loop.create_task(self._await_handshake(handshake, suspended))

    async def _await_handshake(self, handshake: Coroutine[Any, Any, Any], suspended: Any) -> None:
        raw, secured = self._transport, None
        try:
            secured = await _resume(handshake, suspended)
        except Exception:  # a failed or timed-out handshake: the peer is closed below
            pass
        finally:
            self._handshake = None
            if secured is None and raw is not None:
                # A failed handshake never reaches connection_lost: release here (cancellation included).
                self._closing = True
                raw.abort()
                self._release()
        if secured is not None:
            self._secured(cast(asyncio.Transport, secured))

    def _secured(self, secured: asyncio.Transport) -> None:
        if self._closing:
            secured.abort()
            self._release()
            return
        self._ready(secured)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def _ready(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
            self.peer_certificate = ssl_object.getpeercert(binary_form=True)
        # The first request's head is due within header_timeout of the connection (as Go's ReadHeaderTimeout);
        # idle_timeout is for the wait between requests on a connection that has made one.
        self._arm(Phase.HEAD, self._limits.header_timeout, self._accepted_at)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._release()
        if self._worker is not None:
            self._worker.cancel()

    def _release(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._server.release(self)

    def pause_writing(self) -> None:
        # A client that does not read its answers stops being read from.
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._closing:
            return
        if self._worker is None and self._pending:
            self._worker = self._loop.create_task(self._drained())
        elif not self._busy():
            self._arm_waiting()
        self._resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._handshake is not None:
            # The TLS layer may hand over the first request before start_tls has returned to us.
            self._early.append(data)
            return
        if self._closing or self._stopped:
            return
        if self._held:
            data = self._held + data
            self._held = b""
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        # One request in one read (the usual case) is fed as it is; a burst is fed piece by piece.
        view: bytes | memoryview = data if len(data) <= _FEED_STEP else memoryview(data)
        offset = 0
        while offset < len(data):
            if self._closing:
                return
            if self._full():
                self._held = bytes(view[offset:])
                self._pause_reading()
                return
            piece = view[offset : offset + _FEED_STEP]
            offset += len(piece)
            if not self._parser_head_done:
                # httptools gathers a header value until its line ends, calling nothing: bound the raw bytes.
                self._head_fed += len(piece)
                if self._head_fed > self._limits.max_header_bytes + _FEED_STEP:
                    self._fail(431, _head_too_large(self._limits))
                    return
            try:
                self._parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                # We speak no other protocol: the request was answered (or will be) as a plain one, and the
                # connection closes after it (its keep-alive was turned off in on_message_complete).
                self._stopped = True
                return
            except httptools.HttpParserError as err:
                # httptools wraps what a callback raised; a size bound hit is one of those.
                cause = err.__cause__ or err.__context__
                if isinstance(cause, _RequestTooLarge):
                    self._fail(cause.status, str(cause))
                else:
                    self._fail(400, "malformed HTTP request")
                return

    def _full(self) -> bool:
        # A client that does not read its answers gets none parsed past the one that filled its socket:
        # each answer written is memory held for it (answers that never suspend are written during _feed).
        return (
            self._write_paused
            or len(self._pending) >= _MAX_PENDING
            or self._pending_bytes >= self._limits.max_buffered_bytes
        )

    def close(self) -> None:
        if self._transport is not None and not self._closing:
            self._closing = True
            transport = self._transport
            unflushed = not transport.is_closing() and transport.get_write_buffer_size() > 0
            transport.close()
            if unflushed:
                # close() waits for the answer to be flushed: a peer that never reads gets response_timeout.
                self._loop.call_later(self._limits.response_timeout, self._abort_unflushed, transport)

    def _abort_unflushed(self, transport: asyncio.Transport) -> None:
        if self._server.holds(self):
            telemetry.TIMEOUTS.labels(self._server.name, Phase.RESPONSE.value).inc()
            transport.abort()

    # -- deadlines ---------------------------------------------------------------------------
    # One deadline per connection, moved by plain assignment; a single timer follows it lazily,
    # so the hot path creates and cancels no timer handles (docs/architecture.md#hot-lazy-deadline).

    def _arm(self, phase: Phase, seconds: float, since: float | None = None) -> None:
        self._phase = phase
        deadline = (self._loop.time() if since is None else since) + seconds
        self._deadline = deadline
        if self._closing:
            return
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._deadline is None or self._closing:
            return
        if self._loop.time() < self._deadline:
            self._timer_at = self._deadline
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
            return
        telemetry.TIMEOUTS.labels(self._server.name, self._phase.value).inc()
        if self._phase in (Phase.HANDSHAKE, Phase.RESPONSE) and self._transport is not None:
            # Nothing to say, or an answer the peer is not reading: a graceful close would wait for it.
            self._closing = True
            self._transport.abort()
        elif self._phase is Phase.BODY:
            self._fail(408, f"request body not received within {self._limits.body_timeout:g}s (server.body_timeout)")
        else:
            self.close()

    def _arm_waiting(self) -> None:
        """The deadline once nothing is being answered: the unfinished request's phase, or idle."""
        if not self._in_message:
            self._arm(Phase.IDLE, self._limits.idle_timeout)
        elif self._parser_head_done:
            self._arm(Phase.BODY, self._limits.body_timeout, self._head_done_at)
        else:
            self._arm(Phase.HEAD, self._limits.header_timeout, self._message_started)

    def _busy(self) -> bool:
        return self._worker is not None or bool(self._pending)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._body_bytes = 0
        self._in_message = True
        self._parser_head_done = False
        now = self._message_started = self._loop.time()
        if not self._busy():
            self._arm(Phase.HEAD, self._limits.header_timeout, now)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        self._headers.append((name.decode("latin-1").lower(), value.strip(_OWS).decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._parser_head_done = True
        self._head_fed = 0
        now = self._head_done_at = self._loop.time()
        if not self._busy():
            self._arm(Phase.BODY, self._limits.body_timeout, now)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            raise _RequestTooLarge(
                413, f"request body larger than {self._limits.max_body_bytes} bytes (server.max_body_bytes)"
            )

    def on_message_complete(self) -> None:
        self._in_message = False
        self._parser_head_done = False  # what follows is the next request's head
        self._head_fed = 0
        if self._closing:
            return
        method = self._parser.get_method().decode("ascii", "replace")
        request = Request(self, method, self._url.decode("latin-1"), self._headers)
        # An Upgrade is never taken: answer the request as a plain one, then close (one request, one answer).
        keep_alive = self._parser.should_keep_alive() and not self._parser.should_upgrade()
        if self._worker is None and not self._pending and not self._write_paused:
            self._start(request, keep_alive)
            return
        # Behind an answer in progress, or a client that is not reading its answers: answered in turn.
        self._pending.append((request, keep_alive, self._head_bytes))
        self._pending_bytes += self._head_bytes

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_bytes:
            raise _RequestTooLarge(431, _head_too_large(self._limits))

    # -- answering ----------------------------------------------------------------------------

    def _start(self, request: Request, keep_alive: bool) -> None:
        """Run the handler's first step right here; most answers (cached values) complete in it.

        Like Python 3.12's eager tasks: no Task is made unless the handler really waits
        (a cold series, a TokenReview), which keeps the per-request cost low: docs/architecture.md#hot-eager-handler.
        """
        coroutine = self._server.handler(request)
        try:
            suspended = coroutine.send(None)
        except StopIteration as done:
            self._answer(request, done.value, keep_alive)
            return
        except Exception:
            _handler_failed(request)
            self._answer(request, _INTERNAL_ERROR, keep_alive)
            return
        self._arm(Phase.RESPONSE, self._limits.response_timeout)
        self._worker = self._loop.create_task(self._finish(coroutine, suspended, request, keep_alive))

    async def _finish(
        self, coroutine: Coroutine[Any, Any, Response], suspended: Any, request: Request, keep_alive: bool
    ) -> None:
        """Complete a handler that suspended, then answer whatever was pipelined behind it, in order."""
        try:
            try:
                response = await _resume(coroutine, suspended)
            except Exception:
                _handler_failed(request)
                response = _INTERNAL_ERROR
            if self._answer(request, response, keep_alive):
                await self._drain()
        finally:
            self._worker = None
        self._after_answers()

    async def _drained(self) -> None:
        """The worker that answers what was pipelined behind a client that has read again."""
        try:
            await self._drain()
        finally:
            self._worker = None
        self._after_answers()

    async def _drain(self) -> None:
        # A client not reading its answers gets no more made until it does (resume_writing goes on).
        while self._pending and not self._closing and not self._write_paused:
            request, keep_alive, head_bytes = self._pending.popleft()
            self._pending_bytes -= head_bytes
            self._resume_reading()
            self._arm(Phase.RESPONSE, self._limits.response_timeout)
            try:
                response = await self._server.handler(request)
            except Exception:
                _handler_failed(request)
                response = _INTERNAL_ERROR
            if not self._answer(request, response, keep_alive):
                return

    def _after_answers(self) -> None:
        if self._closing:
            return
        if self._pending:  # held back until the client reads: still the response phase (armed by _answer)
            return
        if self._failure is not None:
            self._fail(*self._failure)  # now that every earlier request has its answer
            return
        self._arm_waiting()
        if self._held:
            self._resume_reading()

    def _answer(self, request: Request, response: Response, keep_alive: bool) -> bool:
        """Write the answer; False when the connection closes after it."""
        self._write(response, keep_alive, head_only=request.method == "HEAD")
        if not keep_alive:
            self.close()
            return False
        if self._write_paused:
            # The answer is not out until the client reads it: that is still the response phase.
            self._arm(Phase.RESPONSE, self._limits.response_timeout)
        elif not self._busy():
            self._arm_waiting()
        return True

    def _write(self, response: Response, keep_alive: bool, head_only: bool = False) -> None:
        if self._transport is None or self._closing:
            return
        shape = (response.status, response.content_type, len(response.body), keep_alive)
        head = _heads.get(shape)
        if head is None:
            head = _head(*shape)
            if len(_heads) < _MAX_HEADS:
                _heads[shape] = head
        if head_only:
            self._transport.write(head)
        elif len(response.body) > _JOIN_LIMIT:
            # A large body (a /metrics page, shared while cached) is queued as it is, not copied per answer.
            self._transport.write(head)
            self._transport.write(response.body)
        else:
            self._transport.write(head + response.body)

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that could not be parsed, was too large or too slow, then close."""
        if self._busy():
            # Earlier requests are owed their answers first (in order): this one is written after them.
            self._failure = (status, message)
            self._held = b""
            self._stopped = True  # read nothing more
            self._pause_reading()
            return
        telemetry.observe_request("invalid", status, 0.0)
        self._write(Response(status, f"{message}\n".encode(), "text/plain; charset=utf-8"), keep_alive=False)
        self.close()

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None and not self._closing:
            self._reading = False
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading or self._write_paused or self._closing or self._stopped or self._full():
            return
        if self._held:
            held, self._held = self._held, b""
            self._feed(held)
            if self._held or self._closing:
                return
        if self._transport is not None:
            self._reading = True
            self._transport.resume_reading()


# Response heads depend on few things; the common ones are built once.
_MAX_HEADS = 256
_heads: dict[tuple[int, str, int, bool], bytes] = {}


def _head(status: int, content_type: str, length: int, keep_alive: bool) -> bytes:
    connection = "" if keep_alive else "Connection: close\r\n"
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n"
        f"{connection}"
        "Cache-Control: no-cache, private\r\n\r\n"
    ).encode("latin-1")


def _head_too_large(limits: Limits) -> str:
    return f"request head larger than {limits.max_header_bytes} bytes (server.max_header_bytes)"


_handler_failures = LogThrottle(60.0)


def _handler_failed(request: Request) -> None:
    """A handler raised: answered 500; its traceback logged at most once a minute, however often it recurs."""
    suppressed = _handler_failures.allow(None)
    if suppressed is not None:
        log.exception("request %s %s failed%s", request.method, redact(request.target), held_back(suppressed))


class _RequestTooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPServer:
    """Serves `handler` on one address; plain HTTP or TLS (an SSLContext). `name` labels its metrics."""

    def __init__(self, handler: Handler, limits: Limits, name: str = "api") -> None:
        self.handler = handler
        self.limits = limits
        self.name = name
        self.tls: ssl.SSLContext | None = None
        self._connections: set[Connection] = set()
        self._per_source: dict[str, int] = {}  # open connections by source address (entries at zero removed)
        self._server: asyncio.Server | None = None
        self._open = telemetry.CONNECTIONS.labels(name)
        self._refused = telemetry.CONNECTIONS_REFUSED.labels(name)
        self._refusals = LogThrottle(60.0)  # one line a minute, however many are refused

    def admit(self, connection: Connection) -> bool:
        source = connection.source
        if len(self._connections) >= self.limits.max_connections:
            self._refuse(f"{len(self._connections)} connections open", self.limits.connections_key)
            return False
        held = self._per_source.get(source, 0)
        if held >= self.limits.max_connections_per_source:
            self._refuse(f"{held} connections open from {source}", self.limits.per_source_key)
            return False
        self._connections.add(connection)
        self._per_source[source] = held + 1
        self._open.inc()
        return True

    def _refuse(self, what: str, key: str) -> None:
        self._refused.inc()
        suppressed = self._refusals.allow(key)  # a line a minute for each limit, however many sources hit it
        if suppressed is not None:
            log.warning(
                "%s listener: %s, refusing more; raise %s if they are legitimate%s",
                self.name,
                what,
                key,
                held_back(suppressed),
            )

    def holds(self, connection: Connection) -> bool:
        return connection in self._connections

    def release(self, connection: Connection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)
            left = self._per_source[connection.source] - 1
            if left:
                self._per_source[connection.source] = left
            else:
                del self._per_source[connection.source]
            self._open.dec()

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen; return the port (useful when `port` is 0).

        TLS is started by each connection (loop.start_tls) rather than by the listener, so that a
        connection counts, and has a deadline, from accept on, not only once its handshake is done.
        """
        self.tls = tls
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port, backlog=1024)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        await self._server.wait_closed()
