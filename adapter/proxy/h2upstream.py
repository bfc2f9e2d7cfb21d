"""The upstream side of an h2c route: multiplexed HTTP/2 connections to an endpoint, one stream per exchange.

An endpoint of such a route keeps its connections in `Endpoint.pool` (one, normally: a second is dialled only while
the first has no stream to spare or is going away). Its concurrency is the upstream's own
SETTINGS_MAX_CONCURRENT_STREAMS (capped by the route's `endpoint_concurrency`): the route admits no more requests
to it than it said it would serve at once.

A stream is what an exchange sees of an upstream (the role an `UpstreamConnection` plays for HTTP/1.1): it is sent
the request, reports the response through the exchange's flow (`response`, `data`, `trailers`, `end`), has a
response deadline, and is its own `transport` to the flow (write: DATA; pause_reading: the stream's window is not
reopened). Flow control: the connection's window is reopened as bytes arrive; a stream's only as the client side
takes them, so a slow client holds back its own stream, never its neighbours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from adapter.proxy.h2conn import Outbox, end_stream, h2_connection, send_within_window
from adapter.proxy.h2wire import Fields
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from adapter.proxy.exchange import Exchange
    from adapter.proxy.flow import Flow
    from adapter.proxy.h2client import H2Stream
    from adapter.proxy.upstream import Endpoint

log = logging.getLogger(__name__)

# The connection-level receive window: streams are bounded by their own (65,535 bytes each), so this only has to
# be large enough not to be the bottleneck of many streams at once.
_CONNECTION_WINDOW = 16 * 1024 * 1024
# Request bytes a stream buffers while its upstream window is shut, before the client side is paused.
_SEND_BUFFER = 64 * 1024


class H2UpstreamConnection(asyncio.Protocol):
    """One HTTP/2 connection to an endpoint, carrying up to its peer's SETTINGS_MAX_CONCURRENT_STREAMS streams."""

    multiplexed = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.h2 = h2_connection(client_side=True)
        self.outbox = Outbox(self.h2)
        self.streams: dict[int, H2UpstreamStream] = {}
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.closed = False
        # The peer sent GOAWAY: streams it took finish, no new one starts here.
        self.going_away = False
        # The socket's buffer is full (asyncio's pause_writing): every stream's client is paused until it drains.
        self.writing_paused = False
        # Whether the peer's first SETTINGS came (True), or the connection ended first (False): no stream is opened
        # before, since until then its SETTINGS_MAX_CONCURRENT_STREAMS is unknown, and streams over it are refused.
        self.settled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    # --- asyncio callbacks ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.outbox.transport = transport  # type: ignore[assignment]
        limit = self.endpoint.route.limits.max_response_head_bytes
        # Set before the preface goes out: the first SETTINGS frame carries them (update_settings would send a second
        # SETTINGS frame ahead of the preface, which a server rightly takes for garbage).
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limit,
            },
        )
        self.h2.decoder.max_header_list_size = limit
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except (h2.exceptions.ProtocolError, ValueError) as err:
            telemetry.REFUSED_MESSAGES.labels("response", "h2_protocol_error").inc()
            self._fail_all(f"broke the HTTP/2 protocol ({err})")
            return
        for event in events:
            try:
                self._event(event)
            except Exception:
                # A fault in serving one stream (its client side) is that stream's: the connection carries other
                # clients' streams, which must not end with it.
                stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
                log.exception("route %s: a stream to %s failed", self.endpoint.route.name, self.endpoint)
                if stream is None:
                    raise
                stream.lost("could not be relayed (the proxy's fault, logged)", replied=True)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.settled.done():
            self.settled.set_result(False)
        self.endpoint.forget(self)
        self._fail_all("closed the connection")

    def pause_writing(self) -> None:
        self.writing_paused = True
        for stream in self.streams.values():
            if stream.flow is not None:
                stream.flow.upstream_slow()

    def resume_writing(self) -> None:
        self.writing_paused = False
        for stream in list(self.streams.values()):
            if stream.flow is not None and not stream.window_full():
                stream.flow.upstream_ready()

    # --- events ---

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:  # an empty DATA frame (END_STREAM alone) uses no window to give back
                self.h2.increment_flow_control_window(event.flow_controlled_length)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_data(event.data or b"", event.flow_controlled_length)
        elif isinstance(event, h2.events.ResponseReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_response(list(event.headers or []))
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.trailers = list(event.headers or [])
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_end()
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.on_reset(event.error_code)
        elif isinstance(event, h2.events.WindowUpdated):
            targets = self.streams.values() if not event.stream_id else [self.streams.get(event.stream_id)]
            for stream in list(targets):
                if stream is not None and stream.unsent:
                    stream.send_pending()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            changed = event.changed_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
            if changed is not None and changed.new_value is not None:
                self.endpoint.streams_allowed(changed.new_value)
            if not self.settled.done():
                self.settled.set_result(True)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._going_away(event.last_stream_id or 0)

    def _going_away(self, last_stream_id: int) -> None:
        """GOAWAY: streams above `last_stream_id` were never processed (RFC 9113 6.8) and may go elsewhere."""
        self.going_away = True
        self.endpoint.forget(self)
        for stream_id, stream in list(self.streams.items()):
            if stream_id > last_stream_id:
                stream.lost("went away before processing the request", replied=False, unprocessed=True)
        if not self.streams:
            self.close()

    # --- what the endpoint calls ---

    def has_room(self) -> bool:
        if self.closed or self.going_away or not self.settled.done():
            return False
        # h2's count too: a stream this side is done with but h2 still holds open counts against the peer's limit.
        opened = max(len(self.streams), self.h2.open_outbound_streams)
        return opened < self.h2.remote_settings.max_concurrent_streams

    def open_stream(self, exchange: Exchange) -> H2UpstreamStream:
        stream_id = self.h2.get_next_available_stream_id()
        stream = self.streams[stream_id] = H2UpstreamStream(self, stream_id, exchange)
        return stream

    def stream_done(self, stream: H2UpstreamStream) -> None:
        self.streams.pop(stream.stream_id, None)
        if self.going_away and not self.streams:
            self.close()

    def flush(self) -> None:
        self.outbox.flush()

    def close(self) -> None:
        if not self.closed:
            self.flush()  # what this turn made (a stream's end, a reset) goes before the close, not after it
            self.closed = True
            self.transport.close()

    def _fail_all(self, reason: str) -> None:
        self.close()
        for stream in list(self.streams.values()):
            stream.lost(reason, replied=stream.response_started)


class H2UpstreamStream:
    """One exchange's stream on an `H2UpstreamConnection`: the exchange's upstream, and its flow's transport."""

    multiplexed = True

    __slots__ = (
        "_end_pending",
        "_timeout",
        "_unacked",
        "closed",
        "connection",
        "deadline",
        "exchange",
        "flow",
        "paused",
        "reads",
        "reads_seen",
        "response_started",
        "stream_id",
        "trailers",
        "transport",
        "unsent",
        "unsent_size",
    )

    def __init__(self, connection: H2UpstreamConnection, stream_id: int, exchange: Exchange) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.exchange: Exchange | None = exchange
        self.flow: Flow | H2Stream | None = exchange.flow
        self.transport = self
        self.closed = False
        self.response_started = False
        self.trailers: Fields | None = None
        # Request DATA the upstream's window has no room for yet, and whether END_STREAM follows it.
        self.unsent: list[bytes] = []
        self.unsent_size = 0
        self._end_pending = False
        # Response bytes the client side has not taken yet (the stream's window stays shut for them).
        self.paused = False
        self._unacked = 0
        self.deadline = 0.0
        self._timeout = 0.0
        self.reads = 0
        self.reads_seen = 0

    # --- the request (what the exchange and its flow call) ---

    def send_head(self, head: Fields) -> None:
        try:
            self.connection.h2.send_headers(self.stream_id, head)
        except h2.exceptions.ProtocolError as err:
            # Not opened (h2 refused it: the peer's limit, the connection ending): nothing went, it may go elsewhere.
            self.lost(f"could not be sent a new stream ({err})", replied=False, unprocessed=True)
            return
        self.connection.outbox.flush_soon()

    def write(self, data: bytes) -> None:
        """Request body bytes: sent as the stream's window allows, the rest kept (and the client paused) until it
        opens."""
        if self.closed or not data:
            return
        self.unsent.append(data)
        self.unsent_size += len(data)
        self.send_pending()

    def expect_response(self, timeout: float, sent_at: float) -> None:
        """The request body is whole: END_STREAM (after what the window still holds back); the response head is due
        within `timeout` from `sent_at`."""
        self._timeout = timeout
        self.deadline = sent_at + timeout
        if self.closed:
            return
        self._end_pending = True
        self.send_pending()

    def send_pending(self) -> None:
        h2c = self.connection.h2
        unsent = self.unsent
        try:
            self.unsent_size -= send_within_window(h2c, self.stream_id, unsent)
            if not unsent and self._end_pending:
                self._end_pending = False
                exchange = self.exchange
                end_stream(h2c, self.stream_id, exchange.trailers if exchange is not None else None)
        except h2.exceptions.StreamClosedError:
            unsent.clear()  # the upstream ended the stream (an early answer): the rest of the body is not wanted
            self.unsent_size = 0
        self.connection.outbox.flush_soon()
        flow = self.flow
        if flow is not None:
            if self.window_full():
                flow.upstream_slow()
            elif not self.connection.writing_paused:  # the connection's pause is not this stream's to lift
                flow.upstream_ready()

    def window_full(self) -> bool:
        """More request bytes wait for the upstream's window than a stream keeps before its client is paused."""
        return self.unsent_size > _SEND_BUFFER

    # --- the response ---

    def on_response(self, headers: Fields) -> None:
        exchange = self.exchange
        if exchange is None or self.flow is None:
            return
        self.response_started = True
        self.flow.response(exchange, int(headers[0][1]), headers[1:])

    def on_data(self, data: bytes, size: int) -> None:
        self.reads += 1
        if self.flow is not None and data:
            self.flow.data(data)
        if self.paused:
            self._unacked += size
        elif size:
            self._reopen(size)

    def on_end(self) -> None:
        exchange, self.exchange = self.exchange, None
        self.closed = True
        self.deadline = 0.0
        self._cancel_request()
        self.connection.stream_done(self)
        flow, self.flow = self.flow, None
        if flow is not None:
            flow.end(self, self.trailers)
        if exchange is not None:
            exchange.response_done()

    def on_reset(self, code: int) -> None:
        self.closed = True
        self.connection.stream_done(self)
        if code == h2.errors.ErrorCodes.REFUSED_STREAM:
            self.connection.endpoint.refused()
            self.lost("refused the stream", replied=False, unprocessed=True, refused=True)
        else:
            self.lost(f"reset the stream ({h2.errors.ErrorCodes(code).name})", replied=self.response_started)

    def lost(self, reason: str, *, replied: bool, unprocessed: bool = False, refused: bool = False) -> None:
        self.closed = True
        self.deadline = 0.0
        self._cancel_request()
        self.connection.stream_done(self)
        exchange, self.exchange = self.exchange, None
        self.flow = None
        if exchange is not None:
            exchange.upstream_lost(reason, replied=replied, unprocessed=unprocessed, refused=refused)

    # --- as a transport, for the flow: back-pressure on this stream alone ---

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        unacked, self._unacked = self._unacked, 0
        if unacked and not self.closed:
            self._reopen(unacked)
            self.connection.outbox.flush_soon()

    def is_closing(self) -> bool:
        return self.closed

    def _cancel_request(self) -> None:
        """The response is over (or lost) while the request's side may still be open (an early answer): h2 would keep
        the stream half-open for good, counted against the peer's SETTINGS_MAX_CONCURRENT_STREAMS, so it is reset."""
        h2c = self.connection.h2
        stream = h2c.streams.get(self.stream_id)
        if stream is not None and not stream.closed and not self.connection.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                h2c.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
            self.connection.outbox.flush_soon()

    def _reopen(self, size: int) -> None:
        # KeyError: h2 drops a closed stream from `streams` whenever it counts the open ones (a new stream sent while
        # this read's events are handled), and increment_flow_control_window looks it up without a check.
        with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
            self.connection.h2.increment_flow_control_window(size, stream_id=self.stream_id)

    # --- what the exchange and the sweeper call ---

    def check_deadline(self, now: float) -> None:
        if self.deadline and now >= self.deadline:
            if self.reads != self.reads_seen and self.response_started:
                self.reads_seen = self.reads
                self.deadline = now + self._timeout
            elif self.flow is not None and self.flow.upstream_paused:
                self.deadline = now + self._timeout
            else:
                exchange, self.exchange = self.exchange, None
                self.abandon()
                if exchange is not None:
                    exchange.fail(504, f"the upstream did not answer in {self._timeout:g} s (limits.response_timeout)")

    def abandon(self) -> None:
        """The exchange ended before the response did: the stream is cancelled, the connection goes on."""
        self.exchange = None
        self.flow = None
        if not self.closed:
            self.closed = True
            self.deadline = 0.0
            # ProtocolError: a stream never opened (no head sent yet) has nothing to reset.
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.connection.h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
            self.connection.outbox.flush_soon()
            self.connection.stream_done(self)

    close = abandon
