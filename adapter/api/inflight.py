"""Reviews asked of Kubernetes on a caller's behalf, bounded: one in flight per key, at most `limit` at once.

A TokenReview or SubjectAccessReview is a request to the Kubernetes API that any caller can cause (any
made-up token, any namespace and metric name): callers of the same key share the review in flight, and
past `limit` distinct ones a caller is refused at once (ReviewsBusy, answered 429) rather than queued.
One owner (a source address, a user) starts at most a quarter of `limit`, so that one caller's flood
leaves room for the others' reviews (the HPA's allows expire and are asked again every few seconds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReviewsBusy(Exception):
    """Too many reviews in flight: answered 429 (the caller retries); never a verdict on the caller."""


class InFlight(Generic[K, V]):
    """`what` names the reviews and `limit_key` the config key of `limit`, for the warning when it refuses."""

    def __init__(self, limit: int, what: str, limit_key: str) -> None:
        self._limit = limit
        self._share = max(1, limit // 4)
        self._what = what
        self._limit_key = limit_key
        self._running: dict[K, asyncio.Task[V]] = {}
        self._owners: dict[str, int] = {}  # reviews each owner started that are still in flight
        self._refusals = LogThrottle(60.0)  # a line a minute, however many are refused

    async def run(self, key: K, owner: str, review: Callable[[], Coroutine[Any, Any, V]]) -> V:
        """The answer of the review in flight for `key`, started for `owner` if none is; raise ReviewsBusy
        past the limit or the owner's share of it."""
        task = self._running.get(key)
        if task is None:
            started = self._owners.get(owner, 0)
            if len(self._running) >= self._limit or started >= self._share:
                self._warn(owner, started)
                raise ReviewsBusy(f"{len(self._running)} {self._what} in flight, {started} for {owner!r}")
            task = asyncio.get_running_loop().create_task(review())
            self._running[key] = task
            self._owners[owner] = started + 1
            task.add_done_callback(lambda done: self._settled(key, owner, done))
        # Shielded: a caller that goes away does not cancel the review the others wait for.
        return await asyncio.shield(task)

    def _settled(self, key: K, owner: str, task: asyncio.Task[V]) -> None:
        del self._running[key]
        left = self._owners[owner] - 1
        if left:
            self._owners[owner] = left
        else:
            del self._owners[owner]
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have gone

    def _warn(self, owner: str, started: int) -> None:
        suppressed = self._refusals.allow(None)
        if suppressed is not None:
            log.warning(
                "%d %s in flight (%d for %r, a quarter of the limit at most), answering 429 to callers that "
                "need another; raise %s if they are legitimate%s",
                len(self._running),
                self._what,
                started,
                owner,
                self._limit_key,
                held_back(suppressed),
            )
