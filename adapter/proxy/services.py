"""What keeps one route version going: its readiness (an EndpointSlice watch or connect probes), its waker and, in
mode activator, its slice writer. Made by `RouteServices.start` for each new version, closed with it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from adapter.config.proxy import ActivatorConfig
from adapter.config.route import LocalScaleTarget, RouteConfig, ScaleTarget, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.proxy.activator import Activator, ProxyPods
from adapter.proxy.also_wake import AlsoWake, Policy
from adapter.proxy.intent import NamespaceHPAs, Refusal, read_refusal
from adapter.proxy.leader import LeaderElector
from adapter.proxy.readiness import probe_address, read_endpoint_slices
from adapter.proxy.route import Route
from adapter.proxy.slices import SliceWatches
from adapter.proxy.wake import Waker
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)
# An also_wake target's loop: the target's namespace, kind and name, and the policy of the routes sharing it.
AlsoWakeKey = tuple[str, str, str, Policy]


class RouteUnservable(Exception):
    """A route this proxy cannot run as configured (no API access for what it needs): its message says why."""


class RouteServices:
    """The Kubernetes side shared by every route: the API client, the HPA lists wakes read (by namespace), the
    activator's Lease and the proxy's own pods."""

    def __init__(
        self,
        kube: KubeClient | None,
        activator: ActivatorConfig | None,
        leader: LeaderElector | None,
        proxy_pods: ProxyPods | None,
    ) -> None:
        self.kube = kube
        self._activator_settings = activator
        self.leader = leader
        self.proxy_pods = proxy_pods
        self.hpas: dict[str, NamespaceHPAs] = {}  # the HPA lists wake: scale routes share, by namespace
        self.also_wakes: dict[AlsoWakeKey, AlsoWake] = {}  # the also_wake targets' loops, by target and policy
        self.slices = SliceWatches(kube) if kube is not None else None  # one watch per namespace, shared

    def start(self, route: Route) -> tuple[Activator | None, list[Callable[[], Awaitable[None]]]]:
        """Start what `route` needs, and return what closes it, in order, with its activator (mode activator), made
        but not started: the control plane starts it once the version it replaces has stopped writing the slices."""
        closers: list[Callable[[], Awaitable[None]]] = []
        activator = self._activator(route) if route.config.mode == "activator" else None
        self._readiness(route, activator, closers)
        if route.fallback is not None:
            self._fallback_readiness(route.fallback, closers)
        self._wake(route, closers)
        return activator, closers

    def _fallback_readiness(self, fallback: Route, closers: list[Callable[[], Awaitable[None]]]) -> None:
        """The fallback Service's endpoints, read as the upstream's (docs/architecture.md#fallback): from its slices,
        else (no API access, readiness: probe) by connect probes of `<service>.<namespace>.svc:<port>`."""
        config = fallback.config
        upstream = config.upstream
        assert isinstance(upstream, ServiceUpstream)
        if (self.slices is None or config.readiness == "probe") and not isinstance(upstream.port, int):
            raise RouteUnservable(
                f"route {fallback.name}: without EndpointSlices (no API access, or readiness: probe) the fallback "
                f"Service is probed at {upstream.service}.{upstream.namespace}.svc:<port>: give fallback.port as a "
                "number"
            )
        self._readiness(fallback, None, closers)

    def _activator(self, route: Route) -> Activator:
        settings = self._activator_settings
        if self.kube is None or settings is None or self.leader is None or self.proxy_pods is None:
            raise RouteUnservable(
                f"route {route.name}: mode activator writes EndpointSlices: it needs Kubernetes API access"
            )
        return Activator(self.kube, route, self.proxy_pods, self.leader, settings.resync_interval)

    def _readiness(
        self, route: Route, activator: Activator | None, closers: list[Callable[[], Awaitable[None]]]
    ) -> None:
        config: RouteConfig = route.config
        upstream = config.upstream
        if not isinstance(upstream, ServiceUpstream) or config.readiness == "probe":
            route.set_static_endpoint(probe_address(upstream))
            return
        if self.slices is None:
            if config.readiness == "endpointslice":
                raise RouteUnservable(f"route {route.name}: readiness endpointslice needs Kubernetes API access")
            log.warning("route %s: no API access, readiness falls back to connect probes", route.name)
            route.set_static_endpoint(probe_address(upstream))
            return
        also = activator.pods_changed if activator is not None else None
        # An activator route copies the slices it reads: connect probes are no fallback for it.
        fallback = config.readiness == "auto" and activator is None
        reading = read_endpoint_slices(self.slices, route, upstream, fallback=fallback, also=also)
        if activator is not None:
            activator.pods_watch = reading  # re-read at each resync
        closers.append(reading.close)

    def _wake(self, route: Route, closers: list[Callable[[], Awaitable[None]]]) -> None:
        config = route.config
        if config.wake not in ("scale", "always") or config.target is None:
            return
        also = self._also_wake(route, closers)
        if isinstance(config.target, LocalScaleTarget):  # development mode (`zeroscale demo`)
            waker = Waker.local(route, config.target, config.wake_replicas, config.wake_retry_interval, awake=also)
        else:
            kube = self.kube
            if kube is None:
                log.warning("route %s: no API access, cannot wake %s; counts only", route.name, config.target.name)
                return
            refusal = self._refusal(kube, config, config.target)
            waker = Waker(
                kube, route, config.target, config.wake_replicas, config.wake_retry_interval, refusal, awake=also
            )
        route.on_cold = waker.request
        route.on_endpoints = waker.observe
        waker.observe()
        closers.append(waker.close)

    def _refusal(
        self, kube: KubeClient, config: RouteConfig, target: ScaleTarget
    ) -> Callable[[], Awaitable[Refusal | None]] | None:
        """wake: scale reads the HPAs of the target's namespace before each patch (docs/architecture.md#wake)."""
        if config.wake != "scale":
            return None
        hpas = self.hpas.get(target.namespace)
        if hpas is None:
            hpas = self.hpas[target.namespace] = NamespaceHPAs(kube, target.namespace)
        return functools.partial(read_refusal, hpas, target, config.wake_without_hpa)

    def _also_wake(self, route: Route, closers: list[Callable[[], Awaitable[None]]]) -> Callable[[], None] | None:
        """The route's also_wake targets, each joined to the loop shared by the routes naming it with one policy;
        returns what asks them all to wake (after the route's own target woke), None when there are none."""
        config = route.config
        kube = self.kube
        if not config.also_wake:
            return None
        if kube is None:
            log.warning("route %s: no API access, cannot wake its also_wake targets", route.name)
            return None
        policy = Policy.of(config)
        joined: list[tuple[AlsoWakeKey, AlsoWake]] = []
        for target in config.also_wake:
            key = (target.namespace, target.kind, target.name, policy)
            group = self.also_wakes.get(key)
            if group is None:
                group = self.also_wakes[key] = AlsoWake(kube, target, policy, self._refusal(kube, config, target))
            group.join(route)
            joined.append((key, group))

        async def leave() -> None:
            for key, group in joined:
                if group.leave(route):
                    del self.also_wakes[key]
                    await group.close()
                    if all(other.name != group.name for other in self.also_wakes.values()):
                        telemetry.forget_route(group.name)  # its own wake series go with the last route naming it

        def wake() -> None:
            for _, group in joined:
                group.request(route)

        closers.append(leave)
        return wake

    async def close(self) -> None:
        for hpas in self.hpas.values():
            await hpas.close()
        if self.slices is not None:
            await self.slices.close()
