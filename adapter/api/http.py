"""HTTP/1.1 serving at the protocol level: one asyncio Protocol per connection, parsed by httptools.

No framework objects on the request path: a Request is a small slotted object, a Response a
status, a body and a content type, written with one `transport.write`. Requests on a
keep-alive connection are answered in order, one at a time. Every resource is bounded:
connections (`max_connections`), request head size (`max_header_bytes`, answered 431),
body size (answered 413), the time to send a request head (`header_timeout`) and the
time a connection may sit idle between requests (`idle_timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import httptools

from adapter.telemetry import api as telemetry

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 65_536
# Pipelined requests buffered before the connection stops reading.
_MAX_PENDING = 16
_REASONS = {status.value: status.phrase for status in HTTPStatus}


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int
    max_connections: int
    header_timeout: float
    idle_timeout: float


class Request:
    __slots__ = ("connection", "headers", "method", "target")

    def __init__(self, connection: Connection, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        self.connection = connection
        self.method = method
        self.target = target  # path and query, still percent-encoded
        self.headers = headers  # (lower-cased name, value), in order, repeated names kept

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
def _resume(coroutine: Coroutine[Any, Any, Response], suspended: Any) -> Generator[Any, Any, Response]:
    """Go on driving a coroutine that already ran its first step (what `yield from` would do)."""
    while True:
        try:
            sent = yield suspended
        except BaseException as error:  # cancellation included: the coroutine gets to handle it
            try:
                suspended = coroutine.throw(error)
            except StopIteration as done:
                return cast(Response, done.value)
        else:
            try:
                suspended = coroutine.send(sent)
            except StopIteration as done:
                return cast(Response, done.value)


class Connection(asyncio.Protocol):
    """One client connection. `peer_certificate` is the DER client certificate, if one was presented."""

    def __init__(self, server: HTTPServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body_bytes = 0
        self._pending: deque[tuple[Request, bool]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline: float | None = None
        self._reading = True
        self._write_paused = False
        self._closing = False
        self.peer_certificate: bytes | None = None
        # Per-connection memo for the authenticator (keyed by what it depends on).
        self.auth_memo: object = None

    # -- connection lifetime ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        if not self._server.admit(self):
            telemetry.CONNECTIONS_REFUSED.inc()
            self._transport.abort()
            return
        ssl_object = transport.get_extra_info("ssl_object")
        if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
            self.peer_certificate = ssl_object.getpeercert(binary_form=True)
        self._set_deadline(self._server.limits.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._server.release(self)
        self._clear_deadline()
        if self._timer is not None:
            self._timer.cancel()
        if self._worker is not None:
            self._worker.cancel()

    def pause_writing(self) -> None:
        # A client that does not read its answers stops being read from.
        self._write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if len(self._pending) < _MAX_PENDING:
            self._resume_reading()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as err:
            # httptools wraps what a callback raised; a size bound hit is one of those.
            cause = err.__cause__ or err.__context__
            if isinstance(cause, _RequestTooLarge):
                self._fail(cause.status, str(cause))
            else:
                self._fail(400, "malformed HTTP request")

    def close(self) -> None:
        if self._transport is not None and not self._closing:
            self._closing = True
            self._transport.close()

    # -- timers ----------------------------------------------------------------------------
    # One deadline per connection, moved by plain assignment on every request; a single timer
    # follows it lazily, so the hot path creates and cancels no timer handles.

    def _set_deadline(self, seconds: float) -> None:
        deadline = self._loop.time() + seconds
        self._deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _clear_deadline(self) -> None:
        self._deadline = None

    def _on_timer(self) -> None:
        self._timer = None
        if self._deadline is None:
            return
        if self._loop.time() >= self._deadline:
            self.close()
        else:
            self._timer_at = self._deadline
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._body_bytes = 0
        if not self._pending and self._worker is None:
            self._set_deadline(self._server.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._clear_deadline()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise _RequestTooLarge(413, f"request body larger than {MAX_BODY_BYTES} bytes")

    def on_message_complete(self) -> None:
        if self._closing:
            return
        method = self._parser.get_method().decode("ascii", "replace")
        request = Request(self, method, self._url.decode("latin-1"), self._headers)
        keep_alive = self._parser.should_keep_alive()
        if self._worker is None:
            self._start(request, keep_alive)
            return
        self._pending.append((request, keep_alive))
        if len(self._pending) >= _MAX_PENDING:
            self._pause_reading()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._server.limits.max_header_bytes:
            raise _RequestTooLarge(431, f"request head larger than {self._server.limits.max_header_bytes} bytes")

    # -- answering ----------------------------------------------------------------------------

    def _start(self, request: Request, keep_alive: bool) -> None:
        """Run the handler's first step right here; most answers (cached values) complete in it.

        Like Python 3.12's eager tasks: no Task is made unless the handler really waits
        (a cold series, a TokenReview), which keeps the per-request cost low.
        """
        coroutine = self._server.handler(request)
        try:
            suspended = coroutine.send(None)
        except StopIteration as done:
            self._answer(request, done.value, keep_alive)
            return
        except Exception:
            log.exception("request %s %s failed", request.method, request.target)
            self._answer(request, _INTERNAL_ERROR, keep_alive)
            return
        self._worker = self._loop.create_task(self._finish(coroutine, suspended, request, keep_alive))

    async def _finish(
        self, coroutine: Coroutine[Any, Any, Response], suspended: Any, request: Request, keep_alive: bool
    ) -> None:
        """Complete a handler that suspended, then answer whatever was pipelined behind it, in order."""
        try:
            try:
                response = await _resume(coroutine, suspended)
            except Exception:
                log.exception("request %s %s failed", request.method, request.target)
                response = _INTERNAL_ERROR
            if not self._answer(request, response, keep_alive):
                return
            while self._pending and not self._closing:
                request, keep_alive = self._pending.popleft()
                if not self._write_paused and len(self._pending) < _MAX_PENDING:
                    self._resume_reading()
                try:
                    response = await self._server.handler(request)
                except Exception:
                    log.exception("request %s %s failed", request.method, request.target)
                    response = _INTERNAL_ERROR
                if not self._answer(request, response, keep_alive):
                    return
        finally:
            self._worker = None

    def _answer(self, request: Request, response: Response, keep_alive: bool) -> bool:
        """Write the answer; False when the connection closes after it."""
        self._write(response, keep_alive, head_only=request.method == "HEAD")
        if not keep_alive:
            self.close()
            return False
        if not self._pending:
            self._set_deadline(self._server.limits.idle_timeout)
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
        self._transport.write(head if head_only else head + response.body)

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that could not be parsed or was too large, then close."""
        telemetry.observe_request("invalid", status, 0.0)
        self._write(Response(status, f"{message}\n".encode(), "text/plain; charset=utf-8"), keep_alive=False)
        self.close()

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and self._transport is not None and not self._closing:
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


class _RequestTooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPServer:
    """Serves `handler` on one address; plain HTTP or TLS (an SSLContext)."""

    def __init__(self, handler: Handler, limits: Limits) -> None:
        self.handler = handler
        self.limits = limits
        self._connections: set[Connection] = set()
        self._server: asyncio.Server | None = None

    def admit(self, connection: Connection) -> bool:
        if len(self._connections) >= self.limits.max_connections:
            return False
        self._connections.add(connection)
        telemetry.CONNECTIONS.inc()
        return True

    def release(self, connection: Connection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)
            telemetry.CONNECTIONS.dec()

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen; return the port (useful when `port` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            ssl=tls,
            # A peer gets header_timeout for the TLS handshake and for answering our close_notify.
            ssl_handshake_timeout=self.limits.header_timeout if tls else None,
            ssl_shutdown_timeout=self.limits.header_timeout if tls else None,
            backlog=1024,
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        await self._server.wait_closed()
