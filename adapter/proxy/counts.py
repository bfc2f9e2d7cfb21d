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
