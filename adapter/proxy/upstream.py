"""The upstream side: one Protocol per connection to an endpoint, and each endpoint's keep-alive pool.

A response is parsed with httptools and re-framed for the client as it arrives (never buffered whole):
hop-by-hop headers dropped, chunked kept chunked, a close-delimited body chunked for HTTP/1.1 clients.
Writes produced by one `data_received` go to the client in one call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import TYPE_CHECKING

import httptools

from adapter.k8s_wire.endpoint_ip import NOT_AN_IP, endpoint_refusal
from adapter.kube.endpointslices import refusal
from adapter.proxy.client import ClientConnection
from adapter.proxy.exchange import ASSIGNED
from adapter.proxy.h2upstream import H2UpstreamConnection, H2UpstreamStream
from adapter.proxy.headers import HOP_BY_HOP, RESPONSE_SPECIAL_LENGTHS, MessageRefused, forwarded_response_head
from adapter.proxy.http1 import CHUNK_END, chunk
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from adapter.proxy.exchange import Exchange
    from adapter.proxy.flow import Flow
    from adapter.proxy.h2client import H2Stream
    from adapter.proxy.route import Route

log = logging.getLogger(__name__)
# Endpoint.refused: the pause after an HTTP/2 upstream's REFUSED_STREAM, doubling while refusals come within a second.
_MIN_REFUSAL_PAUSE, _MAX_REFUSAL_PAUSE, _REFUSALS_FORGOTTEN = 0.005, 1.0, 1.0


class _HeadResponse:
    """Parser callbacks for the answer to a HEAD request: httptools cannot be told there is no body,
    so this parser is used for one response and dropped after its head. Any byte past that head (a
    body, a second response) is an upstream error: the connection's framing can no longer be trusted."""

    __slots__ = ("connection", "on_header", "on_headers_complete")

    def __init__(self, connection: UpstreamConnection) -> None:
        self.connection = connection
        self.on_header = connection.on_header
        self.on_headers_complete = connection.on_headers_complete

    def on_message_begin(self) -> None:
        if self.connection.complete is not None:
            raise MessageRefused("sent a second response after the head of a HEAD response", "bytes_after_head")

    def on_body(self, _body: bytes) -> None:
        raise MessageRefused("sent a body after the head of a HEAD response", "bytes_after_head")

    def on_chunk_header(self) -> None:
        raise MessageRefused("sent a body after the head of a HEAD response", "bytes_after_head")


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an endpoint, serving one exchange at a time: the upstream end of an exchange.
    Its one job is the response: it parses what the upstream sends (httptools), has headers.py re-frame the head
    and passes head and body on to the client end through the exchange's `Flow` as they arrive, and ends the
    exchange (`response_done`), or fails it with 502/504 when the upstream breaks or is late.

    Its `Endpoint` dials it and keeps it idle between exchanges (keep-alive); when a `Route` assigns an exchange to
    the endpoint, `Endpoint.dispatch` binds an idle connection to it (`use_for`) or dials one, and the exchange
    sends its request on it (`Exchange.attach`). The server's sweeper checks its response deadline through the
    client connection it serves. An h2c route's upstream end is h2upstream.py's `H2UpstreamStream`."""

    # One exchange at a time (h2upstream.H2UpstreamStream: many on one connection).
    multiplexed = False

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.exchange: Exchange | None = None
        self.closed = False
        # The client side this connection serves (set in use_for, paired by the exchange, unpaired when pooled,
        # closed or the response ends).
        self.flow: Flow | H2Stream | None = None
        self._parser = httptools.HttpResponseParser(self)
        # The response head as it arrives: end-to-end header lines as pieces (name, ": ", value, CRLF) after a
        # slot for the status line, the hop-by-hop headers (lower-cased name, value), whether Content-Length came.
        self._lines: list[bytes] = [b""]
        self._hop: list[tuple[bytes, bytes]] = []
        self._has_length = False
        self._out: list[bytes] = []
        # The response head went to the flow: what the parser produces is for the client now.
        self._sink = False
        self.interim = False
        self._upgrading = False
        self._client_chunked = False
        self._until_close = False
        self._tunnel: ClientConnection | None = None
        # When the response head is due, then when the body must have moved again (monotonic seconds, 0: not
        # waiting), and the timeout it came from; reads are counted so the sweeper sees a body moving.
        self.deadline = 0.0
        self._timeout = 0.0
        self._reads = 0
        self._reads_seen = 0
        # A response ended in the read being parsed (the value: whether the connection may be reused). It is
        # finished after that read, once the parser has shown that no byte follows it: a pooled connection
        # must hold nothing that could be read as the next request's response.
        self.complete: bool | None = None
        # Bytes received for the response head (interim answers included) of the exchange, then for its trailers.
        self._head_bytes = 0
        # A chunk header was parsed and no data followed yet: the last chunk's trailer section may be coming.
        self._chunk_empty = False
        # The response head is in _out, not yet written to the client (a refusal may still replace it).
        self._unsent_head = False

    # --- asyncio callbacks ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            if self.flow is not None:
                self.flow.relay_to_client(data)
            return
        if self.exchange is None:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.close()
            return
        self._reads += 1
        exchange = self.exchange
        # httptools buffers a header line until it ends: the bound on a head (and on trailers) is on the bytes
        # received while one is being read. A chunk header parsed in this read starts the count anew.
        if not exchange.response_started or self._chunk_empty:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._flush()
            self._start_tunnel(data[upgrade.args[0] :])
            return
        except httptools.HttpParserError as err:
            if self.complete is not None and not exchange.is_head:
                # The response was whole and went out as it came; what followed it is for no one.
                telemetry.REFUSED_MESSAGES.labels("response", "bytes_after_response").inc()
                self.complete = False
                self._finish()
                return
            self._refused(err.__context__ if isinstance(err.__context__, MessageRefused) else None)
            return
        if self.complete is not None:
            self._finish()
        elif self._out:
            self._flush()
        if (
            (self._chunk_empty or not exchange.response_started)
            and self._head_bytes > exchange.route.limits.max_response_head_bytes
            and self.exchange is exchange
        ):
            self._head_too_large(exchange)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._clear_deadline()
        self.endpoint.forget(self)
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            self._unpair()
            tunnel.tunnel_closed()
            return
        exchange = self.exchange
        if exchange is None:
            self._unpair()
            return
        if self._until_close and exchange.response_started:
            # A close-delimited body ends with the connection: that is the whole response.
            if self._client_chunked:
                self._out.append(CHUNK_END)
            self._flush()
            self.exchange = None
            self.close()
            exchange.response_done()
            return
        self._flush()
        self._lost("closed the connection")

    def pause_writing(self) -> None:
        if self.flow is not None:
            self.flow.upstream_slow()

    def resume_writing(self) -> None:
        if self.flow is not None:
            self.flow.upstream_ready()

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        if self.complete is not None:
            # A second message in the read that ended the response: on a pooled connection it would be read as
            # the answer to the next request sent on it (another client's).
            raise MessageRefused("sent bytes after its response", "bytes_after_response")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._chunk_empty:
            # A trailer: dropped (the chunked body is re-framed without), never kept for the next head; counted
            # with the trailer section, so ones that complete within one read are bounded too.
            self._head_bytes += len(name) + len(value)
            return
        if len(name) in RESPONSE_SPECIAL_LENGTHS:
            lower = name.lower()
            if lower in HOP_BY_HOP:
                self._hop.append((lower, value))
                return
            if lower == b"content-length":
                self._has_length = True
        self._lines += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        lines, hop, has_length = self._lines, self._hop, self._has_length
        self._lines, self._hop, self._has_length = [b""], [], False
        exchange = self.exchange
        if exchange is None:
            return
        status = self._parser.get_status_code()
        if status < 200 and status != 101:
            # 100 Continue and other interim answers: the proxy already told the client to go on.
            self.interim = True
            return
        self.interim = False
        if status == 101 and not exchange.upgrade:
            self._lost("switched protocols unasked")
            return
        server = exchange.client.server
        # Positional arguments, a plain tuple back: docs/architecture.md#hot-head-tuples.
        head, upstream_close, self._client_chunked, self._until_close, close = forwarded_response_head(
            status,
            lines,
            hop,
            has_length,
            exchange.is_head,
            exchange.keep_alive,
            exchange.body_done,
            server.draining,
            exchange.http10,
            exchange.waited if exchange.cold else None,
            server.via,
        )
        exchange.response_begins(close, status)
        self._sink = True
        self._out.append(head)
        self._unsent_head = True
        if status == 101:
            self._upgrading = True
        elif exchange.is_head:
            # Asked here only (the version costs a string format): other responses ask should_keep_alive.
            # The head is the whole answer, sent once the rest of this read shows nothing follows it.
            self.complete = not upstream_close and self._parser.get_http_version() == "1.1"

    def on_chunk_header(self) -> None:
        self._chunk_empty = True
        self._head_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._chunk_empty = False
        self._out.append(chunk(body) if self._client_chunked else body)

    def on_message_complete(self) -> None:
        if self.interim or self._upgrading:
            self.interim = False
            return
        exchange = self.exchange
        if exchange is None:
            return
        self._chunk_empty = False
        if self._client_chunked:
            self._out.append(CHUNK_END)
        # Read here and nowhere else: after this callback httptools reports False.
        self.complete = self._parser.should_keep_alive()

    # --- what the exchange and the pool call ---

    def use_for(self, exchange: Exchange) -> None:
        """Bind the connection to `exchange` before its request is written."""
        self.exchange = exchange
        # Paired by the exchange as it sends its request (Flow.pair).
        self.flow = exchange.flow
        self._head_bytes = 0
        self._chunk_empty = False
        self._until_close = False
        self._client_chunked = False
        if exchange.is_head:
            self._parser = httptools.HttpResponseParser(_HeadResponse(self))

    def expect_response(self, timeout: float, sent_at: float) -> None:
        """The request was sent whole at `sent_at` (monotonic): its response head is due within `timeout`."""
        self._timeout = timeout
        self.deadline = sent_at + timeout

    def check_deadline(self, now: float) -> None:
        if self.deadline and now >= self.deadline:
            if self.reads_moved() or (self.flow is not None and self.flow.upstream_paused):
                # The body is still coming, or the client is the slow one (its own send_timeout covers that).
                self.deadline = now + self._timeout
            else:
                self._response_timeout()

    def reads_moved(self) -> bool:
        """Whether a response byte arrived since the last call (only after the head: before it, the head is due)."""
        exchange = self.exchange
        if exchange is None or not exchange.response_started or self._reads == self._reads_seen:
            return False
        self._reads_seen = self._reads
        return True

    def release(self) -> None:
        self.exchange = None
        self._sink = False
        self.deadline = 0.0
        if self.flow is not None:  # unpaired already after a response: docs/architecture.md#hot-skipped-calls
            self._unpair()
        self.endpoint.release(self)

    def abandon(self) -> None:
        """The exchange ended before its response did: the connection's framing is lost, close it."""
        self.exchange = None
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._clear_deadline()
            self.transport.close()
        self._unpair()

    def _unpair(self) -> None:
        # A pause for a slow client ends here too: the connection's next user reads.
        flow, self.flow = self.flow, None
        if flow is not None:
            flow.unpair(self)

    # --- internals ---

    def _flush(self, last: bool = False) -> None:
        """What this read produced goes to the client in one write; `last`: the response ends with it."""
        self._unsent_head = False
        out = self._out
        data = b""
        if out:
            if self._sink:
                data = b"".join(out) if len(out) > 1 else out[0]
            self._out = []
        flow = self.flow
        if flow is None:
            return
        if last:
            self.flow = None
            flow.finish(self, data)
        elif data:
            flow.to_client(data)

    def _start_tunnel(self, rest: bytes) -> None:
        exchange = self.exchange
        if exchange is None or not self._upgrading:
            self._lost("switched protocols unasked")
            return
        client = exchange.client
        assert isinstance(client, ClientConnection)  # an HTTP/2 stream sends no Upgrade (h2 refuses the field)
        self._tunnel = client
        self.exchange = None
        client.start_tunnel(self)
        if rest and self.flow is not None:
            self.flow.to_client(rest)

    def _finish(self) -> None:
        """A response ended in the read just parsed and nothing after it (or the connection is not reused)."""
        reusable, self.complete = bool(self.complete), None
        exchange = self.exchange
        if exchange is not None and exchange.is_head:
            # A fresh parser reads the next response on this connection.
            self._parser = httptools.HttpResponseParser(self)
        self._flush(exchange is not None)  # last; positional on the hot path: docs/architecture.md#hot-head-tuples
        if exchange is not None:
            # Pooled or closed first: the exchange's end may send a held request on this very connection.
            self.exchange = None
            if reusable and exchange.body_done and exchange.pool_upstream:
                self.release()
            else:
                self.close()
            exchange.response_done()

    def _head_too_large(self, exchange: Exchange) -> None:
        """A response head, or a response's trailer section, is over the route's bound."""
        limit = exchange.route.limits.max_response_head_bytes
        telemetry.LIMIT_HITS.labels(exchange.route.name, "max_response_head_bytes").inc()
        self._refused(
            MessageRefused(
                f"sent a response head or trailers larger than {limit} bytes (route {exchange.route.name}: "
                "limits.max_response_head_bytes)",
                "head_too_large",
            )
        )

    def _refused(self, bad: MessageRefused | None) -> None:
        """A response that cannot be forwarded: 502 if nothing of it reached the client, else cut off; the
        connection is closed, never pooled."""
        self.complete = None
        reason = bad.message if bad is not None else "sent a malformed response"
        if bad is not None:
            telemetry.REFUSED_MESSAGES.labels("response", bad.framing_reason).inc()
        exchange = self.exchange
        if exchange is not None and (self._unsent_head or bad is not None):
            # The upstream answered, badly: no retry. A head still here is replaced by the 502.
            if self._unsent_head:
                self._out = []
                self._unsent_head = False
                exchange.response_withdrawn()
            self.exchange = None
            self.close()
            exchange.fail(502, f"the upstream {reason}")
            return
        self._flush()
        self._lost(reason)

    def _lost(self, reason: str) -> None:
        exchange, self.exchange = self.exchange, None
        self.close()
        if exchange is not None:
            # A response byte came back (even a malformed one): the upstream acted on the request, no retry.
            exchange.upstream_lost(reason, replied=self._head_bytes > 0)

    def _response_timeout(self) -> None:
        exchange, self.exchange = self.exchange, None
        self.close()
        if exchange is not None:
            exchange.fail(504, f"the upstream did not answer in {self._timeout:g} s (limits.response_timeout)")

    def _clear_deadline(self) -> None:
        self.deadline = 0.0


class Endpoint:
    """One address a route forwards to, with its admission count and its connections: idle keep-alive ones for
    HTTP/1.1, multiplexed ones (`pool`) for HTTP/2 (adapter/proxy/h2upstream.py)."""

    __slots__ = (
        "_allowed",
        "_dialing",
        "_paused",
        "_refusal_pause",
        "_refused_at",
        "cap",
        "h2c",
        "healthy",
        "host",
        "idle",
        "inflight",
        "literal",
        "pool",
        "port",
        "removed",
        "route",
    )

    def __init__(self, route: Route, host: str, port: int, h2c: bool = False) -> None:
        self.route = route
        self.host = host
        self.port = port
        self.literal = endpoint_refusal(host) != NOT_AN_IP  # an IP address, judged where it came from
        self.inflight = 0
        # How many requests it takes at once: the route's endpoint_concurrency, or less when an HTTP/2 upstream's
        # SETTINGS_MAX_CONCURRENT_STREAMS says so.
        self.cap = self._allowed = route.limits.endpoint_concurrency
        # After an HTTP/2 upstream refused a stream (REFUSED_STREAM): how long it gets no new one (doubling while
        # refusals keep coming), and when the last refusal came.
        self._paused = False
        self._refusal_pause = 0.0
        self._refused_at = 0.0
        # False after a failed connect, until a probe connects again.
        self.healthy = True
        self.removed = False
        self.idle: list[UpstreamConnection] = []
        self.h2c = h2c
        self.pool: list[H2UpstreamConnection] = []
        self._dialing: asyncio.Task[UpstreamConnection | H2UpstreamConnection | None] | None = None

    def __repr__(self) -> str:
        return f"Endpoint({self.host}:{self.port})"

    def dispatch(self, exchange: Exchange) -> UpstreamConnection | H2UpstreamStream | None:
        """A connection (HTTP/2: a stream) bound to `exchange`, or None: one is dialled and attached once
        connected."""
        if self.h2c:
            for connection in self.pool:
                if connection.has_room():
                    return connection.open_stream(exchange)
            self.route.spawn(self._stream_for(exchange))
            return None
        idle = self.idle
        while idle:
            pooled = idle.pop()
            if not pooled.closed:
                pooled.use_for(exchange)
                return pooled
        self.route.spawn(self._connect_for(exchange))
        return None

    async def _connect_for(self, exchange: Exchange) -> None:
        connection = await self.connect(self.route.limits.connect_timeout)
        if connection is None:
            self.route.connect_failed(self, exchange)
            return
        if not self._waiting(exchange):
            self.release(connection)  # the request ended meanwhile (timeout, client gone)
            return
        assert isinstance(connection, UpstreamConnection)
        connection.use_for(exchange)
        exchange.attach(connection)

    async def _stream_for(self, exchange: Exchange) -> None:
        """HTTP/2: one dial at a time per endpoint, shared by every request waiting for it."""
        if self._dialing is None or self._dialing.done():
            self._dialing = self.route.spawn(self.connect(self.route.limits.connect_timeout))
        connection = await asyncio.shield(self._dialing)
        if connection is None:
            self.route.connect_failed(self, exchange)
            return
        assert isinstance(connection, H2UpstreamConnection)
        self.release(connection)
        if not self._waiting(exchange):
            return
        for pooled in self.pool:
            if pooled.has_room():
                exchange.attach(pooled.open_stream(exchange))
                return
        if connection.closed or connection.going_away:
            # A dial that cannot carry a stream failed: probed again, paced, rather than dialled again at once.
            self.route.connect_failed(self, exchange)
        else:
            # Full (the peer's SETTINGS allow fewer streams than were waiting for it): back to the queue, sent
            # when a stream ends, never on one more connection dialled for it.
            self.route.retry(exchange)

    def _waiting(self, exchange: Exchange) -> bool:
        """Whether `exchange` still waits for a connection to this endpoint."""
        return exchange.state == ASSIGNED and exchange.endpoint is self and exchange.upstream is None

    def streams_allowed(self, streams: int) -> None:
        """An HTTP/2 upstream said how many streams it serves at once: that is this endpoint's concurrency."""
        self._allowed = min(self.route.limits.endpoint_concurrency, streams)
        if not self._paused:
            before, self.cap = self.cap, self._allowed
            if self.cap > before:
                self.route.pump()

    def refused(self) -> None:
        """An HTTP/2 upstream refused a stream unprocessed: it has no room now, whatever its SETTINGS say (grpc's
        server still counts a stream for a moment after it ended it). No new stream goes to it for a pause, 5 ms
        doubling to 1 s while refusals follow one another, so the refused request is sent again when the server
        has room, not in a loop that spends its attempts (docs/architecture.md#h2-upstreams)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        recent = self._refused_at and now - self._refused_at < _REFUSALS_FORGOTTEN
        self._refusal_pause = min(self._refusal_pause * 2, _MAX_REFUSAL_PAUSE) if recent else _MIN_REFUSAL_PAUSE
        self._refused_at = now
        self._paused = True
        # The refused request still counts in `inflight` (it leaves it right after this): the others keep their slots.
        self.cap = max(0, min(self.inflight - 1, self._allowed))
        loop.call_later(self._refusal_pause, self._refusal_over, now)

    def _refusal_over(self, refused_at: float) -> None:
        if refused_at != self._refused_at or self.removed:
            return  # a later refusal's pause runs instead
        self._paused = False
        self.cap = self._allowed
        self.route.pump()

    async def connect(self, within: float) -> UpstreamConnection | H2UpstreamConnection | None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                connection = await self._dial(loop, [self.host] if self.literal else await self._resolve(loop))
        except (OSError, TimeoutError) as err:
            self.route.connect_counter("error").inc()
            log.debug("route %s: connect to %s:%d failed: %s", self.route.name, self.host, self.port, err)
            return None
        self.route.connect_counter("ok").inc()
        return connection

    def _protocol(self) -> UpstreamConnection | H2UpstreamConnection:
        return H2UpstreamConnection(self) if self.h2c else UpstreamConnection(self)

    async def _dial(
        self, loop: asyncio.AbstractEventLoop, hosts: list[str]
    ) -> UpstreamConnection | H2UpstreamConnection:
        """A connection to the first of `hosts` that answers, each tried in turn (as create_connection tries each
        address of a name it resolves itself: one A record of several down must not fail every connect)."""
        errors = []
        for host in hosts:
            try:
                _, connection = await loop.create_connection(self._protocol, host, self.port)
            except OSError as err:
                errors.append(f"{host}: {err}")
                continue
            if isinstance(connection, H2UpstreamConnection) and not await self._settled(connection):
                errors.append(f"{host}: closed the connection before its HTTP/2 SETTINGS")
                continue
            return connection
        raise OSError("; ".join(errors))

    @staticmethod
    async def _settled(connection: H2UpstreamConnection) -> bool:
        """Connected once the peer's SETTINGS came (h2upstream.H2UpstreamConnection.settled); a dial given up meanwhile
        (the connect timeout) closes the connection it made."""
        try:
            return await connection.settled
        except BaseException:
            connection.close()
            raise

    async def _resolve(self, loop: asyncio.AbstractEventLoop) -> list[str]:
        """The addresses the name resolves to that may be endpoints, in the resolver's order
        (docs/architecture.md#only-ip-endpoints): resolved here rather than by create_connection, so a DNS answer is
        judged as a slice's address is (a name given in the config may be a Service of type ExternalName, whose
        target anyone may choose: `localhost`)."""
        # socket.getaddrinfo in the default executor, as asyncio's own loop resolves (uvloop's loop.getaddrinfo runs
        # the same getaddrinfo(3) in libuv's pool, out of Python's reach): the system resolver's answers may be given
        # at socket.getaddrinfo by a test, which can change neither /etc/hosts nor DNS.
        infos = await loop.run_in_executor(
            None, functools.partial(socket.getaddrinfo, self.host, self.port, type=socket.SOCK_STREAM)
        )
        answers = list(dict.fromkeys(str(info[4][0]) for info in infos))
        judged = [(address, refusal(address, loopback=self.route.allow_loopback)) for address in answers]
        self.route.refused_dns.report({(address, why) for address, why in judged if why is not None})
        allowed = [address for address, why in judged if why is None]
        if not allowed:
            raise OSError(f"{self.host} resolves only to addresses that may not be endpoints: {', '.join(answers)}")
        return allowed

    def release(self, connection: UpstreamConnection | H2UpstreamConnection) -> None:
        if isinstance(connection, H2UpstreamConnection):
            if self.removed or connection.closed or connection.going_away:
                if not connection.streams:
                    connection.close()
            elif connection not in self.pool:
                self.pool.append(connection)
            return
        if self.removed or connection.closed or len(self.idle) >= self.route.limits.max_idle_connections:
            connection.close()
        else:
            self.idle.append(connection)

    def forget(self, connection: UpstreamConnection | H2UpstreamConnection) -> None:
        if isinstance(connection, H2UpstreamConnection):
            if connection in self.pool:
                self.pool.remove(connection)
        elif connection in self.idle:
            self.idle.remove(connection)

    def close_idle(self) -> None:
        """Close the connections no request uses (an HTTP/2 connection carrying streams goes on until they end)."""
        idle, self.idle = self.idle, []
        for connection in idle:
            connection.close()
        pool, self.pool = self.pool, []
        for h2_connection in pool:
            if h2_connection.streams:
                h2_connection.going_away = True  # closed by its last stream's end
            else:
                h2_connection.close()
