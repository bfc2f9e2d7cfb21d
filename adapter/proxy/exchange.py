"""One accepted request and its way through the proxy: read, held or assigned, forwarded, answered.

Every accepted request ends in exactly one of: a forwarded response, or an explicit error from the
proxy (413/502/503/504), or the client going away (counted as 499). `state` makes that single ending
explicit: once DONE, nothing else writes for it. Only the exchange changes its state; the route asks
for a transition (`to_queue`, `to_endpoint`, `to_route`), everything else ends it (`fail`, `client_gone`,
`response_done`, `tunnel_opened`, `upstream_lost`)::

                                                 retry (connect failed, stale connection,
                 submit: no room                 an HTTP/2 stream the upstream did not process)
        NEW ----------------------> QUEUED <----------------------------------+
         |                            |                                       |
         | submit: an endpoint        | pump: an endpoint has room            |
         | has room                   v                                       |
         +----------------------> ASSIGNED -----------------------------------+
                                      |       (upstream attached: body streams through)
            fail / client_gone /      |
            response_done /           v
            tunnel_opened  ------->  DONE  (from any state; route.leave gives back what it held)

The fallback (docs/architecture.md#fallback): QUEUED past `fallback.after` (`Route.hold_bound`), or NEW over a full
queue with `overflow: fallback`, -> NEW on the fallback's route (`to_route`), which submits it as any request.

Held bytes: the body pieces buffered while QUEUED or ASSIGNED are counted in the route's
`counts.held_bytes`, changed only through `_hold_bytes` / `_release_bytes` below.

Protocols: the exchange is the same for an HTTP/1.1 request and an HTTP/2 stream. Its two ends are the client
(`client`, with its `flow`: a ClientConnection and its Flow, or an h2client.H2Stream, which is both) and the
upstream (an upstream.UpstreamConnection, or an h2upstream.H2UpstreamStream). The request is kept as its client
sent it, in its forwarded form (`head`: HTTP/1.1 bytes or HTTP/2 fields; body pieces unframed), and put in the
upstream's form when it is sent (`attach`): docs/architecture.md#h2.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import TYPE_CHECKING

from adapter.proxy import trace
from adapter.proxy.h2wire import Fields, chunk_end, h1_request_head, h2_head_of_h1
from adapter.proxy.http1 import CHUNK_END, chunk
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from adapter.proxy.choices import OwnAnswer
    from adapter.proxy.client import ClientConnection
    from adapter.proxy.flow import Flow
    from adapter.proxy.h2client import H2Stream
    from adapter.proxy.h2upstream import H2UpstreamStream
    from adapter.proxy.route import Route
    from adapter.proxy.upstream import Endpoint, UpstreamConnection

NEW, QUEUED, ASSIGNED, DONE = range(4)
# A request already written upstream is re-sent elsewhere only if its bytes are this small (idempotent methods).
_MAX_REPLAY_BYTES = 64 * 1024
_MAX_ATTEMPTS = 3


class Exchange:
    __slots__ = (
        "attempts",
        "body",
        "body_done",
        "body_size",
        "choice",
        "chunked",
        "client",
        "cold",
        "content_length",
        "endpoint",
        "expect_continue",
        "fallback_at",
        "flow",
        "frame",
        "grpc",
        "head",
        "held_at",
        "hold_timeout",
        "hold_until",
        "http10",
        "idempotent",
        "is_head",
        "keep_alive",
        "pool_upstream",
        "refusals",
        "replay",
        "replay_size",
        "response_started",
        "route",
        "sent_at",
        "span",
        "state",
        "timer",
        "trailers",
        "upgrade",
        "upstream",
        "waited",
        "written",
    )

    def __init__(
        self,
        client: ClientConnection | H2Stream,
        route: Route,
        head: bytes | Fields,
        chunked: bool,
        content_length: int | None,
        keep_alive: bool,
        upgrade: bool,
        expect_continue: bool,
        http10: bool,
        is_head: bool,
        idempotent: bool,
        pool_upstream: bool,
        span: Span | None,
    ) -> None:
        self.client = client
        self.flow: Flow | H2Stream = client.flow
        self.route = route
        self.head = head
        self.chunked = chunked
        # Whether body pieces are chunk-framed on their way up (an HTTP/1.1 upstream, a body of unknown length).
        self.frame = chunked
        # The request's trailer fields (an HTTP/2 client's), sent after its body where the upstream can carry them.
        self.trailers: Fields | None = None
        # A gRPC call: the proxy's own answers are gRPC statuses (h2wire.error_fields).
        self.grpc = False
        # A hold bound of the request's own, shorter than the route's (a gRPC call's grpc-timeout); 0: none.
        self.hold_timeout = 0.0
        self.content_length = content_length
        self.keep_alive = keep_alive
        self.upgrade = upgrade
        self.expect_continue = expect_continue
        self.http10 = http10
        self.is_head = is_head
        # Whether the upstream connection may go back to the pool after this exchange (see CONTENT_UNDEFINED).
        self.pool_upstream = pool_upstream
        # Body pieces (unframed) waiting for an upstream connection.
        self.body: list[bytes] = []
        self.body_size = 0
        self.body_done = False
        # Body pieces already written, kept (small, idempotent requests only, or any sent on an HTTP/2 stream) to
        # re-send on another endpoint.
        self.idempotent = idempotent
        self.replay: list[bytes] | None = [] if idempotent else None
        self.replay_size = 0
        self.state = NEW
        self.upstream: UpstreamConnection | H2UpstreamStream | None = None
        self.endpoint: Endpoint | None = None
        self.written = False
        self.response_started = False
        # When the request was first held (monotonic), and how long it waited before going upstream.
        self.held_at = 0.0
        self.waited = 0.0
        # When the hold runs out (the loop's time), set at the first hold: `timer` fires then while it waits.
        self.hold_until = 0.0
        # When (the loop's time) the held request may go to the route's fallback; 0: no such bound ahead. The hold's
        # one timer fires first at it, then at `hold_until` (docs/architecture.md#fallback).
        self.fallback_at = 0.0
        self.cold = False
        # The cold-start choice it meets (choices.py; None: none, held as any request), set by its client end.
        self.choice: int | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.sent_at = 0.0
        self.attempts = 0
        # Attempts an HTTP/2 upstream refused unprocessed (REFUSED_STREAM): not failures, the endpoint paces them.
        self.refusals = 0
        # The request's span (zeroscale.proxy.request; None: tracing was off when its head was read, and nothing
        # traces it): adapter/proxy/trace.py.
        self.span = span

    # --- the request body, as the client sends it ---

    def body_data(self, data: bytes) -> None:
        if self.state == DONE:
            return
        if self.upstream is not None:
            self.flow.to_upstream(chunk(data) if self.frame else data)
            self._keep_for_replay(data)
            return
        self._buffer(data)
        if self.state == ASSIGNED and self.body_size > self.route.limits.max_held_body_bytes:
            # Connecting: wait for the connection instead of buffering more.
            self.client.pause_reading_for_body()
        else:
            self.check_held_body()

    def check_held_body(self) -> None:
        """The bounds on buffered bodies: 413 for this request, 503 when the route holds too many bytes."""
        limits = self.route.limits
        if self.body_size > limits.max_held_body_bytes:
            self.fail(
                413,
                f"the request body is larger than {limits.max_held_body_bytes} bytes while held"
                " (limits.max_held_body_bytes)",
            )
        elif self.state == QUEUED and self.route.counts.held_bytes > limits.max_held_bytes:
            self.fail(
                503,
                "the proxy holds too many request bytes for this route (limits.max_held_bytes)",
                retry_after=limits.retry_after,
            )

    def body_end(self) -> None:
        self.body_done = True
        if self.state == DONE:
            return
        upstream = self.upstream
        if upstream is None:
            return  # `attach` (and a retry) ends the body: body_done
        if self.frame:
            self.flow.to_upstream(chunk_end(self.trailers) if self.trailers else CHUNK_END)
        self.sent_at = sent_at = monotonic()
        upstream.expect_response(self.route.limits.response_timeout, sent_at)

    def _buffer(self, data: bytes) -> None:
        self.body.append(data)
        self.body_size += len(data)
        if self.state in (QUEUED, ASSIGNED):
            self._hold_bytes(len(data))

    def _hold_bytes(self, size: int) -> None:
        self.route.counts.held_bytes += size

    def _release_bytes(self, size: int) -> None:
        self.route.counts.held_bytes -= size

    def _keep_for_replay(self, data: bytes) -> None:
        if self.replay is not None:
            self.replay_size += len(data)
            if self.replay_size > _MAX_REPLAY_BYTES:
                self.replay = None
            else:
                self.replay.append(data)

    # --- transitions the route asks for ---

    def to_queue(self, *, cold: bool) -> Endpoint | None:
        """NEW or ASSIGNED -> QUEUED (held; `cold`: while no endpoint is usable). Returns the endpoint it left.

        The hold deadline is set the first time only: a retried request keeps the deadline of its first hold (the
        timer, cancelled when the request was sent, is armed again for that same time).
        """
        if self.state == NEW:
            self._hold_bytes(self.body_size)
        endpoint, self.endpoint = self.endpoint, None
        self.state = QUEUED
        loop = asyncio.get_running_loop()
        if not self.held_at:
            self.held_at = monotonic()
            now = loop.time()
            self.hold_until = now + (self.hold_timeout or self.route.limits.hold_timeout)
            after = self.route.fallback_after
            if after and now + after < self.hold_until:
                self.fallback_at = now + after
        if self.timer is None:
            self.timer = loop.call_at(self.fallback_at or self.hold_until, self.hold_expired)
        if cold:
            self.cold = True
        return endpoint

    def to_route(self, route: Route) -> None:
        """NEW or QUEUED (its old route already gave back its place) -> NEW on `route` (the fallback, which submits
        it): its buffered bytes are held there from now on; its hold keeps its deadline."""
        if self.state == QUEUED and self.body_size:
            self._release_bytes(self.body_size)
        self.route = route
        self.state = NEW

    def to_endpoint(self, endpoint: Endpoint) -> float | None:
        """NEW or QUEUED -> ASSIGNED to `endpoint`, sent on one of its idle connections or on a new one once
        connected; returns the seconds it was held (None: never held)."""
        waited = None
        if self.state == QUEUED:
            waited = self.waited = monotonic() - self.held_at
        elif self.body_size:  # no call for an empty body: docs/architecture.md#hot-skipped-calls
            self._hold_bytes(self.body_size)
        self.state = ASSIGNED
        self.endpoint = endpoint
        connection = endpoint.dispatch(self)
        if connection is not None:
            self.attach(connection)
        return waited

    # --- the upstream side ---

    def attach(self, upstream: UpstreamConnection | H2UpstreamStream) -> None:
        """Send everything read so far on `upstream`; from now on the body streams through."""
        self.upstream = upstream
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if upstream.multiplexed:
            self._attach_stream(upstream)  # type: ignore[arg-type]
            return
        head = self.head
        if not isinstance(head, bytes):
            # An HTTP/2 client's request to an HTTP/1.1 upstream: a whole body is sent with its length.
            length = self.content_length
            if length is None and self.body_done:
                length = self.body_size + (self.replay_size if self.replay else 0)
            head = h1_request_head(head, length)
            self.frame = length is None
        if not (self.replay or self.body or self.body_done):
            # The common case (headers just read, nothing buffered): one write, no list.
            self.flow.pair(upstream, head)  # type: ignore[arg-type]
            self.written = True
            self.attempts += 1
            if self.span is not None:
                self._traced_send(self.span)
            return
        frame = self.frame
        pieces = [head]
        if self.replay:
            pieces.extend([chunk(piece) for piece in self.replay] if frame else self.replay)
        if self.body:
            pieces.extend([chunk(piece) for piece in self.body] if frame else self.body)
            self._body_sent()
        if self.body_done and frame:
            pieces.append(chunk_end(self.trailers) if self.trailers else CHUNK_END)
        self.flow.pair(upstream, b"".join(pieces) if len(pieces) > 1 else head)  # type: ignore[arg-type]
        self.written = True
        self.attempts += 1
        if self.span is not None:
            self._traced_send(self.span)
        self._sent_whole(upstream)

    def _attach_stream(self, upstream: H2UpstreamStream) -> None:
        """`attach` for an HTTP/2 upstream: the head as fields, the body as DATA, the end as END_STREAM."""
        if self.upgrade:
            upstream.abandon()
            self.upstream = None
            self.fail(501, "an upgrade cannot be carried to an HTTP/2 upstream (the route's upstream.protocol)")
            return
        head = self.head if isinstance(self.head, list) else h2_head_of_h1(self.head, self.content_length)
        self.frame = False
        if self.replay is None and not self.attempts:
            # The upstream may refuse the stream unprocessed (REFUSED_STREAM, GOAWAY): then any request may be sent
            # again (RFC 9113 8.7), so its bytes are kept whatever its method.
            self.replay = []
        self.flow.link(upstream)
        upstream.send_head(head)
        for piece in self.replay or ():
            upstream.write(piece)
        if self.body:
            for piece in self.body:
                upstream.write(piece)
            self._body_sent()
        self.written = True
        self.attempts += 1
        if self.span is not None:
            self._traced_send(self.span)
        self._sent_whole(upstream)

    def _traced_send(self, span: Span) -> None:
        """The request was written upstream: an event of its span (tracing on only)."""
        endpoint = self.endpoint
        trace.forwarded(span, f"{endpoint.host}:{endpoint.port}" if endpoint is not None else "", self.attempts)

    def _body_sent(self) -> None:
        """The buffered body went upstream: kept for a replay, no longer held."""
        self._release_bytes(self.body_size)
        for piece in self.body:
            self._keep_for_replay(piece)
        self.body = []
        self.body_size = 0
        self.client.resume_reading_for_body()

    def _sent_whole(self, upstream: UpstreamConnection | H2UpstreamStream) -> None:
        """The request is whole upstream once its body is: its response is due from then on."""
        if self.body_done:
            self.sent_at = sent_at = monotonic()
            upstream.expect_response(self.route.limits.response_timeout, sent_at)

    def response_begins(self, close: bool, status: int) -> None:
        """The response's head came (`status`), and goes to the client now: nothing re-sends the request from here;
        `close`: the client's connection ends with this response."""
        route = self.route
        if self.span is not None:
            trace.first_byte(self.span, status)
        if self.sent_at:
            route.stats.upstream_seconds.observe(monotonic() - self.sent_at)
        self.response_started = True
        if close:
            self.keep_alive = False
        if self.cold:
            route.first_byte(self.span)

    def response_withdrawn(self) -> None:
        """The head that came was refused before any of it reached the client: the proxy answers instead."""
        self.response_started = False

    def retriable(self, unprocessed: bool) -> bool:
        """No byte reached an upstream, or no response byte came, we still have the request's bytes, and the upstream
        did not act on them: it said so (`unprocessed`), or the method is idempotent."""
        if self.response_started or self.attempts - self.refusals >= _MAX_ATTEMPTS:
            return False
        return not self.written or (self.replay is not None and (self.idempotent or unprocessed))

    def upstream_lost(self, reason: str, *, replied: bool, unprocessed: bool = False, refused: bool = False) -> None:
        """The upstream connection broke before the response was complete (`replied`: after some of it came;
        `unprocessed`: an HTTP/2 upstream said it did not process the stream; `refused`: by REFUSED_STREAM, its
        way of saying "not now", which the endpoint paces (Endpoint.refused) and no attempt budget counts: the
        hold_timeout bounds it)."""
        self.upstream = None
        if self.state == DONE:
            return
        if refused:
            self.refusals += 1
        if not replied and self.retriable(unprocessed):
            telemetry.RETRIES.labels(self.route.name).inc()
            self.route.retry(self)
        elif self.response_started:
            telemetry.ERRORS.labels(self.route.name, "502").inc()
            self._end(trace.ERROR, 0, f"the upstream {reason} after its response began")
            self.client.abort()
        else:
            self.fail(502, f"the upstream {reason} before answering")

    def response_done(self) -> None:
        """The whole response went to the client (its upstream connection is pooled or closed): the client goes on."""
        self.upstream = None
        if self.state == DONE:
            return
        self._end()
        # reusable; positional on the hot path (docs/architecture.md#hot-head-tuples)
        self.client.exchange_finished(self, self.body_done and self.keep_alive)

    def tunnel_opened(self) -> None:
        """The upgrade succeeded: the connection now belongs to the tunnel, and the request has ended."""
        self.upstream = None
        if self.state != DONE:
            self._end(trace.TUNNEL)

    # --- endings ---

    def hold_expired(self) -> None:
        self.timer = None
        if self.fallback_at:
            # The fallback's bound came first: the route sends it there, or the timer is armed for the hold's end.
            self.fallback_at = 0.0
            if self.route.hold_bound(self):
                return
            self.timer = asyncio.get_running_loop().call_at(self.hold_until, self.hold_expired)
            return
        if self.state == QUEUED or (self.state == ASSIGNED and self.upstream is None):
            why = self.route.why_still_held()
            if self.hold_timeout:
                self.fail(504, f"the call's grpc-timeout ({self.hold_timeout:g} s) ran out while it was held{why}")
                return
            timeout = self.route.limits.hold_timeout
            self.fail(504, f"the workload did not become ready in {timeout:g} s (limits.hold_timeout){why}")

    def fail(self, code: int, message: str, *, retry_after: int | None = None) -> None:
        """Answer the client with an error of the proxy's own (or cut it off if a response already began)."""
        if self.state == DONE:
            return
        telemetry.ERRORS.labels(self.route.name, str(code)).inc()
        self._close_upstream()
        self._end(trace.ERROR, code, message)
        if self.response_started:
            self.client.abort()
        else:
            self.client.answer(self, code, message, retry_after)

    def answer_here(self, answer: OwnAnswer) -> None:
        """Answered by the proxy with a configured answer (a never-wake rule's, the waking page) before it was held
        or sent anywhere: it ends here, having counted nowhere."""
        if self.state == DONE:
            return
        self._end(trace.ANSWERED_HERE, answer.status)
        self.client.answer_here(self, answer)

    def client_gone(self) -> None:
        if self.state == DONE:
            return
        telemetry.ERRORS.labels(self.route.name, "499").inc()
        self._close_upstream()
        self._end(trace.CLIENT_GONE, 499)

    def _close_upstream(self) -> None:
        """Close the upstream connection this exchange holds, if any; a half-done exchange leaves it unusable."""
        upstream = self.upstream
        self.upstream = None
        if upstream is not None:
            upstream.abandon()

    def _end(self, outcome: str = trace.FORWARDED_OUTCOME, code: int = 0, message: str = "") -> None:
        """The exchange's one ending (`outcome`, `code` and `message` for its span: trace.end)."""
        span = self.span
        if span is not None:
            hold = trace.held_for(self.held_at, self.waited, self.state == QUEUED)
            trace.end(span, outcome, code, message, self.cold, hold, self.attempts)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.body_size and self.state in (QUEUED, ASSIGNED):  # docs/architecture.md#hot-skipped-calls
            self._release_bytes(self.body_size)
        self.route.leave(self)
        self.endpoint = None
        self.state = DONE
        if self.body:  # what was buffered is dropped (nothing is added once DONE)
            self.body = []
        self.replay = None
