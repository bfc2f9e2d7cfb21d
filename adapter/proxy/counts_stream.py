"""The proxy's side of the pending counts: a gRPC stream of every route's held and in-flight requests.

The proxy's hot path calls `_changed` synchronously on each count change; it only records the
numbers and, if no send is scheduled, schedules one. The first change after a quiet spell goes out
on the next loop turn; later ones within `coalesce` seconds share one message, except the edge from
zero (a route's held or in-flight count above the 0 last sent), which goes out on the next loop turn
too (docs/architecture.md#edge-from-zero), once per window: no traffic makes more than two messages
per window. Not once per route: every message is a snapshot of every route, so clients lifting one
idle route after another would cost a message of all the routes each (1,000 routes: 0.6 ms per
message and stream); a second edge within the window waits for its end, at most
`coalesce`. Each message is a whole snapshot, so a slow reader just gets the newest one (its wake-up
flag coalesces further).

A snapshot lists each route by its key, `<namespace>/<name>`, and only while it holds or forwards something:
a route whose held and in-flight counts are both 0 is left out, so a proxy of 10,000 mostly idle routes sends
the few that are busy (the adapter refuses a snapshot of more than its source's `max_routes`), and a deleted
route, which holds nothing once its requests are answered, leaves no entry behind. A route left out reads 0
(adapter/sources/proxy_counts/source.py), and its next lift is an edge from zero like any other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from adapter.config.grpc import CountsServerConfig
from adapter.proxy.counts import CountsListener
from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from adapter.rpc.server import Context, RunningServer, StreamSlots, start_server
from adapter.telemetry import rpc as telemetry

SERVICE = "zeroscale.proxy.v1.PendingCounts"
_SERVER = "counts"

# Proxy.subscribe: every route's counts after each change; returns the unsubscribe function.
SubscribeCounts = Callable[[CountsListener], Callable[[], None]]


class CountsHub:
    """The latest counts of every route holding or forwarding a request, and a wake-up flag per open stream."""

    def __init__(self, subscribe: SubscribeCounts, coalesce: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._coalesce = coalesce
        self._snapshot: dict[str, tuple[int, int]] = {}
        self._streams: set[asyncio.Event] = set()
        self._scheduled: asyncio.Handle | None = None
        self._delayed = False  # `_scheduled` waits for the coalescing window's end
        self._sent_at = -coalesce
        self._sent: dict[str, tuple[int, int]] = {}  # the snapshot at the latest send
        self._early = False  # the latest send was an edge from zero, within its window
        self._unsubscribe = subscribe(self._changed)

    def close(self) -> None:
        self._unsubscribe()
        if self._scheduled is not None:
            self._scheduled.cancel()

    def _changed(self, route: str, held: int, inflight: int) -> None:
        if held or inflight:
            self._snapshot[route] = (held, inflight)
        elif self._snapshot.pop(route, None) is None:
            return  # was idle and still is (a route's first report): nothing to send
        if self._scheduled is not None and not self._delayed:
            return  # goes out on the next loop turn
        delay = self._sent_at + self._coalesce - self._loop.time()
        if delay > 0 and not self._rises(route, held, inflight):
            if self._scheduled is None:
                self._scheduled = self._loop.call_later(delay, self._wake, False)
                self._delayed = True
            return
        if self._scheduled is not None:
            self._scheduled.cancel()
        self._scheduled = self._loop.call_soon(self._wake, delay > 0)
        self._delayed = False

    def _rises(self, route: str, held: int, inflight: int) -> bool:
        """A count of the route is above the 0 last sent: the edge from zero, not coalesced (once per window)."""
        if self._early:
            return False
        sent_held, sent_inflight = self._sent.get(route, (0, 0))
        return bool((held and not sent_held) or (inflight and not sent_inflight))

    def _wake(self, early: bool) -> None:
        self._scheduled = None
        self._sent_at = self._loop.time()
        self._early = early
        self._sent = dict(self._snapshot)
        for stream in self._streams:
            stream.set()

    def add(self, stream: asyncio.Event) -> None:
        self._streams.add(stream)

    def remove(self, stream: asyncio.Event) -> None:
        self._streams.discard(stream)

    def message(self, sequence: int, heartbeat: bool) -> pb.CountsUpdate:
        routes = [pb.RouteCounts(route=name, held=h, inflight=i) for name, (h, i) in self._snapshot.items()]
        return pb.CountsUpdate(routes=routes, sent_unix_nanos=time.time_ns(), sequence=sequence, heartbeat=heartbeat)


class PendingCounts(pb_grpc.PendingCountsServicer):
    def __init__(self, hub: CountsHub, config: CountsServerConfig) -> None:
        self._hub = hub
        self._heartbeat = config.heartbeat_interval
        self.slots = StreamSlots(_SERVER, config)

    async def Watch(self, request: pb.WatchRequest, context: Context) -> AsyncIterator[pb.CountsUpdate]:
        async with self.slots.hold(context, "Watch") as wake:
            self._hub.add(wake)
            try:
                sequence = 0
                yield self._hub.message(sequence, heartbeat=False)
                while True:
                    heartbeat = False
                    try:
                        async with asyncio.timeout(self._heartbeat):
                            await wake.wait()
                    except TimeoutError:
                        heartbeat = True
                    wake.clear()
                    if self.slots.closing:
                        return
                    sequence += 1
                    telemetry.STREAM_MESSAGES.labels(_SERVER, "Watch", "heartbeat" if heartbeat else "change").inc()
                    yield self._hub.message(sequence, heartbeat)
            finally:
                self._hub.remove(wake)


class CountsServer:
    """The running stream server of one proxy process."""

    def __init__(self, hub: CountsHub, running: RunningServer) -> None:
        self.hub = hub
        self.running = running
        self._stopped = False

    @property
    def port(self) -> int:
        return self.running.port

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await self.running.stop()
        self.hub.close()


async def start_counts_server(config: CountsServerConfig, subscribe: SubscribeCounts) -> CountsServer:
    """Serve the counts `subscribe` reports; raises OSError if it cannot listen."""
    hub = CountsHub(subscribe, config.coalesce)
    servicer = PendingCounts(hub, config)
    try:
        running = await start_server(
            config,
            _SERVER,
            lambda server: pb_grpc.add_PendingCountsServicer_to_server(servicer, server),  # type: ignore[no-untyped-call]
            [SERVICE],
            servicer.slots,
        )
    except OSError:
        hub.close()
        raise
    return CountsServer(hub, running)
