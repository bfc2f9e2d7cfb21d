"""The client side: one asyncio Protocol per accepted connection, httptools callbacks, no framework.

Requests are answered in order. A pipelined request waits (parsed, body buffered within the held-body
limit) until the one before it is answered; reading pauses while one is waiting. The proxy's own errors
always close the connection: the rest of a rejected request's body is never read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, NoReturn

import httptools

from adapter.proxy.exchange import DONE, Exchange
from adapter.proxy.http1 import CONTINUE, HOP_BY_HOP, IDEMPOTENT, REPLACED, connection_tokens, error_response
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from adapter.proxy.server import ProxyServer
    from adapter.proxy.upstream import UpstreamConnection

# Why reading from the client is paused; reading resumes when no reason is left.
_PAUSE_BODY, _PAUSE_UPSTREAM, _PAUSE_PIPELINE = 1, 2, 4
# Bytes a client may send after an upgrade request before the upstream has answered it.
_MAX_EARLY_TUNNEL_BYTES = 64 * 1024
_MAX_PIPELINED = 16

# Request headers the proxy looks at, by kind; _DROP: hop-by-hop or set by the proxy itself (http1.py).
_HOST, _LENGTH, _TE, _CONNECTION, _UPGRADE, _EXPECT, _XFF, _DROP = range(8)
_SPECIAL = {
    **dict.fromkeys(HOP_BY_HOP | REPLACED, _DROP),
    b"host": _HOST,
    b"content-length": _LENGTH,
    b"transfer-encoding": _TE,
    b"connection": _CONNECTION,
    b"upgrade": _UPGRADE,
    b"expect": _EXPECT,
    b"x-forwarded-for": _XFF,
}


_PLAIN_CONNECTION_TOKENS = frozenset({b"close", b"keep-alive", b"upgrade"})
_NO_TOKENS: frozenset[bytes] = frozenset()


class _Rejected(Exception):
    """Raised in a parser callback after the proxy answered an error: stops parsing this connection."""


class ClientConnection(asyncio.Protocol):
    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self._config = server.config
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        # The request whose body is being read, the one being served, and pipelined ones behind it.
        self._parsing: Exchange | None = None
        self._active: Exchange | None = None
        self._waiting: deque[Exchange] = deque()
        self._tunnel: UpstreamConnection | None = None
        self._early: list[bytes] | None = None  # bytes after an upgrade request, until the tunnel is up
        self._pauses = 0
        self._paused_upstream: UpstreamConnection | None = None
        self._head_bytes = 0
        self._max_head = self._config.max_header_bytes + self._config.max_request_line_bytes
        # Limits read on every header, kept here: one attribute lookup instead of two.
        self._max_header_bytes = self._config.max_header_bytes
        self._max_headers = self._config.max_headers
        self._max_url = self._config.max_request_line_bytes
        self._header_timeout = self._config.header_timeout
        self._idle_timeout = self._config.idle_timeout
        self._closed = False
        self._rejected = False
        self._in_headers = False
        # When the header or idle timeout runs out (monotonic seconds, 0: none); the server's sweeper checks it.
        self.deadline = 0.0
        self._forwarded = b""
        self._peer = b""

    # --- asyncio callbacks ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.server.admit(self):
            telemetry.REFUSED_CONNECTIONS.inc()
            self._closed = True
            self.transport.abort()
            return
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]).encode() if peer else b"unknown"
        self._forwarded = b"X-Forwarded-For: %b\r\nX-Forwarded-Proto: http\r\n" % self._peer
        self._arm(self._config.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.transport.write(data)
            return
        if self._early is not None:
            self._early.append(data)
            if sum(map(len, self._early)) > _MAX_EARLY_TUNNEL_BYTES:
                self.abort()
            return
        if self._closed:
            return
        if self._parsing is None:
            # Between bodies everything is head: httptools buffers a header until it ends, so the
            # limit is enforced on the bytes received, not only in on_header.
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            rest = data[upgrade.args[0] :]
            self._early = [rest] if rest else []
        except httptools.HttpParserError as err:
            if not self._rejected:
                self._bad_request(str(err))
        else:
            if self._head_bytes > self._max_head and self._parsing is None and not self._rejected:
                self._refuse(431, f"the request head is larger than {self._config.max_header_bytes} bytes")

    def eof_received(self) -> bool:
        # A half-closed client is treated as gone: nothing reliable can follow.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._cancel_timer()
        self.server.forget(self)
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            # A tunnel the client closed is a finished exchange, not a client that gave up.
            tunnel.close()
            active, self._active = self._active, None
            if active is not None:
                active.response_done(upstream_reusable=False)
        for exchange in (self._parsing, self._active, *self._waiting):
            if exchange is not None:
                exchange.client_gone()
        self._parsing = self._active = None
        self._waiting.clear()

    def pause_writing(self) -> None:
        upstream = self._current_upstream()
        if upstream is not None and not upstream.closed:
            upstream.transport.pause_reading()
            upstream.reading_paused = True
            self._paused_upstream = upstream

    def resume_writing(self) -> None:
        upstream, self._paused_upstream = self._paused_upstream, None
        if upstream is not None and not upstream.closed:
            upstream.transport.resume_reading()
            upstream.reading_paused = False

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._in_headers = True
        self.deadline = monotonic() + self._header_timeout  # _arm, inlined: once per request

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._max_url:
            self._reject(414, f"the request target is longer than {self._config.max_request_line_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        headers.append((name, value))
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self._max_header_bytes:
            self._reject(431, f"the request headers are larger than {self._config.max_header_bytes} bytes")
        if len(headers) > self._max_headers:
            self._reject(431, f"the request has more than {self._config.max_headers} headers")

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._head_bytes = 0
        self.deadline = 0.0  # _cancel_timer, inlined
        exchange = self._exchange()
        self._parsing = exchange
        if self._active is None:
            self._start(exchange)
        else:
            self._waiting.append(exchange)
            if len(self._waiting) >= _MAX_PIPELINED:
                self._pause(_PAUSE_PIPELINE)

    def on_body(self, body: bytes) -> None:
        exchange = self._parsing
        if exchange is not None:
            exchange.body_data(body)

    def on_message_complete(self) -> None:
        exchange, self._parsing = self._parsing, None
        if exchange is not None:
            exchange.body_end()
            if exchange is not self._active and exchange.state != DONE:
                # Pipelined: read no further until the requests before it are answered.
                self._pause(_PAUSE_PIPELINE)

    # --- building an exchange from the parsed head ---

    def _exchange(self) -> Exchange:
        parser = self._parser
        method = parser.get_method()
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            self._reject(505, "only HTTP/1.0 and HTTP/1.1 are served")
        if method == b"CONNECT":
            self._reject(405, "CONNECT is not served by this proxy")
        host: bytes | None = None
        host_line: int | None = None
        forwarded_for = b""
        upgrade = b""
        tokens = _NO_TOKENS  # a new set only when there is a Connection header
        content_length: int | None = None
        chunked = expect_continue = False
        # The request head as pieces, four a header line (name, ": ", value, CRLF), joined once at the end.
        parts = [method, b" ", b"", b" HTTP/1.1\r\n"]
        for name, value in self._headers:
            kind = _SPECIAL.get(name.lower())
            if kind is None:
                parts += (name, b": ", value, b"\r\n")
            elif kind == _HOST:
                if host is not None:
                    self._reject(400, "the request has more than one Host header")
                host = value
                host_line = len(parts)
                parts += (name, b": ", value, b"\r\n")
            elif kind == _LENGTH:
                content_length = int(value)  # llhttp accepted only digits, and only one value
                parts += (name, b": ", value, b"\r\n")
            elif kind == _TE:
                codings = [c.strip().lower() for c in value.split(b",")]
                if codings != [b"chunked"]:
                    self._reject(501, "only Transfer-Encoding: chunked is accepted")
                chunked = True
            elif kind == _CONNECTION:
                tokens = tokens | connection_tokens(value)
            elif kind == _UPGRADE:
                upgrade = value
            elif kind == _EXPECT:
                if value.strip().lower() != b"100-continue":
                    self._reject(417, "only Expect: 100-continue is understood")
                expect_continue = True
            elif kind == _XFF:
                forwarded_for = value
        if chunked and content_length is not None:
            self._reject(400, "Content-Length and Transfer-Encoding together are refused")
        if host is None and version == "1.1":
            self._reject(400, "an HTTP/1.1 request needs a Host header")
        url = self._url
        if url.startswith((b"http://", b"https://")):
            # Absolute form: the authority in the target is the host (RFC 9112 3.2.2).
            scheme_end = url.index(b"//") + 2
            path_start = url.find(b"/", scheme_end)
            host = url[scheme_end:path_start] if path_start != -1 else url[scheme_end:]
            url = url[path_start:] if path_start != -1 else b"/"
            if host_line is not None:
                parts[host_line] = b"Host"
                parts[host_line + 2] = host
        elif not url.startswith(b"/") and not (url == b"*" and method == b"OPTIONS"):
            self._reject(400, "the request target must be a path")
        route = self.server.router.match(host or b"", url)
        if route is None:
            telemetry.ERRORS.labels("", "404").inc()
            self._reject(404, "no route for this host and path")
        is_upgrade = bool(upgrade) and b"upgrade" in tokens
        parts[2] = url
        if tokens and not tokens <= _PLAIN_CONNECTION_TOKENS:
            # Headers the client named in Connection are hop-by-hop too.
            lines = range(4, len(parts), 4)
            parts[4:] = [piece for at in lines if parts[at].lower() not in tokens for piece in parts[at : at + 4]]
        if forwarded_for:
            parts.append(b"X-Forwarded-For: %b, %b\r\nX-Forwarded-Proto: http\r\n" % (forwarded_for, self._peer))
        else:
            parts.append(self._forwarded)
        if host is not None:
            parts += (b"X-Forwarded-Host: ", host, b"\r\n")
        else:
            parts.append(b"Host: %b\r\n" % route.default_host)
        if self.server.via:
            parts.append(b"Via: %b zeroscale\r\n" % version.encode())
        if chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if is_upgrade:
            parts.append(b"Connection: Upgrade\r\nUpgrade: %b\r\n" % upgrade)
        parts.append(b"\r\n")
        http10 = version == "1.0"
        keep_alive = (b"keep-alive" in tokens) if http10 else (b"close" not in tokens)
        return Exchange(
            self,
            route,
            b"".join(parts),
            chunked,
            content_length,
            # After an upgrade request the parser only passes bytes through: the connection cannot be reused.
            keep_alive and not is_upgrade,
            is_upgrade,
            expect_continue,
            http10,
            method == b"HEAD",
            method in IDEMPOTENT,
        )

    def _start(self, exchange: Exchange) -> None:
        self._active = exchange
        route = exchange.route
        if exchange.expect_continue and not exchange.body_done:
            limit = route.limits.max_held_body_bytes
            if (exchange.content_length or 0) > limit and not route.has_usable():
                exchange.fail(413, f"the request body is larger than {limit} bytes while held")
                return
            self.transport.write(CONTINUE)
        route.submit(exchange)

    # --- what exchanges and upstream connections call ---

    def answer(self, exchange: Exchange, code: int, message: str, retry_after: int | None) -> None:
        """An error of the proxy's own for `exchange`, then close (its body may be unread)."""
        if exchange is not self._active or self._closed:
            # Answering out of order would mismatch the responses of the requests before it.
            self.abort()
            return
        self.transport.write(error_response(code, message, retry_after=retry_after))
        self._close()

    def exchange_finished(self, exchange: Exchange, *, reusable: bool) -> None:
        if exchange is not self._active:
            return
        self._active = None
        if self._closed:
            return
        if not reusable or self._early is not None or self.server.draining:
            self._close()
            return
        if self._pauses:
            # Whatever paused reading belonged to the finished exchange.
            self._resume(_PAUSE_PIPELINE | _PAUSE_UPSTREAM | _PAUSE_BODY)
        if self._waiting:
            self._start(self._waiting.popleft())
        elif self._parsing is None:
            self.deadline = monotonic() + self._idle_timeout  # _arm, inlined

    def start_tunnel(self, upstream: UpstreamConnection) -> None:
        self._tunnel = upstream
        early, self._early = self._early or [], None
        for data in early:
            upstream.transport.write(data)

    def tunnel_closed(self) -> None:
        exchange, self._active = self._active, None
        if exchange is not None:
            exchange.response_done(upstream_reusable=False)
        self._close()

    def pause_reading_for_body(self) -> None:
        self._pause(_PAUSE_BODY)

    def resume_reading_for_body(self) -> None:
        self._resume(_PAUSE_BODY)

    def pause_reading_for_upstream(self) -> None:
        self._pause(_PAUSE_UPSTREAM)

    def resume_reading_for_upstream(self) -> None:
        self._resume(_PAUSE_UPSTREAM)

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.abort()

    def shut_down(self) -> None:
        """The grace period is over: the request being served gets 503 (cut off if its response began)."""
        active = self._active
        if active is not None and active.state != DONE:
            active.fail(503, "the proxy is shutting down")
        self._close()

    def close_if_idle(self) -> None:
        """Shutdown: a keep-alive connection between requests is closed now."""
        if self._active is None and self._parsing is None and not self._in_headers:
            self._close()

    # --- internals ---

    def _current_upstream(self) -> UpstreamConnection | None:
        if self._tunnel is not None:
            return self._tunnel
        return self._active.upstream if self._active is not None else None

    def _reject(self, code: int, message: str) -> NoReturn:
        """In a parser callback: refuse the request being parsed, and stop parsing."""
        self._refuse(code, message)
        raise _Rejected(message)

    def _refuse(self, code: int, message: str) -> None:
        """Answer a request the proxy refuses before accepting it; nothing more is read from this client."""
        if code != 404:
            telemetry.ERRORS.labels("", str(code)).inc()
        self._rejected = True
        if self._active is None:
            self.transport.write(error_response(code, message))
            self._close()
        else:
            # Let the request before it finish first.
            self._pause(_PAUSE_PIPELINE)
            self._active.keep_alive = False

    def _bad_request(self, reason: str) -> None:
        exchange = self._parsing
        if exchange is not None and exchange.state != DONE:
            # The body broke off mid-way: the request must not reach the upstream as if complete.
            exchange.fail(400, f"malformed request: {reason}")
            return
        self._rejected = True
        telemetry.ERRORS.labels("", "400").inc()
        if self._active is None:
            self.transport.write(error_response(400, f"malformed request: {reason}"))
            self._close()
        else:
            self._pause(_PAUSE_PIPELINE)
            self._active.keep_alive = False

    def _pause(self, reason: int) -> None:
        if not self._pauses and not self._closed:
            self.transport.pause_reading()
        self._pauses |= reason

    def _resume(self, reason: int) -> None:
        if self._pauses & reason:
            self._pauses &= ~reason
            if not self._pauses and not self._closed:
                self.transport.resume_reading()

    def _arm(self, timeout: float) -> None:
        self.deadline = monotonic() + timeout

    def _cancel_timer(self) -> None:
        self.deadline = 0.0

    def check_deadlines(self, now: float) -> None:
        """Called by the server's sweeper: one pass over all connections replaces a timer per request."""
        if self.deadline and now >= self.deadline:
            self.deadline = 0.0
            self._timed_out()
        active = self._active
        if active is not None and active.upstream is not None:
            active.upstream.check_deadline(now)

    def _timed_out(self) -> None:
        if self._in_headers:
            telemetry.ERRORS.labels("", "408").inc()
            self.transport.write(error_response(408, "the request headers did not arrive in time"))
            self._close()
        elif self._active is None and self._parsing is None:
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._cancel_timer()
            self.transport.close()
