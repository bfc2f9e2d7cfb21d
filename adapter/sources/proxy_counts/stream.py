"""One subscription: the pending-count stream of one proxy replica, kept open and reopened when it breaks.

Each message is a whole snapshot of the replica's routes, so nothing is lost when messages are
coalesced or a stream is reopened: the newest message of a replica is kept, and applied at most once
per `coalesce` (the first after a quiet spell at once), except the edge from zero: a message that lifts
a route's held or in-flight count above the 0 last applied is applied at once
(docs/architecture.md#edge-from-zero), once per window beside the coalesced one and looked for in the
window's first message only, so a replica flooding messages still costs at most two applies and one such
look per window. A stream that stays silent past
`stale_after` (no update and no heartbeat) is abandoned and reopened; the source decides separately
when the replica's counts expire.

What a replica says is checked before it counts: a negative count, one above `max_count`, a route
listed twice or more than `max_routes` routes mark the replica failed (the metric is an error while
it is) instead of being added up. So is a replica that answers but refuses the stream: it is alive,
and its counts are unknown, not zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from adapter.config.http import HTTPSource
from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from adapter.telemetry import rpc as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)
_throttle = LogThrottle(10.0)

# (held, inflight) per route key `<namespace>/<name>`; a route the replica does not list has (0, 0)
Counts = dict[str, tuple[int, int]]

# Answers from a replica that was reached and said no, or said something that is not counts (INTERNAL:
# a message that does not decode): its counts exist but are not ours to add up.
_REFUSED = {
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
}
# UNAVAILABLE before the first message, for a reason that means something answered at that address:
# a TLS handshake one side refused, or a connection closed at once (no client certificate, a full
# connection cap). "Connection refused" or a timeout is a replica that is not there.
_REFUSED_AT_CONNECT = ("handshake", "socket closed")


def _refusal(err: grpc.aio.AioRpcError) -> bool:
    """Whether a stream that never delivered a message failed because a live replica refused it."""
    if err.code() in _REFUSED:
        return True
    details = (err.details() or "").lower()
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(marker in details for marker in _REFUSED_AT_CONNECT)


class Replica:
    """What one proxy replica last said, and when (monotonic)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.counts: Counts = {}
        self.heard_at: float | None = None
        self.connected = False
        # When it was found; until stale_after past this, a replica never heard from is waited for.
        self.found_at = time.monotonic()
        # Why its counts cannot be used (bad counts, refused stream), and when that was last seen.
        self.failure: str | None = None
        self.failed_at = 0.0
        self.silence_reported = False  # silent past stale_after while listed (logged once per silence)

    def live(self, now: float, stale_after: float) -> bool:
        return self.heard_at is not None and now - self.heard_at <= stale_after

    def failing(self, now: float, stale_after: float) -> str | None:
        """The failure seen within stale_after (after that, a replica that went silent is failing as silent)."""
        return self.failure if self.failure is not None and now - self.failed_at <= stale_after else None

    def fail(self, reason: str) -> None:
        self.failure, self.failed_at = reason, time.monotonic()

    def silent(self, now: float, stale_after: float) -> bool:
        """Neither heard from within stale_after nor still within stale_after of being found."""
        return not self.live(now, stale_after) and not self.awaited(now, stale_after)

    def awaited(self, now: float, stale_after: float) -> bool:
        """Found, never heard from, and not yet given up on."""
        return self.heard_at is None and now - self.found_at <= stale_after


# Called with the replica and the routes whose counts changed (all of them on its first message).
UpdateListener = Callable[[Replica, set[str]], None]


def _file_bytes(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def _channel(address: str, config: HTTPSource) -> grpc.aio.Channel:
    options: list[tuple[str, int | str]] = [
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", int(config.reconnect_min * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(config.reconnect_min * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(config.reconnect_max * 1000)),
    ]
    tls = config.tls
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    if config.tls_server_name is not None:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    # Read at each (re)connect, so rotated files are picked up by the next stream.
    credentials = grpc.ssl_channel_credentials(
        _file_bytes(tls.ca_file), _file_bytes(tls.key_file), _file_bytes(tls.cert_file)
    )
    return grpc.aio.secure_channel(address, credentials, options=options)


def _warn(source: str, replica: Replica) -> None:
    """One line per replica per interval about why its counts are not used."""
    held = _throttle.allow((source, replica.address))
    if held is not None:
        log.warning("http source %s: %s%s", source, replica.failure, held_back(held))


def impossible(message: pb.CountsUpdate, config: HTTPSource) -> str | None:
    """What makes the snapshot one no real proxy sends (a count outside 0..max_count, a route listed
    twice, more than max_routes routes), or None when it is sane."""
    if len(message.routes) > config.max_routes:
        return f"{len(message.routes)} routes in one snapshot (more than max_routes, {config.max_routes})"
    seen: set[str] = set()
    for route in message.routes:
        if route.route in seen:
            return f"route {route.route!r} twice in one snapshot"
        seen.add(route.route)
        for name, count in (("held", route.held), ("inflight", route.inflight)):
            if not 0 <= count <= config.max_count:
                return f"{name}={count} for route {route.route!r} (a count is 0..max_count, {config.max_count})"
    return None


class Subscription:
    def __init__(self, replica: Replica, config: HTTPSource, on_update: UpdateListener) -> None:
        self.replica = replica
        self._config = config
        self._on_update = on_update
        self._task: asyncio.Task[None] | None = None
        self._newest: pb.CountsUpdate | None = None
        self._flush: asyncio.TimerHandle | None = None
        self._applied_at = -config.coalesce
        self._early = False  # the latest apply was an edge from zero, within its window
        self._checked = False  # a message was checked for an edge from zero since the latest apply
        self._streaming = False  # the current stream has delivered a message

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"counts from {self.replica.address}")

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        config = self._config
        address = self.replica.address
        backoff = config.reconnect_min
        first = True
        while True:
            if not first:
                telemetry.PROXY_RECONNECTS.labels(config.name).inc()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, config.reconnect_max)
            first = False
            try:
                channel = _channel(address, config)
            except OSError as err:
                log.warning("http source %s: cannot read TLS files for %s: %s", config.name, address, err)
                continue
            try:
                if await self._stream(channel):
                    backoff = config.reconnect_min  # it worked for a while: start over with short waits
            except grpc.aio.AioRpcError as err:
                # Once a stream has carried counts, its end is a break (a restart, a rollout), not a refusal.
                if not self._streaming and _refusal(err):
                    self._failed(f"refused the count stream: {err.code().name}: {err.details()}")
                else:
                    log.debug("http source %s: stream from %s ended: %s", config.name, address, err.code().name)
            except TimeoutError:
                log.info("http source %s: %s silent for %gs; reconnecting", config.name, address, config.stale_after)
            finally:
                self._set_connected(False)
                await channel.close(grace=None)

    def _failed(self, what: str) -> None:
        """A live replica whose counts we cannot have: the metric is an error while it lasts."""
        config, replica = self._config, self.replica
        telemetry.PROXY_SUBSCRIPTIONS_REFUSED.labels(config.name).inc()
        replica.fail(f"{replica.address} {what}")
        _warn(config.name, replica)
        self._on_update(replica, set(replica.counts))

    async def _stream(self, channel: grpc.aio.Channel) -> bool:
        """Read one stream until it ends; True if at least one message came."""
        stub = pb_grpc.PendingCountsStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Watch(pb.WatchRequest())
        received = self._streaming = False
        while True:
            async with asyncio.timeout(self._config.stale_after):
                message = await call.read()
            if message is grpc.aio.EOF:  # type: ignore[attr-defined]  # missing from the stubs
                return received
            if not isinstance(message, pb.CountsUpdate):  # grpc hands over None for bytes it cannot decode
                self._failed("sent a message that is not a CountsUpdate")
                return received
            if not received:
                received = self._streaming = True
                self._set_connected(True)
            self._received(message)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.replica.connected:
            self.replica.connected = connected
            telemetry.PROXY_SUBSCRIPTIONS.labels(self._config.name).inc(1 if connected else -1)

    def _received(self, message: pb.CountsUpdate) -> None:
        """Keep the newest snapshot; apply it now, or once the replica's coalesce interval has passed."""
        if self._newest is not None:
            telemetry.PROXY_COUNTS_COALESCED.labels(self._config.name).inc()
        self._newest = message
        loop = asyncio.get_running_loop()
        delay = self._applied_at + self._config.coalesce - loop.time()
        if delay > 0 and not self._edge(message):
            if self._flush is None:
                self._flush = loop.call_later(delay, self._apply_newest)
            return
        if self._flush is not None:
            self._flush.cancel()
        self._apply_newest(early=delay > 0)

    def _edge(self, message: pb.CountsUpdate) -> bool:
        """Whether a message within the window is applied at once: it lifts a route from 0, and it is the
        window's first message looked at for that. Looking costs a walk of every route (more than decoding the
        message), so a replica flooding messages pays it once per window, not per message; an edge in a later
        message of the window waits for the window's end (`coalesce`, 5 ms)."""
        if self._early or self._checked:
            return False
        self._checked = True
        return self._rises(message)

    def _rises(self, message: pb.CountsUpdate) -> bool:
        """A route's count is above the 0 last applied: the edge from zero."""
        applied = self.replica.counts
        for route in message.routes:
            held, inflight = applied.get(route.route, (0, 0))
            if (route.held and not held) or (route.inflight and not inflight):
                return True
        return False

    def _apply_newest(self, early: bool = False) -> None:
        self._flush = None
        message, self._newest = self._newest, None
        if message is None:
            return
        self._applied_at = asyncio.get_running_loop().time()
        self._early, self._checked = early, False
        self._apply(message)

    def _apply(self, message: pb.CountsUpdate) -> None:
        replica, config = self.replica, self._config
        if message.sent_unix_nanos > 0:
            lag = (time.time_ns() - message.sent_unix_nanos) / 1e9
            telemetry.PROXY_MESSAGE_LAG_SECONDS.labels(config.name).observe(max(lag, 0.0))
        now = time.monotonic()
        was_live = replica.live(now, config.stale_after)
        previous = replica.counts if was_live else {}
        problem = impossible(message, config)
        if problem is not None:
            telemetry.PROXY_COUNTS_REJECTED.labels(config.name).inc()
            replica.fail(f"{replica.address} sent {problem}")
            _warn(config.name, replica)
            replica.heard_at = now  # alive and wrong: an error for the metric, not a replica to forget
            named = message.routes if len(message.routes) <= config.max_routes else ()
            self._on_update(replica, set(previous) | {route.route for route in named})
            return
        counts = {route.route: (route.held, route.inflight) for route in message.routes}
        changed = {route for route in counts.keys() | previous.keys() if counts.get(route) != previous.get(route)}
        recovered = replica.failure is not None
        replica.counts, replica.heard_at, replica.failure = counts, now, None
        if changed or not was_live or recovered:
            self._on_update(replica, changed | (set(counts) if not was_live or recovered else set()))
