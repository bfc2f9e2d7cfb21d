"""When each series is next looked at: one timer and one heap for the whole cache.

Ten thousand series must not cost ten thousand coroutines and timers. Each item has at most one
live time (`due`); `at()` only ever moves it earlier, so a series asked a thousand times a second
pushes nothing after its first ask. One timer fires at the earliest time; its tick visits, in a
plain loop, every item due by then (and those due within `COALESCE`, so neighbours share one
source round trip), and gives the event loop back after `_TICK_BUDGET` of work, going on in the
next iteration: refresh work never holds the loop for more than about a millisecond at a time.
Heap entries whose time is no longer the item's are skipped (lazy deletion) and compacted away
when they outnumber the live ones.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

# Items due within this much after the tick are visited with it: their reads share a round trip.
COALESCE = 0.05
# Work done by one tick before it yields to the event loop (seconds), checked every _CHECK_EVERY visits.
_TICK_BUDGET = 0.0005
_CHECK_EVERY = 16
# Stale heap entries tolerated before a compaction, beyond half the heap.
_COMPACT_FLOOR = 1024


class Scheduled(Protocol):
    due: float | None  # the time of its one live heap entry; None while not scheduled


S = TypeVar("S", bound=Scheduled)


class Schedule(Generic[S]):
    def __init__(self, clock: Callable[[], float], visit: Callable[[S, float], None], max_sleep: float) -> None:
        """`visit(item, now)` is called once per due time; `max_sleep` bounds one timer wait (a clock
        that is not the event loop's, as in tests, is then re-read at least that often)."""
        self._clock = clock
        self._visit = visit
        self._max_sleep = max_sleep
        self._heap: list[tuple[float, int, S]] = []
        self._order = itertools.count()  # ties never compare items
        self._stale = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closed = False

    def at(self, item: S, when: float) -> None:
        """Visit `item` no later than `when` (an earlier time already set stands)."""
        if self._closed:
            return
        if item.due is not None:
            if item.due <= when:
                return
            self._stale += 1
        item.due = when
        heapq.heappush(self._heap, (when, next(self._order), item))
        if self._stale > _COMPACT_FLOOR and self._stale * 2 > len(self._heap):
            self._compact()
        if self._timer is None or when < self._timer_at:
            self._arm(when)

    def cancel(self, item: S) -> None:
        if item.due is not None:
            item.due = None
            self._stale += 1

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if entry[2].due == entry[0]]
        heapq.heapify(self._heap)
        self._stale = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = min(max(when - self._clock(), 0.0), self._max_sleep)
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self._clock()
        horizon = now + COALESCE
        heap = self._heap
        started = time.perf_counter()
        visited = 0
        while heap and heap[0][0] <= horizon:
            when, _, item = heapq.heappop(heap)
            if item.due != when:
                self._stale -= 1
                continue
            item.due = None
            try:
                self._visit(item, now)
            except Exception:  # a bug for one item must not stop the others' visits
                log.exception("visit of %s failed", item)
            visited += 1
            if visited % _CHECK_EVERY == 0 and time.perf_counter() - started > _TICK_BUDGET:
                self._arm(now)  # the rest in the next iteration of the loop, after what is waiting
                return
        if heap:
            self._arm(heap[0][0])
