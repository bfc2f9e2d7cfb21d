"""What the control plane hands the data plane: an immutable routing table, swapped whole.

A connection looks its route up in its listener's current table for each request, so a swap takes the next
request at once, and a request already admitted keeps the `Route` it was admitted on (its exchange holds it) and
finishes there. Swapping is one attribute store: the warm path pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from adapter.proxy.route import Route
from adapter.proxy.routing import Router

_MIN_TICK, _MAX_TICK = 0.01, 1.0


@dataclass(frozen=True)
class RouteTable:
    """The routes served now, by key, and the router of the proxy's main port over them."""

    routes: Mapping[str, Route] = field(default_factory=dict)
    router: Router[Route] = field(default_factory=lambda: Router([]))

    @staticmethod
    def of(routes: list[Route]) -> RouteTable:
        """The table of `routes`, in the order their claims were placed (adapter/proxy/claims.py)."""
        router = Router((route.config, route) for route in routes)
        return RouteTable({route.name: route for route in routes}, router)

    def sweep_tick(self, *timeouts: float) -> float:
        """How often the data plane checks connections' deadlines: a quarter of the shortest timeout (the
        connection-wide `timeouts` and every route's), between 10 ms and 1 s, so a timeout fires at most 25% late
        (docs/architecture.md#hot-lazy-deadline)."""
        limits = [route.limits for route in self.routes.values()]
        shortest = min(
            [
                *timeouts,
                *(limit.response_timeout for limit in limits),
                *(limit.body_timeout for limit in limits),
                *(limit.tunnel_idle_timeout for limit in limits),
            ]
        )
        return min(max(shortest / 4, _MIN_TICK), _MAX_TICK)


class Listener:
    """One listening port's routing: the main port follows the whole table, an activator route's port its one
    route (whatever the Host). The control plane replaces `router`; connections read it per request."""

    __slots__ = ("router",)

    def __init__(self, router: Router[Route] | None = None) -> None:
        self.router: Router[Route] = router if router is not None else Router([])
