"""The client side of HTTP/2: a connection that began with the HTTP/2 preface, each of its streams one exchange.

ClientConnection hands a connection over (`transport.set_protocol`) when its first bytes are the preface: cleartext
HTTP/2 with prior knowledge, on the same port as HTTP/1.1 (the HTTP/1.1 `Upgrade: h2c` stays refused). Framing, flow
control and HPACK are the `h2` library's; this module decides what a stream may cost and when it ends.

A stream is an exchange's client end and its flow (`H2Stream`): it is answered, paused and resumed alone, so one
held or slow stream never holds back another. Bounds, each with a setting under `proxy.http2` or the HTTP/1.1 one it
shares, a metric and a message (docs/architecture.md#h2-defences):

- streams open at once: SETTINGS_MAX_CONCURRENT_STREAMS (`max_concurrent_streams`); a client that opens more is
  sent GOAWAY;
- streams the client resets (or makes the proxy reset), and control frames (SETTINGS, PING, PRIORITY frames,
  unknown types), per `abuse_window`: `max_stream_resets` (when the resets also outnumber the streams it let finish)
  and `max_control_frames`, then GOAWAY ENHANCE_YOUR_CALM (rapid reset, and the floods); h2 is given a read 16 KiB at
  a time, so that a limit stops the parsing of the rest;
- a header block (HEADERS and its CONTINUATIONs) of at most `proxy.max_header_bytes`, encoded (the CONTINUATION
  flood) and decoded (the HPACK bomb), with at most `proxy.max_headers` fields; the encoder's HPACK table stays
  4 KiB whatever the client offers;
- any frame, a header block included, completes within `proxy.header_timeout` of its first byte (or of the read
  that completed the frame before it); a connection without a stream closes after `proxy.idle_timeout`; a stream's
  request body moves at least every `limits.body_timeout`; response bytes the client's window keeps from it for
  `proxy.send_timeout` reset the stream (a zero window), and a client that reads nothing for that long loses the
  connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from time import monotonic
from typing import TYPE_CHECKING

import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httptools

from adapter.proxy.exchange import DONE, Exchange
from adapter.proxy.flow import Pairing
from adapter.proxy.h2conn import Outbox, end_stream, h2_connection, send_within_window
from adapter.proxy.h2wire import (
    Fields,
    StreamRequest,
    error_fields,
    h2_request_head,
    h2_response_head,
    own_fields,
)
from adapter.proxy.headers import CONTENT_UNDEFINED, MessageRefused
from adapter.proxy.trace import h2_fields, request_span
from adapter.telemetry import proxy as telemetry
from adapter.telemetry import tracing

if TYPE_CHECKING:
    from adapter.proxy.choices import OwnAnswer
    from adapter.proxy.h2upstream import H2UpstreamStream
    from adapter.proxy.server import ProxyServer
    from adapter.proxy.table import Listener
    from adapter.proxy.upstream import UpstreamConnection

log = logging.getLogger(__name__)

# The connection-level receive window (each stream has its own 65,535 bytes: that is the bound that matters).
_CONNECTION_WINDOW = 16 * 1024 * 1024
# Response bytes a stream keeps while the client's window is shut, before its upstream is paused.
_STREAM_BUFFER = 64 * 1024
_PAUSE_BODY, _PAUSE_UPSTREAM = 1, 2
# The bytes of a read h2 parses at once (one frame at most).
_READ_SLICE = 16 * 1024
# The HPACK dynamic table the proxy's encoder keeps (RFC 7541's default), whatever larger SETTINGS_HEADER_TABLE_SIZE
# the client's decoder offers: the encoder may use less (RFC 7541 4.2), and a table as large as offered (up to
# 4 GiB) would keep every distinct response field the connection carried.
_ENCODER_TABLE = 4096
_CONTROL_EVENTS = (
    h2.events.PingReceived,
    h2.events.RemoteSettingsChanged,
    h2.events.PriorityUpdated,
    h2.events.UnknownFrameReceived,
)


def _code_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


class H2ClientConnection(asyncio.Protocol):
    """One client's HTTP/2 connection: the streams it opened, its deadlines, its abuse counters."""

    def __init__(self, server: ProxyServer, listener: Listener, transport: asyncio.Transport, peer: bytes) -> None:
        self.server = server
        self._listener = listener
        self.transport = transport
        config = server.config
        self._settings = config.http2
        self._max_headers = config.max_headers
        self._max_header_bytes = config.max_header_bytes
        self._peer = peer
        self._node = b'"[%b]"' % peer if b":" in peer else peer
        self.h2 = h2_connection(client_side=False)
        self.outbox = Outbox(self.h2)
        self.outbox.transport = transport
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self._settings.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: config.max_header_bytes,
            },
        )
        self.h2.decoder.max_header_list_size = config.max_header_bytes
        self.streams: dict[int, H2Stream] = {}
        self._closed = False
        self._going_away = False
        # The last stream taken when the proxy said GOAWAY while streams may still finish (None: not said).
        self._last_stream: int | None = None
        # When the frame being read must be complete, or the idle connection closes (monotonic, 0: none); the
        # server's sweeper checks it, as it checks every connection's.
        self.deadline = monotonic() + config.header_timeout
        self._partial = True
        self.write_deadline = 0.0
        self.writing_paused = False
        self._window_start = monotonic()
        self._resets = 0
        self._controls = 0
        # Streams answered whole in the current abuse window: a client resetting fewer than it lets finish is a busy
        # client cancelling calls (gRPC deadlines, a user leaving a page), not a rapid reset.
        self._answered = 0
        # The PriorityUpdated event h2 repeats after the request (or trailers) whose HEADERS frame carried it.
        self._headers_priority: h2.events.PriorityUpdated | None = None
        self._flush_soon = False

    def start(self, data: bytes) -> None:
        """Take the connection over with what was read of it (the preface, maybe more)."""
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
        self.flush()  # the SETTINGS the connection must begin with, whatever reading `data` queues and drops
        self.data_received(data)

    # --- asyncio callbacks ---

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        progressed = False
        view = memoryview(data)
        # h2 parses all it is given before the proxy sees an event: given a slice at a time, a limit reached stops
        # the parsing of the rest of a read (256 KiB of rapid resets is some 5,000 streams, 0.4 s of h2's time).
        for start in range(0, len(view), _READ_SLICE):
            try:
                events = self.h2.receive_data(view[start : start + _READ_SLICE])
            except h2.exceptions.ProtocolError as err:
                self._protocol_error(err)
                return
            for event in events:
                self._event(event)
                if self._closed:
                    return
            progressed = progressed or bool(events)
        self._read_progress(progressed)
        self.flush()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.forget(self)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.gone()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.write_deadline = monotonic() + self.server.config.send_timeout
        for stream in self.streams.values():
            stream.client_slow()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.write_deadline = 0.0
        for stream in list(self.streams.values()):
            stream.client_ready()

    # --- frames ---

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None:
                stream.body_data(event.data or b"", event.flow_controlled_length or 0)
            elif event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id or 0)
        elif isinstance(event, h2.events.RequestReceived):
            self._headers_priority = event.priority_updated
            fields = list(event.headers or [])
            self._request(event.stream_id or 0, fields, event.stream_ended is not None)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None:
                stream.body_end()
        elif isinstance(event, h2.events.TrailersReceived):
            self._headers_priority = event.priority_updated
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None and stream.exchange is not None:
                stream.exchange.trailers = list(event.headers or [])
        elif isinstance(event, h2.events.StreamReset):
            self._reset_by_client(event.stream_id or 0)
        elif isinstance(event, h2.events.WindowUpdated):
            targets = list(self.streams.values()) if not event.stream_id else [self.streams.get(event.stream_id)]
            for stream in targets:
                if stream is not None and stream.unsent:
                    stream.send_pending()
        elif isinstance(event, _CONTROL_EVENTS):
            if event is self._headers_priority:
                return  # the priority a HEADERS frame carried (nghttp2's client sends one with every request)
            if (
                isinstance(event, h2.events.RemoteSettingsChanged)
                and self.h2.encoder.header_table_size > _ENCODER_TABLE
            ):
                self.h2.encoder.header_table_size = _ENCODER_TABLE
            self._controls += 1
            if self._count_window() and self._controls > self._settings.max_control_frames:
                self._calm_down(
                    "max_control_frames",
                    f"more than {self._settings.max_control_frames} control frames (SETTINGS, PING, PRIORITY) in "
                    f"{self._settings.abuse_window:g} s (proxy.http2.max_control_frames)",
                )
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._going_away = True
            # NO_ERROR: the client is closing, and the streams it waits for still finish.
            if not self.streams or event.error_code != h2.errors.ErrorCodes.NO_ERROR:
                self._close()

    def _request(self, stream_id: int, headers: Fields, ended: bool) -> None:
        """A stream's request head (`ended`: and no body follows it)."""
        if self._last_stream is not None and stream_id > self._last_stream:
            # Opened after the proxy's GOAWAY: refused unprocessed, so the client may retry it (RFC 9113 8.7).
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        stream = self.streams[stream_id] = H2Stream(self, stream_id)
        if len(headers) > self._max_headers:
            stream.refuse(431, f"the request has more than {self._max_headers} headers (proxy.max_headers)")
            return
        try:
            request = StreamRequest(headers)
        except MessageRefused as refused:
            stream.refuse(refused.code, refused.message)
            return
        route = self._listener.router.match(request.authority, request.path, headers)
        if route is None:
            telemetry.ERRORS.labels("", "404").inc()
            stream.refuse(404, "no route for this host and path", count=False)
            return
        config = self.server.config
        head = h2_request_head(request, self._peer, self._node, route.default_host, config.via)
        span = None
        tracer = tracing.TRACER  # read once per request: off, nothing else of tracing runs for it
        if tracer is not None:
            span = request_span(tracer, request.method, request.path, request.authority, "2", route, headers)
            head = h2_fields(head, span)
        exchange = Exchange(
            stream,
            route,
            head,
            False,
            request.content_length,
            True,
            False,
            False,
            False,
            request.method == b"HEAD",
            request.idempotent,
            ended or request.method not in CONTENT_UNDEFINED,
            span,
        )
        exchange.grpc = request.grpc
        choices = route.choices
        if choices is not None:
            regular = [(name, value) for name, value in headers if name[:1] != b":"]
            exchange.choice = choices.classify(request.method, request.path, regular)
        if request.grpc_timeout is not None and request.grpc_timeout < route.limits.hold_timeout:
            exchange.hold_timeout = max(request.grpc_timeout, 0.001)
        stream.exchange = exchange
        if ended:
            # Known whole before it is sent: an HTTP/1.1 upstream is given its length, not a chunked body.
            stream.request_ended = True
            exchange.body_end()
        else:
            stream.body_deadline = monotonic() + route.limits.body_timeout
        if exchange.choice is not None and route.answers_itself(exchange):
            return
        route.submit(exchange)

    def _reset_by_client(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        stream.reset_by_client()
        self._resets += 1
        if self._count_window() and self._resets > self._settings.max_stream_resets and self._resets > self._answered:
            self._calm_down(
                "max_stream_resets",
                f"more than {self._settings.max_stream_resets} streams reset by the client in "
                f"{self._settings.abuse_window:g} s, more than it let finish (proxy.http2.max_stream_resets)",
            )

    def answered(self) -> None:
        """A stream's response went out whole (counted against its resets, see _reset_by_client)."""
        self._count_window()
        self._answered += 1

    def _count_window(self) -> bool:
        """Starts a new abuse window when the last one is over; True while the counts are of the current one."""
        now = monotonic()
        if now - self._window_start > self._settings.abuse_window:
            self._window_start = now
            self._resets = self._controls = self._answered = 0
            return False
        return True

    def _calm_down(self, limit: str, message: str) -> None:
        telemetry.LIMIT_HITS.labels("", f"http2.{limit}").inc()
        log.warning("closing an HTTP/2 client connection from %s: %s", self._peer.decode(), message)
        self._goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, message)

    def _protocol_error(self, err: h2.exceptions.ProtocolError) -> None:
        reason = type(err).__name__
        message = f"HTTP/2 protocol error: {err}"
        if isinstance(err, h2.exceptions.TooManyStreamsError):
            telemetry.LIMIT_HITS.labels("", "http2.max_concurrent_streams").inc()
            message = (
                f"more than {self._settings.max_concurrent_streams} streams open at once "
                "(proxy.http2.max_concurrent_streams)"
            )
        elif isinstance(err, h2.exceptions.DenialOfServiceError):
            telemetry.LIMIT_HITS.labels("", "max_header_bytes").inc()
            message = self._header_block_message
        telemetry.REFUSED_MESSAGES.labels("request", f"h2_{reason}").inc()
        code = getattr(err, "error_code", None) or h2.errors.ErrorCodes.PROTOCOL_ERROR
        # h2 has queued a GOAWAY that says nothing of why: this one, saying it, replaces it.
        self.h2.clear_outbound_data_buffer()
        self._goaway(code, message)

    def _goaway(self, code: int, message: str) -> None:
        """End the connection: GOAWAY saying why, then closed (its streams are cut off)."""
        telemetry.H2_GOAWAYS.labels(_code_name(code)).inc()
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection(code, additional_data=message.encode("utf-8")[:256])
        self.flush()
        self._close()

    # --- deadlines (the server's sweeper) ---

    @property
    def _header_block_message(self) -> str:
        return f"a header block of more than {self._max_header_bytes} bytes (proxy.max_header_bytes)"

    def _read_progress(self, progressed: bool) -> None:
        """A read that completed a frame ends the frame's deadline, or starts a new one for a frame or header block
        begun after it; a read that completed nothing starts it (if not started). A header block past
        max_header_bytes ends the connection."""
        # What h2 keeps unparsed: part of a frame, and a header block's frames until its END_HEADERS (up to 64 of
        # them: a megabyte). HPACK-encoded, a header list is no larger than decoded: a longer block is refused now.
        buffered = self.h2.incoming_buffer
        block = buffered._headers_buffer
        if block and sum(len(frame.data) for frame in block) > self._max_header_bytes:
            telemetry.LIMIT_HITS.labels("", "max_header_bytes").inc()
            self._goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, self._header_block_message)
            return
        if progressed:
            if buffered._data or block:
                self._partial = True
                self.deadline = monotonic() + self.server.config.header_timeout
            elif self._partial or not self.deadline:
                self._partial = False
                self.deadline = 0.0 if self.streams else monotonic() + self.server.config.idle_timeout
        elif not self._partial:
            self._partial = True
            self.deadline = monotonic() + self.server.config.header_timeout

    def check_deadlines(self, now: float) -> None:
        if self.deadline and now >= self.deadline:
            self.deadline = 0.0
            if self._partial:
                telemetry.LIMIT_HITS.labels("", "header_timeout").inc()
                self._goaway(
                    h2.errors.ErrorCodes.PROTOCOL_ERROR, "a frame did not arrive whole in proxy.header_timeout"
                )
            else:
                self._goaway(h2.errors.ErrorCodes.NO_ERROR, "idle for proxy.idle_timeout")
            return
        if self.write_deadline and now >= self.write_deadline:
            telemetry.LIMIT_HITS.labels("", "send_timeout").inc()
            self.abort()
            return
        for stream in list(self.streams.values()):
            stream.check_deadlines(now)

    # --- what streams call ---

    def stream_closed(self, stream: H2Stream) -> None:
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        if not self.streams:
            if self._going_away or self.server.draining:
                self.close_if_idle()
            elif not self._partial:
                self.deadline = monotonic() + self.server.config.idle_timeout

    def flush(self) -> None:
        self.outbox.flush()

    # --- what the server calls ---

    def close_if_idle(self) -> None:
        """Draining: GOAWAY (streams opened so far finish), closed once none is left."""
        if self._closed:
            return
        if not self._going_away:
            self._going_away = True
            self._last_stream = self.h2.highest_inbound_stream_id
            self.h2.close_connection(h2.errors.ErrorCodes.NO_ERROR)
            self.flush()
            telemetry.H2_GOAWAYS.labels("NO_ERROR").inc()
        if not self.streams:
            self._close()

    def shut_down(self) -> None:
        """The grace period is over: streams still open get 503 (cut off if their response began)."""
        for stream in list(self.streams.values()):
            exchange = stream.exchange
            if exchange is not None and exchange.state != DONE:
                exchange.fail(503, "the proxy is shutting down")
        self.close_if_idle()
        self._close()

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.abort()

    def _close(self) -> None:
        if not self._closed:
            self.flush()  # what this turn made (the last answers) goes before the close, not after it
            self._closed = True
            self.transport.close()


class _H1Response:
    """httptools callbacks reading back the HTTP/1.1 response an HTTP/1.1 upstream's connection forwards (already
    put through the response policy, upstream.py): its fields and body go on as HTTP/2."""

    __slots__ = ("fields", "parser", "stream")

    def __init__(self, stream: H2Stream) -> None:
        self.stream = stream
        self.fields: Fields = []
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.stream.send_head(h2_response_head(self.parser.get_status_code(), self.fields, None, False))

    def on_body(self, body: bytes) -> None:
        self.stream.data(body)


class H2Stream(Pairing):
    """One stream of an `H2ClientConnection`: its exchange's client end and flow (the roles ClientConnection and
    Flow play for HTTP/1.1)."""

    __slots__ = (
        "_pauses",
        "_reader",
        "_unacked",
        "body_deadline",
        "connection",
        "ended",
        "exchange",
        "head_sent",
        "reads",
        "request_ended",
        "send_deadline",
        "server",
        "stream_id",
        "trailers_pending",
        "unsent",
        "unsent_size",
    )

    def __init__(self, connection: H2ClientConnection, stream_id: int) -> None:
        self.connection = connection
        self.server = connection.server
        self.stream_id = stream_id
        self.exchange: Exchange | None = None
        self.upstream: UpstreamConnection | H2UpstreamStream | None = None
        self.upstream_paused = False
        self.reads = 0
        self.request_ended = False
        self.head_sent = False
        # Our side of the stream ended (END_STREAM or RST_STREAM sent): nothing more is written for it.
        self.ended = False
        # Response DATA the client's window has no room for yet, and the end that follows it (None: not yet).
        self.unsent: list[bytes] = []
        self.unsent_size = 0
        self.trailers_pending: Fields | bool | None = None
        self.body_deadline = 0.0
        self.send_deadline = 0.0
        self._pauses = 0
        self._unacked = 0
        self._reader: _H1Response | None = None

    @property
    def flow(self) -> H2Stream:
        return self

    # --- the request, as the connection reads it ---

    def body_data(self, data: bytes, size: int) -> None:
        if self._pauses:
            self._unacked += size
        elif size:
            self.connection.h2.acknowledge_received_data(size, self.stream_id)
        exchange = self.exchange
        if exchange is not None and data:
            self.body_deadline = monotonic() + exchange.route.limits.body_timeout
            exchange.body_data(data)

    def body_end(self) -> None:
        if self.request_ended:
            return  # ended with its head (H2ClientConnection._request)
        self.request_ended = True
        self.body_deadline = 0.0
        exchange = self.exchange
        if exchange is not None:
            exchange.body_end()
        elif self.ended:
            self._closed()

    def reset_by_client(self) -> None:
        self.ended = self.request_ended = True
        self.gone()
        if self._unacked:
            self._acknowledge()

    def gone(self) -> None:
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.client_gone()
        self._unlink()

    # --- what the exchange calls (its client end) ---

    def answer(self, exchange: Exchange, code: int, message: str, retry_after: int | None) -> None:
        """The proxy's own answer: an HTTP error, or for a gRPC call a trailers-only response with its status."""
        fields, body = error_fields(code, message, retry_after, exchange.grpc)
        self._own_answer(fields, body)

    def answer_here(self, exchange: Exchange, answer: OwnAnswer) -> None:
        """A configured answer of the proxy's own (docs/architecture.md#cold-start-choices): a whole response."""
        self._own_answer(
            own_fields(answer.status, answer.fields, answer.body), b"" if exchange.is_head else answer.body
        )
        self.connection.answered()

    def _own_answer(self, fields: Fields, body: bytes) -> None:
        self.exchange = None
        self._unlink()
        if self.ended or self.head_sent:
            self.abort()
            return
        self.send_head(fields, end=not body)
        if body:
            self.data(body)
            self.end_stream(None)

    def refuse(self, code: int, message: str, *, count: bool = True) -> None:
        """A request refused before it became an exchange (no route, a malformed head)."""
        if count:
            telemetry.ERRORS.labels("", str(code)).inc()
        fields, body = error_fields(code, message, None, grpc=False)
        self.send_head(fields, end=False)
        self.data(body)
        self.end_stream(None)

    def exchange_finished(self, exchange: Exchange, reusable: bool) -> None:
        self.exchange = None
        self.connection.answered()
        if self.ended and not self.unsent:
            self._closed()

    def abort(self) -> None:
        """Cut the stream off (its response broke after it began): RST_STREAM, the connection goes on."""
        exchange, self.exchange = self.exchange, None
        if exchange is not None and exchange.state != DONE:
            exchange.client_gone()
        self._unlink()
        if not self.ended:
            self.ended = True
            self.unsent = []
            self.unsent_size = 0
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.connection.h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self.connection.outbox.flush_soon()
        self._closed()

    def pause_reading_for_body(self) -> None:
        self._pauses |= _PAUSE_BODY

    def resume_reading_for_body(self) -> None:
        self._resume(_PAUSE_BODY)

    def pause_reading_for_upstream(self) -> None:
        self._pauses |= _PAUSE_UPSTREAM

    def resume_reading_for_upstream(self) -> None:
        self._resume(_PAUSE_UPSTREAM)

    def _resume(self, reason: int) -> None:
        if self._pauses & reason:
            self._pauses &= ~reason
            if not self._pauses and self._unacked:
                self._acknowledge()

    def _acknowledge(self) -> None:
        """The body bytes read while paused are taken: their room goes back to the connection's window (always: they
        were received) and to the stream's (h2 skips that once the client's side of the stream has ended)."""
        unacked, self._unacked = self._unacked, 0
        self.connection.h2.acknowledge_received_data(unacked, self.stream_id)
        self.connection.outbox.flush_soon()

    # --- the flow: to the upstream (pair, link, to_upstream, unpair: Pairing's) ---

    def _unlink(self) -> None:
        upstream = self.upstream
        if upstream is not None:
            self.unpair(upstream)

    def upstream_slow(self) -> None:
        self.pause_reading_for_upstream()

    def upstream_ready(self) -> None:
        self.resume_reading_for_upstream()

    # --- the flow: the response, from an HTTP/1.1 upstream (bytes) or an HTTP/2 one (fields) ---

    def to_client(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:
            reader = self._reader = _H1Response(self)
        try:
            reader.parser.feed_data(data)
        except httptools.HttpParserError:
            self.abort()

    def finish(self, upstream: UpstreamConnection, data: bytes) -> None:
        if data:
            self.to_client(data)
        self._reader = None
        self.unpair(upstream)
        self.end_stream(None)

    def relay_to_client(self, data: bytes) -> None:
        raise AssertionError("an HTTP/2 stream never becomes a tunnel (it sends no Upgrade)")

    relay_to_upstream = relay_to_client

    def response(self, exchange: Exchange, status: int, fields: Fields) -> None:
        exchange.response_begins(False, status)
        self.send_head(h2_response_head(status, fields, exchange.waited if exchange.cold else None, self.server.via))

    def end(self, upstream: H2UpstreamStream, trailers: Fields | None) -> None:
        self.unpair(upstream)
        self.end_stream(trailers)

    # --- writing to the client, within its window ---

    def send_head(self, fields: Fields, *, end: bool = False) -> None:
        if self.ended:
            return
        self.head_sent = True
        try:
            self.connection.h2.send_headers(self.stream_id, fields, end_stream=end)
        except h2.exceptions.ProtocolError:
            self._unsendable()
            return
        if end:
            self.ended = True
            self._closed()
        self.connection.outbox.flush_soon()

    def data(self, data: bytes) -> None:
        if self.ended or not data:
            return
        self.unsent.append(data)
        self.unsent_size += len(data)
        self.send_pending()

    def end_stream(self, trailers: Fields | None) -> None:
        if self.ended:
            return
        self.trailers_pending = trailers or True
        self.send_pending()

    def send_pending(self) -> None:
        h2c = self.connection.h2
        unsent = self.unsent
        try:
            self.unsent_size -= send_within_window(h2c, self.stream_id, unsent)
            if not unsent and self.trailers_pending is not None:
                trailers, self.trailers_pending = self.trailers_pending, None
                end_stream(h2c, self.stream_id, trailers if isinstance(trailers, list) else None)
                self.ended = True
        except h2.exceptions.ProtocolError:
            self._unsendable()
            return
        self.connection.outbox.flush_soon()
        if unsent:
            if not self.send_deadline:
                self.send_deadline = monotonic() + self.server.config.send_timeout
            if self.unsent_size > _STREAM_BUFFER:
                self.client_slow()
        else:
            self.send_deadline = 0.0
            if self.upstream_paused and not self.connection.writing_paused:
                self.client_ready()
            if self.ended:
                self._closed()

    def _unsendable(self) -> None:
        """h2 refused to send on this stream (the client reset it, or its connection is ending): the client is
        gone for it; whatever was on its way up is cancelled."""
        self.ended = self.request_ended = True
        self.unsent = []
        self.unsent_size = 0
        self.gone()
        if self._unacked:
            self._acknowledge()
        self.connection.stream_closed(self)

    def client_slow(self) -> None:
        upstream = self.upstream
        if upstream is not None and not upstream.closed and not self.upstream_paused:
            upstream.transport.pause_reading()
            self.upstream_paused = True

    def client_ready(self) -> None:
        upstream = self.upstream
        if self.upstream_paused and upstream is not None and self.unsent_size <= _STREAM_BUFFER:
            self.upstream_paused = False
            if not upstream.closed:
                upstream.transport.resume_reading()

    # --- deadlines ---

    def check_deadlines(self, now: float) -> None:
        exchange = self.exchange
        if self.send_deadline and now >= self.send_deadline:
            route = exchange.route.name if exchange is not None else ""
            telemetry.LIMIT_HITS.labels(route, "send_timeout").inc()
            self.abort()
            return
        if exchange is None:
            return
        if self.body_deadline and now >= self.body_deadline and not self.request_ended:
            self.body_deadline = 0.0
            limits = exchange.route.limits
            telemetry.LIMIT_HITS.labels(exchange.route.name, "body_timeout").inc()
            exchange.fail(
                408,
                f"the request body did not move for {limits.body_timeout:g} s "
                f"(route {exchange.route.name}: limits.body_timeout)",
            )
            return
        upstream = exchange.upstream
        if upstream is not None:
            upstream.check_deadline(now)

    def _closed(self) -> None:
        """Our side ended: once the client's side has too (or it never will be read), the stream is forgotten."""
        if self.ended and not self.unsent and self.exchange is None:
            if not self.request_ended:
                # Answered before the request was whole: the client may stop sending it (RFC 9113 8.1).
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.connection.h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.NO_ERROR)
                self.connection.outbox.flush_soon()
                self.request_ended = True
            if self._unacked:
                self._acknowledge()
            self.connection.stream_closed(self)
