"""What keeps one route version going: its readiness (an EndpointSlice watch or connect probes), its waker and, in
mode activator, its slice writer. Made by `RouteServices.start` for each new version, closed with it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from adapter.config.proxy import ActivatorConfig
from adapter.config.route import LocalScaleTarget, RouteConfig, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.proxy.activator import Activator, ProxyPods
from adapter.proxy.intent import NamespaceHPAs, read_refusal
from adapter.proxy.leader import LeaderElector
from adapter.proxy.readiness import probe_address, read_endpoint_slices
from adapter.proxy.route import Route
from adapter.proxy.slices import SliceWatches
from adapter.proxy.wake import Waker

log = logging.getLogger(__name__)


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
        if isinstance(config.target, LocalScaleTarget):  # development mode (`zeroscale demo`)
            waker = Waker.local(route, config.target, config.wake_replicas, config.wake_retry_interval)
        else:
            kube = self.kube
            if kube is None:
                log.warning("route %s: no API access, cannot wake %s; counts only", route.name, config.target.name)
                return
            refusal = None
            if config.wake == "scale":  # the HPAs are read before each patch (docs/architecture.md#wake)
                namespace = config.target.namespace
                hpas = self.hpas.get(namespace)
                if hpas is None:
                    hpas = self.hpas[namespace] = NamespaceHPAs(kube, namespace)
                refusal = functools.partial(read_refusal, hpas, config.target, config.wake_without_hpa)
            waker = Waker(kube, route, config.target, config.wake_replicas, config.wake_retry_interval, refusal)
        route.on_cold = waker.request
        route.on_endpoints = waker.observe
        waker.observe()
        closers.append(waker.close)

    async def close(self) -> None:
        for hpas in self.hpas.values():
            await hpas.close()
        if self.slices is not None:
            await self.slices.close()
