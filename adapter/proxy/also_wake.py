"""A route's `also_wake` (docs/architecture.md#also-wake): more workloads woken together with the route's target,
each by its own check of the route's wake policy; the route's readiness stays its upstream's alone.

One `AlsoWake` per extra target and policy, shared by every route (and route version) that names that target with
that policy: however many of them are cold together, one wake loop reads the target's Scale (and, wake: scale, its
namespace's HPAs, shared as every wake shares them) every `wake_retry_interval` and patches it only while it reads 0.
A route asks for it after each attempt of its own waker that woke its target or found it above 0 (a target refused or
not read wakes nothing more); the loop runs while some route that asked still holds requests with no usable endpoint.

Each attempt is the route waker's own (adapter/proxy/wake.py: the same reads, precondition and conflicts); what a
result does differs: a refusal (a workload a person stopped) answers no request, since the route's held requests wait
for its own upstream; it is logged and counted per route, as is each wake sent
(zeroscale_proxy_cold_choices_total{choice="also_wake_refused" | "also_wake"}).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapter.config.route import RouteConfig, ScaleTarget
from adapter.kube.client import KubeClient
from adapter.proxy.intent import Refusal
from adapter.proxy.wake import WakeListener, Waker
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """What of a route decides how an extra target is woken: routes that agree on it share one loop per target."""

    wake: str
    wake_without_hpa: bool
    replicas: int
    retry_interval: float

    @classmethod
    def of(cls, config: RouteConfig) -> Policy:
        return cls(config.wake, config.wake_without_hpa, config.wake_replicas, config.wake_retry_interval)


def series(target: ScaleTarget) -> str:
    """The `route` label of an extra target's own wake series (wakes_total, wake_refusals_total, target_replicas):
    two slashes, so it is never a route's `<namespace>/<name>`."""
    return f"also_wake:{target.namespace}/{target.kind}/{target.name}"


class AlsoWake:
    """One extra target under one policy, woken for every route that names it (a WakeListener of its Waker)."""

    def __init__(
        self,
        kube: KubeClient,
        target: ScaleTarget,
        policy: Policy,
        refusal: Callable[[], Awaitable[Refusal | None]] | None,
    ) -> None:
        self.name = series(target)
        self._members: set[WakeListener] = set()  # the route versions naming it
        self._waking: set[WakeListener] = set()  # those that asked and were still cold when last looked at
        self._waker = Waker(kube, self, target, policy.replicas, policy.retry_interval, refusal)

    def join(self, route: WakeListener) -> None:
        self._members.add(route)

    def leave(self, route: WakeListener) -> bool:
        """`route` is closed; True when no route names this target any more (close it)."""
        self._members.discard(route)
        self._waking.discard(route)
        return not self._members

    def request(self, route: WakeListener) -> None:
        """`route`'s own target was woken or found awake: wake this one too (one loop at most)."""
        if route in self._members:
            self._waking.add(route)
            self._waker.request()

    @property
    def cold(self) -> bool:
        """Some route that asked still holds requests with no usable endpoint: keep waking."""
        self._waking = {route for route in self._waking if route.cold}
        return bool(self._waking)

    def wake_sent(self) -> None:
        self._count("also_wake")

    def wake_refused(self, message: str, reason: str) -> None:
        # The waker logged why; the routes' held requests are not answered: they wait for their own upstream.
        self._count("also_wake_refused")
        routes = ", ".join(sorted({route.name for route in self._waking}))
        log.info("routes %s: %s not woken; their held requests wait for their own upstream", routes, self.name)

    def wake_failed(self, message: str, reason: str = "") -> None:
        """Logged by the waker; a held request's 504 tells of its own target's failures, not of this one's."""

    def wake_parent(self) -> Span | None:
        """A route's whose wake this one follows: the extra target's wake is a child of that route's held request."""
        return next((span for route in self._waking if (span := route.wake_parent()) is not None), None)

    def _count(self, choice: str) -> None:
        for route in self._waking:
            telemetry.COLD_CHOICES.labels(route.name, choice).inc()

    async def close(self) -> None:
        await self._waker.close()
