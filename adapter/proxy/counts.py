"""Per-route held and in-flight counts: the number the HPA scales on, published on every change.

A subscriber (the gRPC pending-count stream, a test) gets `(route, held, inflight)` after each change,
synchronously on the event loop: it must only record the numbers, never block.
"""

from __future__ import annotations

from collections.abc import Callable

from adapter.telemetry import proxy as telemetry

CountsListener = Callable[[str, int, int], None]


class RouteCounts:
    __slots__ = ("_listeners", "held", "held_bytes", "inflight", "route")

    def __init__(self, route: str) -> None:
        self.route = route
        self.held = 0
        self.held_bytes = 0
        self.inflight = 0
        self._listeners: list[CountsListener] = []
        # Read at scrape time, so the hot path only touches two integers.
        telemetry.HELD_REQUESTS.labels(route).set_function(lambda: self.held)
        telemetry.HELD_BYTES.labels(route).set_function(lambda: self.held_bytes)
        telemetry.INFLIGHT_REQUESTS.labels(route).set_function(lambda: self.inflight)

    @property
    def pending(self) -> int:
        """Held plus in-flight: requests that need a ready replica."""
        return self.held + self.inflight

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        """Call `listener` after every change; returns the function that unsubscribes it."""
        self._listeners.append(listener)
        listener(self.route, self.held, self.inflight)
        return lambda: self._listeners.remove(listener)

    def add(self, held: int, inflight: int) -> None:
        self.held += held
        self.inflight += inflight
        if self._listeners:
            for listener in list(self._listeners):
                listener(self.route, self.held, self.inflight)


class CountsBoard:
    """Every route's counts by key, across the route's versions: a changed route's new version adds to the same
    counts as the old one it replaces while the old one finishes what it admitted, so the HPA sees one sum.

    Subscribers hear every route, present and future. A route in mode activator reports what it holds only: what
    it forwarded is in a pod, whose sidecar counts it as in flight there (docs/architecture.md#activator), so a
    request is never counted twice.
    """

    def __init__(self) -> None:
        self._counts: dict[str, RouteCounts] = {}
        self._held_only: set[str] = set()
        self._listeners: list[CountsListener] = []

    def counts(self, key: str, *, held_only: bool) -> RouteCounts:
        """The counts of route `key` (made on first use); `held_only`: the route's current mode is activator."""
        if held_only:
            self._held_only.add(key)
        else:
            self._held_only.discard(key)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = RouteCounts(key)
            counts.subscribe(self._publish)
        return counts

    def drop(self, key: str) -> None:
        """Forget a route for good (deleted, and its last version drained): subscribers hear it at 0 last."""
        counts = self._counts.pop(key, None)
        self._held_only.discard(key)
        if counts is not None:
            for listener in list(self._listeners):
                listener(key, 0, 0)
            for gauge in (telemetry.HELD_REQUESTS, telemetry.HELD_BYTES, telemetry.INFLIGHT_REQUESTS):
                gauge.remove(key)

    def pending(self) -> int:
        return sum(counts.pending for counts in self._counts.values())

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        """Call `listener` after every change of any route (and now, once per route)."""
        self._listeners.append(listener)
        for key, counts in self._counts.items():
            listener(key, counts.held, 0 if key in self._held_only else counts.inflight)
        return lambda: self._listeners.remove(listener)

    def _publish(self, route: str, held: int, inflight: int) -> None:
        if route in self._held_only:
            inflight = 0
        for listener in self._listeners:
            listener(route, held, inflight)
