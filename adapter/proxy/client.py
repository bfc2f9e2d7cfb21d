"""The client side: one asyncio Protocol per accepted connection, httptools callbacks, no framework.

Requests are answered in order. A pipelined request waits (parsed, body buffered within the held-body
limit) until the one before it is answered; reading pauses while one is waiting, and bytes read past the
request being answered are kept unparsed, at most `max_pipelined_bytes` of them. The proxy's own errors
always close the connection: the rest of a rejected request's body is never read.

Every phase has a deadline, checked by the server's sweeper (one task for all connections, no timer per
request): the head (`header_timeout`), the body (the route's `body_timeout`), the response (the upstream's
`response_timeout`, and `send_timeout` for a client that stops reading), the idle keep-alive wait
(`idle_timeout`) and an idle tunnel (the route's `tunnel_idle_timeout`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, NoReturn

import httptools

from adapter.proxy.exchange import DONE, Exchange
from adapter.proxy.flow import Flow
from adapter.proxy.h2client import H2ClientConnection
from adapter.proxy.h2wire import PREFACE
from adapter.proxy.headers import (
    CONTENT_UNDEFINED,
    IDEMPOTENT,
    MessageRefused,
    forwarded_request_head,
    read_request_head,
)
from adapter.proxy.http1 import CONTINUE, error_response, own_response
from adapter.proxy.trace import h1_parts, request_span
from adapter.telemetry import proxy as telemetry
from adapter.telemetry import tracing

if TYPE_CHECKING:
    from adapter.proxy.choices import OwnAnswer
    from adapter.proxy.route import Route
    from adapter.proxy.server import ProxyServer
    from adapter.proxy.table import Listener
    from adapter.proxy.upstream import UpstreamConnection

# Why reading from the client is paused; reading resumes when no reason is left.
_PAUSE_BODY, _PAUSE_UPSTREAM, _PAUSE_PIPELINE = 1, 2, 4
# Bytes a client may send after an upgrade request before the upstream has answered it.
_MAX_EARLY_TUNNEL_BYTES = 64 * 1024
_MAX_PIPELINED = 16
# A chunked body is parsed in slices of at most this, so parsing can stop soon after the request being
# served: what follows is kept as bytes (bounded by max_pipelined_bytes), not as parsed requests.
_SLICE = 16 * 1024
_HEAD_END = b"\r\n\r\n"
# How long a closing connection keeps reading (and dropping) what the client still sends.
_LINGER = 2.0


class _StopParsing(Exception):
    """Raised in a parser callback after the proxy answered an error: stops parsing this connection."""


class ClientConnection(asyncio.Protocol):
    # Slots, not a __dict__: a proxy holds many idle connections, each one of these.
    __slots__ = (
        "_active",
        "_ahead",
        "_ahead_bytes",
        "_body_left",
        "_chunk_empty",
        "_closed",
        "_config",
        "_early",
        "_early_bytes",
        "_forwarded",
        "_forwarded_node",
        "_head_bytes",
        "_header_bytes",
        "_header_timeout",
        "_headers",
        "_idle_timeout",
        "_in_headers",
        "_listener",
        "_max_head",
        "_max_header_bytes",
        "_max_headers",
        "_max_url",
        "_parser",
        "_parsing",
        "_pauses",
        "_peer",
        "_refusal",
        "_rejected",
        "_sniff",
        "_tunnel",
        "_tunnel_deadline",
        "_tunnel_idle",
        "_tunnel_route",
        "_tunnel_seen",
        "_url",
        "_waiting",
        "deadline",
        "flow",
        "server",
        "transport",
        "write_deadline",
    )

    def __init__(self, server: ProxyServer, listener: Listener) -> None:
        """`listener`: the routing of the port this connection came in on, read per request (the control plane
        swaps its table whole: adapter/proxy/table.py)."""
        self.server = server
        self._listener = listener
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
        self._early_bytes = 0  # their length, kept as they come (re-summing per segment is quadratic)
        self._pauses = 0
        # Bytes and back-pressure to and from the upstream connection serving this client.
        self.flow = Flow(self)
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
        # The connection's first bytes, kept while they may be the HTTP/2 preface (None: it is HTTP/1.1).
        self._sniff: bytes | None = b"" if self._config.http2.enabled else None
        self._in_headers = False
        # When the header or idle timeout runs out (monotonic seconds, 0: none); the server's sweeper checks it.
        self.deadline = 0.0
        self._forwarded = b""
        self._forwarded_node = b""
        self._peer = b""
        # Bytes read past the request being answered, unparsed until it is (None: none kept).
        self._ahead: list[bytes] | None = None
        self._ahead_bytes = 0
        # Bytes of the Content-Length body being parsed still to come (read stepwise: see _feed_stepwise).
        self._body_left = 0
        # A chunk header was read and no data after it yet: the last chunk's trailers may be coming.
        self._chunk_empty = False
        # The proxy's answer to a refused pipelined request, written once the requests before it are answered.
        self._refusal: tuple[int, str] | None = None
        # When a client that stopped reading its response is cut off (monotonic seconds, 0: it reads).
        self.write_deadline = 0.0
        # A tunnel's activity (flow.reads, both directions) as last seen by the sweeper, and until when it may
        # stay the same.
        self._tunnel_seen = -1
        self._tunnel_deadline = 0.0
        self._tunnel_idle = 0.0
        self._tunnel_route: Route | None = None

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
        # RFC 7239 6: an IPv6 node is quoted and bracketed.
        self._forwarded_node = b'"[%b]"' % self._peer if b":" in self._peer else self._peer
        self._set_deadline(self._config.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._sniff is not None:
            data = self._sniff + data
            if PREFACE.startswith(data[: len(PREFACE)]):
                if len(data) < len(PREFACE):
                    self._sniff = data
                    return
                self._to_http2(data)
                return
            self._sniff = None
        if self._tunnel is not None:
            self.flow.relay_to_upstream(data)
            return
        if self._early is not None:
            self._keep_early(data)
            return
        if self._closed or self._rejected:
            return
        parsing = self._parsing
        if self._ahead is not None or (parsing is not None and parsing is not self._active):
            # Past the request being answered (a waiting request's body included): kept as bytes.
            self._keep_ahead(data)
            return
        if parsing is None:
            end = data.find(_HEAD_END)
            if end == -1 or end == len(data) - 4:
                # The common case: one request without a body, or part of a head.
                self._feed(data)
                return
        self._feed_stepwise(data)

    def _to_http2(self, data: bytes) -> None:
        """The connection speaks HTTP/2 (prior knowledge): it is an H2ClientConnection's from now on."""
        self._closed = True
        self.server.forget(self)
        connection = H2ClientConnection(self.server, self._listener, self.transport, self._peer)
        self.server.connections.add(connection)
        self.transport.set_protocol(connection)
        connection.start(data)

    def _feed(self, data: bytes | memoryview) -> None:
        if self._parsing is None or self._chunk_empty:
            # Between bodies everything is head: httptools buffers a header until it ends, so the
            # limit is enforced on the bytes received, not only in on_header. The same for a chunked body's
            # trailer section (httptools buffers trailer lines too): bytes fed while a chunk header has been
            # read and no data followed are counted, and a chunk header parsed in them starts the count anew
            # (so a chunk's data and the next chunk's header in one read are never taken for trailers).
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            rest = data[upgrade.args[0] :]
            self._early = [bytes(rest)] if rest else []
            self._early_bytes = len(rest)
        except httptools.HttpParserError as err:
            if not self._rejected:
                self._bad_request(str(err))
        else:
            if self._head_bytes > self._max_head and not self._rejected:
                if self._parsing is None:
                    self._refuse(
                        431,
                        f"the request head is larger than {self._config.max_header_bytes} bytes"
                        " (proxy.max_header_bytes)",
                    )
                elif self._chunk_empty:
                    self._refuse(
                        431,
                        f"the request trailers are larger than {self._config.max_header_bytes} bytes"
                        " (proxy.max_header_bytes)",
                    )

    def _feed_stepwise(self, data: bytes) -> None:
        """A read holding more than one head: parse it message by message (a head, then its body), and keep
        what lies past the request being answered unparsed, so pipelining costs bytes, not parsed requests."""
        view = memoryview(data)
        size = len(data)
        at = 0
        while at < size:
            parsing = self._parsing
            if parsing is None:
                end = data.find(_HEAD_END, at)
                stop = size if end == -1 else end + 4
            elif parsing.chunked or self._body_left <= 0:
                stop = min(size, at + _SLICE)
            else:
                stop = min(size, at + self._body_left)
            self._feed(view[at:stop])
            at = stop
            if self._closed or self._rejected or at >= size:
                return
            if self._early is not None:
                self._keep_early(bytes(view[at:]))
                return
            if self._active is not None and (self._waiting or self._parsing is None):
                self._keep_ahead(bytes(view[at:]))
                return

    def _keep_early(self, data: bytes) -> None:
        assert self._early is not None
        self._early.append(data)
        self._early_bytes += len(data)
        if self._early_bytes > _MAX_EARLY_TUNNEL_BYTES:
            self.abort()

    def _keep_ahead(self, data: bytes) -> None:
        """Bytes past the request being answered: kept unparsed, reading paused, within max_pipelined_bytes."""
        if self._ahead is None:
            self._ahead = []
            self._pause(_PAUSE_PIPELINE)
        self._ahead.append(data)
        self._ahead_bytes += len(data)
        if self._ahead_bytes > self._config.max_pipelined_bytes:
            self._ahead = None
            self._ahead_bytes = 0
            telemetry.LIMIT_HITS.labels("", "max_pipelined_bytes").inc()
            self._refuse(
                503,
                f"more than {self._config.max_pipelined_bytes} bytes were sent ahead of an unanswered request "
                "(raise proxy.max_pipelined_bytes, or wait for each response)",
            )

    def _parse_ahead(self) -> None:
        """The request being answered is done: parse what was read past it."""
        ahead, self._ahead = self._ahead, None
        self._ahead_bytes = 0
        if ahead:
            self.data_received(b"".join(ahead))

    def eof_received(self) -> bool:
        # A half-closed client is treated as gone: nothing reliable can follow.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._clear_deadline()
        self.server.forget(self)
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            tunnel.close()
        self._end_tunnel()
        for exchange in (self._parsing, self._active, *self._waiting):
            if exchange is not None:
                exchange.client_gone()
        self._parsing = self._active = None
        self._waiting.clear()

    def pause_writing(self) -> None:
        # The client reads slower than the upstream answers: fine for a while, not forever.
        self.write_deadline = monotonic() + self._config.send_timeout
        self.flow.client_slow()

    def resume_writing(self) -> None:
        self.write_deadline = 0.0
        self.flow.client_ready()

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._in_headers = True
        # _set_deadline, inlined: docs/architecture.md#hot-inlined-deadline
        self.deadline = monotonic() + self._header_timeout

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._max_url:
            self._reject(
                414,
                f"the request target is longer than {self._config.max_request_line_bytes} bytes"
                " (proxy.max_request_line_bytes)",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self._headers
        headers.append((name, value))
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self._max_header_bytes:
            self._reject(
                431,
                f"the request headers are larger than {self._config.max_header_bytes} bytes (proxy.max_header_bytes)",
            )
        if len(headers) > self._max_headers:
            self._reject(431, f"the request has more than {self._config.max_headers} headers (proxy.max_headers)")

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._head_bytes = 0
        self.deadline = 0.0  # _clear_deadline, inlined: docs/architecture.md#hot-inlined-deadline
        exchange = self._exchange()
        self._parsing = exchange
        self._body_left = exchange.content_length or 0
        if self._active is None:
            self._start(exchange)
        else:
            self._waiting.append(exchange)
            if len(self._waiting) >= _MAX_PIPELINED:
                self._pause(_PAUSE_PIPELINE)

    def on_chunk_header(self) -> None:
        self._chunk_empty = True
        self._head_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._chunk_empty = False
        self._body_left -= len(body)
        exchange = self._parsing
        if exchange is not None:
            exchange.body_data(body)

    def on_message_complete(self) -> None:
        self._chunk_empty = False
        exchange, self._parsing = self._parsing, None
        if exchange is self._active:
            self.deadline = 0.0  # the body is in: its deadline is over
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
        try:
            request = read_request_head(method, version, self._url, self._headers)
        except MessageRefused as refused:
            if refused.framing_reason:
                self._refuse_framing(refused.framing_reason, refused.message)
            self._reject(refused.code, refused.message)
        # A plain tuple, unpacked: docs/architecture.md#hot-head-tuples.
        _, host, url, http10, chunked, content_length, expect_continue, keep_alive, upgrade, _, _ = request
        route = self._listener.router.match(host or b"", url, self._headers)
        if route is None:
            telemetry.ERRORS.labels("", "404").inc()
            self._reject(404, "no route for this host and path")
        if upgrade and route.tunnels >= route.limits.max_tunnels:
            telemetry.LIMIT_HITS.labels(route.name, "max_tunnels").inc()
            self._reject(
                503,
                f"route {route.name} has {route.limits.max_tunnels} open tunnels (raise its limits.max_tunnels)",
            )
        span = None
        tracer = tracing.TRACER  # read once per request: off, nothing else of tracing runs for it
        if tracer is not None:
            span = request_span(tracer, method, url, host, "1.1", route, self._headers)
            h1_parts(request[0], span)
        head = forwarded_request_head(
            request, self._peer, self._forwarded, self._forwarded_node, route.default_host, self.server.via, version
        )
        exchange = Exchange(
            self,
            route,
            head,
            chunked,
            content_length,
            keep_alive,
            bool(upgrade),
            expect_continue,
            http10,
            method == b"HEAD",
            method in IDEMPOTENT,
            not (chunked or content_length) or method not in CONTENT_UNDEFINED,
            span,
        )
        choices = route.choices
        if choices is not None:
            # Read now, while its headers are at hand; decided when it is served (Route.answers_itself).
            exchange.choice = choices.classify(method, url, self._headers)
        return exchange

    def _refuse_framing(self, reason: str, message: str) -> NoReturn:
        telemetry.REFUSED_MESSAGES.labels("request", reason).inc()
        self._reject(400, message)

    def _start(self, exchange: Exchange) -> None:
        self._active = exchange
        route = exchange.route
        if exchange.choice is not None and route.answers_itself(exchange):
            return
        if not exchange.body_done and (exchange.chunked or exchange.content_length):
            # The body's deadline starts when the request is served: a pipelined one waited on the proxy.
            self.deadline = monotonic() + route.limits.body_timeout
        if exchange.expect_continue and not exchange.body_done:
            limit = route.limits.max_held_body_bytes
            if (exchange.content_length or 0) > limit and not route.has_usable():
                exchange.fail(
                    413, f"the request body is larger than {limit} bytes while held (limits.max_held_body_bytes)"
                )
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

    def answer_here(self, exchange: Exchange, answer: OwnAnswer) -> None:
        """A configured answer of the proxy's own (docs/architecture.md#cold-start-choices). The connection goes on
        when the request has no body left to read and keep-alive allows; otherwise it closes after the answer, so
        the rest of a body is never read as a next request."""
        if exchange is not self._active or self._closed:
            self.abort()
            return
        whole = exchange.body_done or not (exchange.chunked or exchange.content_length)
        keep = whole and exchange.keep_alive and not exchange.upgrade and not self.server.draining
        response = own_response(
            answer.status, answer.fields, answer.body, head=exchange.is_head, close=not keep, http10=exchange.http10
        )
        self.transport.write(response)
        if not keep:
            self._close()
            return
        # Finished on the loop's next turn, as a forwarded response is: the parser completes this request's message
        # first (it is served from inside its head's callback), and what follows is parsed as the next request.
        asyncio.get_running_loop().call_soon(self.exchange_finished, exchange, True)

    def exchange_finished(self, exchange: Exchange, reusable: bool) -> None:
        if exchange is not self._active:
            return
        self._active = None
        if self._closed:
            return
        if not reusable or self._early is not None or self.server.draining:
            self._close()
            return
        if self._waiting:
            following = self._waiting.popleft()
            if self._refusal is not None and following is self._parsing:
                # Its body was cut short by the refusal: the refusal is its answer.
                self._parsing = None
                self._active = following
                following.fail(*self._refusal)
                return
            self._start(following)
            if self._waiting:
                return
        if self._refusal is not None:
            # Every request before the refused one is answered: now its answer, in order.
            if self._active is None:
                self._write_refusal(*self._refusal)
            return
        if self._pauses:
            # Whatever paused reading belonged to the finished exchange.
            self._resume(_PAUSE_PIPELINE | _PAUSE_UPSTREAM | _PAUSE_BODY)
        if self._ahead is not None:
            self._parse_ahead()
        elif self._parsing is None and self._active is None:
            # _set_deadline, inlined: docs/architecture.md#hot-inlined-deadline
            self.deadline = monotonic() + self._idle_timeout

    def start_tunnel(self, upstream: UpstreamConnection) -> None:
        """The upstream relayed 101: from here bytes pass through, and the request is no longer pending.

        A tunnel leaves the held/in-flight counts and its endpoint's request slot (it is not a request
        waiting for a replica); it is counted in the route's open tunnels instead, and closed when idle.
        """
        exchange, self._active = self._active, None
        self._tunnel = upstream
        if exchange is not None:
            route = self._tunnel_route = exchange.route
            route.tunnel_opened()
            self._tunnel_idle = route.limits.tunnel_idle_timeout
            exchange.tunnel_opened()
        early, self._early = self._early or [], None
        for data in early:
            self.flow.to_upstream(data)

    def tunnel_closed(self) -> None:
        self._tunnel = None
        self._end_tunnel()
        self._close()

    def _end_tunnel(self) -> None:
        route, self._tunnel_route = self._tunnel_route, None
        if route is not None:
            route.tunnel_closed()

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

    def _reject(self, code: int, message: str) -> NoReturn:
        """In a parser callback: refuse the request being parsed, and stop parsing."""
        self._refuse(code, message)
        raise _StopParsing(message)

    def _refuse(self, code: int, message: str) -> None:
        """Nothing more is read from this client; the answer goes out in order.

        A request whose body this cuts short gets the answer itself: now if it is being served, else when
        its turn comes. Otherwise the answer follows the requests before it (at once if there are none).
        """
        self._rejected = True
        self._ahead = None
        parsing = self._parsing
        if parsing is not None and parsing.state != DONE and parsing is self._active:
            parsing.fail(code, message)
        elif self._active is None:
            self._write_refusal(code, message)
        else:
            self._refusal = (code, message)
            self._pause(_PAUSE_PIPELINE)

    def _write_refusal(self, code: int, message: str) -> None:
        if code != 404:  # counted with its route where the route is known
            telemetry.ERRORS.labels("", str(code)).inc()
        self.transport.write(error_response(code, message))
        self._close()

    def _bad_request(self, reason: str) -> None:
        # A body that broke off mid-way is failed with it, so it never reaches the upstream as if complete;
        # a pipelined one gets its 400 in order, after the answers before it (an abort would lose those).
        self._refuse(400, f"malformed request: {reason}")

    def _pause(self, reason: int) -> None:
        if not self._pauses and not self._closed:
            self.transport.pause_reading()
        self._pauses |= reason

    def _resume(self, reason: int) -> None:
        if self._pauses & reason:
            self._pauses &= ~reason
            if not self._pauses and not self._closed:
                self.transport.resume_reading()

    def _set_deadline(self, timeout: float) -> None:
        self.deadline = monotonic() + timeout

    def _clear_deadline(self) -> None:
        self.deadline = 0.0

    def check_deadlines(self, now: float) -> None:
        """Called by the server's sweeper: one pass over all connections replaces a timer per request."""
        if self.deadline and now >= self.deadline:
            self.deadline = 0.0
            self._timed_out()
        if self.write_deadline and now >= self.write_deadline:
            self._write_timed_out()
        if self._tunnel is not None:
            self._check_tunnel(now)
            return
        active = self._active
        if active is not None and active.upstream is not None:
            active.upstream.check_deadline(now)

    def _timed_out(self) -> None:
        if self._closed:
            self.transport.abort()  # the lingering close is over
            return
        active = self._active
        if self._sniff:
            # Part of the HTTP/2 preface (or of a method that starts like it) and nothing more: a head that did not
            # arrive, counted as one; no answer, since the protocol is not known.
            telemetry.LIMIT_HITS.labels("", "header_timeout").inc()
            self._close()
        elif self._in_headers and self._parsing is None:
            telemetry.LIMIT_HITS.labels("", "header_timeout").inc()
            self._refuse(408, "the request headers did not arrive in proxy.header_timeout")
        elif active is not None and active is self._parsing and active.state != DONE:
            # The body stopped short: answered at once, so it stops counting as in flight now.
            limits = active.route.limits
            telemetry.LIMIT_HITS.labels(active.route.name, "body_timeout").inc()
            active.fail(
                408,
                f"the request body did not arrive within {limits.body_timeout:g} s "
                f"(route {active.route.name}: limits.body_timeout)",
            )
        elif active is None and self._parsing is None:
            self._close()

    def _write_timed_out(self) -> None:
        """The client has read nothing for send_timeout: cut it off (its exchange ends as a client gone)."""
        self.write_deadline = 0.0
        route = self._active.route.name if self._active is not None else ""
        telemetry.LIMIT_HITS.labels(route, "send_timeout").inc()
        self.abort()

    def _check_tunnel(self, now: float) -> None:
        """Closes a tunnel after tunnel_idle_timeout without a byte in either direction."""
        reads = self.flow.reads
        if reads != self._tunnel_seen:
            self._tunnel_seen = reads
            self._tunnel_deadline = now + self._tunnel_idle
        elif now >= self._tunnel_deadline:
            route = self._tunnel_route
            telemetry.LIMIT_HITS.labels(route.name if route else "", "tunnel_idle_timeout").inc()
            self.abort()

    def _close(self) -> None:
        """Close after the last answer: a lingering close, so that answer is not lost to a reset.

        Closing a socket with unread bytes (a refused body, pipelined requests) sends a reset that can
        destroy the answer before the client reads it; so the write side is shut, and what still comes
        is read and dropped until the client closes, for at most _LINGER seconds (then: abort).
        """
        if not self._closed:
            self._closed = True
            self.write_deadline = 0.0
            transport = self.transport
            if transport.is_closing() or not transport.can_write_eof():
                transport.close()
                return
            self.deadline = monotonic() + _LINGER
            transport.write_eof()
            self._pauses = 0
            transport.resume_reading()
