"""The `http` source: a route's held and in-flight requests, summed over every proxy replica.

Counts arrive pushed (adapter/sources/proxy_counts/stream.py); `query` only adds up what is in memory.
A sum is served only when it covers every replica discovery lists now (adapter/sources/proxy_counts/discovery.py:
every address of every name; a name that never answered fails the read). A replica stays in the sum
while it was heard from within `stale_after`, even with its stream broken. A replica still listed
that has been silent for longer (or never spoke within `stale_after` of being found) fails the read:
it may hold requests nobody else counts, and leaving it out would be a made-up smaller sum. It
drops out only once discovery no longer lists it (and its last counts are older than `stale_after`).
A replica that answers but refuses the stream, or sends counts that cannot be true, fails the read.
With no replica heard from at all, the source has nothing to say and raises SourceError rather
than a zero it does not know.

Routes are keyed `<namespace>/<name>` in the counts; a query reads `route=<name>` in its own namespace only.
A replica's snapshot lists only the routes it holds or forwards something for (adapter/proxy/counts_stream.py):
a route it does not list has 0 there, so a route no heard-from replica lists reads 0 (an idle route, or
one that does not exist: no replica holds anything for either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from decimal import Decimal

from adapter.config.http import HTTPMetric, HTTPSource
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.sources.proxy_counts.discovery import Discovery
from adapter.sources.proxy_counts.stream import Replica, Subscription
from adapter.telemetry import rpc as telemetry

log = logging.getLogger(__name__)

# A query made while a found replica has not spoken yet waits this long for it (streams open at start).
_FIRST_CONTACT_WAIT = 2.0
_COUNT_INDEX = {"held": (0,), "inflight": (1,), "pending": (0, 1)}


class ProxyCounts(Source):
    def __init__(self, config: HTTPSource) -> None:
        super().__init__()
        self._config = config
        self._discovery = Discovery(config)
        self._replicas: dict[str, Replica] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._watched: dict[SourceQuery, None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()  # subscriptions of replicas that left the Service
        self._heard = asyncio.Event()
        self._discovered = False
        self._too_many: str | None = None  # why discovery's answer cannot be summed (over max_replicas)
        # Set (and replaced) whenever a replica is found, speaks or fails: what a waiting query waits on.
        self._progress = asyncio.Event()
        telemetry.PROXY_REPLICAS.labels(config.name).set_function(self._live_count)

    # --- lifecycle: discovery and expiry run once the first series is watched or read ---

    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._discover(), name=f"http source {self._config.name} discovery"),
                asyncio.create_task(self._expire(), name=f"http source {self._config.name} expiry"),
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._closing, return_exceptions=True)
        await asyncio.gather(*(subscription.close() for subscription in self._subscriptions.values()))
        self._subscriptions.clear()

    async def _discover(self) -> None:
        discovery = self._discovery
        while True:
            self._follow(await discovery.refresh())
            self._discovered = True
            self._progressed()
            if discovery.fixed:
                return  # a fixed list never changes
            await asyncio.sleep(self._config.resolve_interval)

    def _follow(self, addresses: list[str]) -> None:
        """Subscribe to new replicas, stop following gone ones (their counts expire like a silent replica's)."""
        config = self._config
        telemetry.PROXY_LISTED.labels(config.name).set(len(addresses))
        was, self._too_many = self._too_many, None
        if len(addresses) > config.max_replicas:
            # The sum could not cover them all: no sum at all, and no channel or task beyond the bound.
            self._too_many = (
                f"discovery lists {len(addresses)} proxy replicas, more than max_replicas ({config.max_replicas})"
            )
            if was is None:
                log.warning("http source %s: %s; raise it if they are real", config.name, self._too_many)
            addresses = addresses[: config.max_replicas]
        for address in addresses:
            if address not in self._subscriptions:
                replica = self._replicas.setdefault(address, Replica(address))
                subscription = Subscription(replica, config, self._updated)
                subscription.start()
                self._subscriptions[address] = subscription
        for address in set(self._subscriptions) - set(addresses):
            log.info("http source %s: %s left the Service", config.name, address)
            gone = self._subscriptions.pop(address)
            closing = asyncio.create_task(gone.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _expire(self) -> None:
        stale_after = self._config.stale_after
        while True:
            await asyncio.sleep(min(stale_after / 4, 0.25))
            now = time.monotonic()
            for address, replica in list(self._replicas.items()):
                silent = replica.silent(now, stale_after)
                if address in self._subscriptions:  # still listed: silence fails the read, it never drops out
                    if silent and not replica.silence_reported:
                        log.warning(
                            "http source %s: %s still listed but silent for %gs: the metric fails until it "
                            "speaks again or leaves discovery",
                            self._config.name,
                            address,
                            stale_after,
                        )
                        self._notify(set(replica.counts))
                    replica.silence_reported = silent
                    continue
                if not silent:
                    continue
                log.warning("http source %s: dropping %s, gone from discovery and silent", self._config.name, address)
                telemetry.PROXY_DROPPED.labels(self._config.name).inc()
                del self._replicas[address]
                self._notify(set(replica.counts))

    # --- push ---

    def watch(self, query: SourceQuery) -> None:
        self._start()
        self._watched[query] = None

    def unwatch(self, query: SourceQuery) -> None:
        self._watched.pop(query, None)

    def _updated(self, replica: Replica, routes: set[str]) -> None:
        if replica.failure is None:
            self._heard.set()
        self._progressed()
        self._notify(routes)

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _notify(self, routes: set[str]) -> None:
        """Tell the cache about each watched series reading one of `routes` (keys `<namespace>/<name>`)."""
        for query in list(self._watched):
            if not routes.isdisjoint(_keys(query)):
                self.changed(query)

    # --- reads ---

    def _live(self) -> list[Replica]:
        now = time.monotonic()
        return [replica for replica in self._replicas.values() if replica.live(now, self._config.stale_after)]

    def _live_count(self) -> int:
        return len(self._live())

    def _awaited(self, now: float) -> list[str]:
        """Replicas found whose first counts have not come yet (all of them before the first discovery)."""
        if not self._discovered:
            return ["the first discovery"]
        stale_after = self._config.stale_after
        return sorted(a for a, s in self._subscriptions.items() if s.replica.awaited(now, stale_after))

    async def _settle(self) -> None:
        """Wait, up to _FIRST_CONTACT_WAIT, until every replica found has answered or been given up on."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FIRST_CONTACT_WAIT
        while self._awaited(time.monotonic()) and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), deadline - loop.time())

    def _unusable(self) -> str | None:
        """Why no sum can be served now though replicas answer: one fails, or one has not answered yet."""
        if self._too_many is not None:
            return self._too_many
        unresolved = self._discovery.unresolved
        if unresolved and self._discovered:
            return f"cannot resolve {', '.join(unresolved)} yet (no sum while the replicas a name lists are unknown)"
        now = time.monotonic()
        stale_after = self._config.stale_after
        listed = [s.replica for s in self._subscriptions.values()]
        failing = sorted(filter(None, (replica.failing(now, stale_after) for replica in listed)))
        failing += sorted(
            f"{replica.address} is listed but silent for more than stale_after ({stale_after:g}s)"
            for replica in listed
            if replica.silent(now, stale_after) and replica.failing(now, stale_after) is None
        )
        if failing:
            return "; ".join(failing) + " (no sum while a replica's counts are unknown)"
        awaited = self._awaited(now)
        if awaited:
            return f"waiting for the first counts of {', '.join(awaited)} (at most stale_after, {stale_after:g}s)"
        return None

    async def query(self, query: SourceQuery) -> list[Sample]:
        self._start()
        await self._settle()
        problem = self._unusable()
        if problem is not None:
            raise SourceError(problem)
        live = self._live()
        if not live:
            known = ", ".join(sorted(self._replicas)) or "none found yet"
            raise SourceError(
                f"no proxy replica has sent counts within {self._config.stale_after:g}s (replicas: {known})"
            )
        metric = query.metric
        assert isinstance(metric, HTTPMetric)
        fields = _COUNT_INDEX[metric.count]
        samples = []
        for route, key in zip(query.params.get("route", ()), _keys(query), strict=True):
            # A replica lists only the routes it holds or forwards something for: one it does not list has 0.
            total = sum(counts[i] for replica in live if (counts := replica.counts.get(key)) for i in fields)
            samples.append(Sample(Decimal(total), {"route": route}))
        return samples

    async def check(self) -> None:
        self._start()
        try:
            await asyncio.wait_for(self._heard.wait(), self._config.stale_after)
        except TimeoutError:
            raise SourceError(f"no proxy replica answered within {self._config.stale_after:g}s") from None


def _keys(query: SourceQuery) -> list[str]:
    """The routes a query reads, as the proxies key their counts: `<namespace>/<name>` in the asking namespace
    (a name is a route's name, never a key: HTTPMetric.value_problem), so no namespace reads another's routes."""
    return [f"{query.namespace}/{route}" for route in query.params.get("route", ())]
