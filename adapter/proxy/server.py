"""The proxy process: listener, routes, readiness and wake per route, admin port, graceful shutdown."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from adapter.config.proxy import ProxyConfig
from adapter.config.route import LocalScaleTarget, RouteConfig, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConfigError
from adapter.kube.watching import ListWatch
from adapter.proxy.activator import Activator, ProxyPods
from adapter.proxy.admin import start_admin
from adapter.proxy.client import ClientConnection
from adapter.proxy.counts import CountsListener
from adapter.proxy.intent import NamespaceHPAs, read_refusal
from adapter.proxy.leader import LeaderElector
from adapter.proxy.readiness import endpoint_slice_watcher, probe_address
from adapter.proxy.route import Route
from adapter.proxy.routing import Router
from adapter.proxy.wake import Waker
from adapter.ready import address
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)
_BACKLOG = 4096
_MIN_TICK, _MAX_TICK = 0.01, 1.0
# Refused connections are counted each; logged at most this often (seconds).
_REFUSAL_LOG_INTERVAL = 10.0


class ProxyServer:
    def __init__(self, config: ProxyConfig, *, kube: KubeClient | None = None) -> None:
        self.config = config
        self.via = config.via
        self.draining = False
        route_configs = config.effective_routes()
        # A sidecar's upstream is the app beside it in the pod: on loopback by design.
        loopback = config.allow_loopback_endpoints or config.sidecar is not None
        self.routes = {rc.name: Route(rc, allow_loopback=loopback) for rc in route_configs}
        self.router: Router[Route] = Router((rc.hosts, rc.path_prefix, self.routes[rc.name]) for rc in route_configs)
        self.connections: set[ClientConnection] = set()
        self.loop = asyncio.get_running_loop()
        self._kube = kube
        self._own_kube = False
        self._server: asyncio.Server | None = None
        self._admin: asyncio.Server | None = None
        self._watchers: list[ListWatch] = []
        self._wakers: list[Waker] = []
        self._hpas: dict[str, NamespaceHPAs] = {}  # the HPA lists wake: scale routes share, by namespace
        # Routes in mode: activator, each with a listener of its own, and what they share: the Lease's leader
        # election and the proxy's own pods (docs/architecture.md#activator).
        self.activators: dict[str, Activator] = {}
        self.leader: LeaderElector | None = None
        self._proxy_pods: ProxyPods | None = None
        self._route_servers: list[asyncio.Server] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._refusals_logged_at = -_REFUSAL_LOG_INTERVAL
        telemetry.CONNECTIONS.set_function(lambda: len(self.connections))

    # --- connections ---

    def admit(self, connection: ClientConnection) -> bool:
        if len(self.connections) >= self.config.max_connections:
            now = time.monotonic()
            if now >= self._refusals_logged_at + _REFUSAL_LOG_INTERVAL:
                self._refusals_logged_at = now
                log.warning(
                    "refusing client connections: proxy.max_connections=%d are open (raise it to admit more)",
                    self.config.max_connections,
                )
            return False
        self.connections.add(connection)
        return True

    def forget(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        """Held and in-flight counts of every route, after each change (for the adapter's pending-count stream).

        An activator route reports what it holds only: what it forwarded is in a pod, whose sidecar counts it
        as in flight there (docs/architecture.md#activator), so a request is never counted twice.
        """

        def held_only(route: str, held: int, _inflight: int) -> None:
            listener(route, held, 0)

        stops = [
            route.counts.subscribe(held_only if route.name in self.activators else listener)
            for route in self.routes.values()
        ]

        def unsubscribe() -> None:
            for stop in stops:
                stop()

        return unsubscribe

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def admin_port(self) -> int:
        assert self._admin is not None
        port: int = self._admin.sockets[0].getsockname()[1]
        return port

    def bound(self) -> dict[str, str]:
        """Each listener's name -> the host:port it bound (docs/architecture.md#no-port-races)."""
        bound = {
            "proxy": address(self.config.bind, self.port),
            "admin": address(self.config.admin_bind, self.admin_port),
        }
        for name, server in zip(self.activators, self._route_servers, strict=True):
            bound[f"activator/{name}"] = address(self.config.bind, server.sockets[0].getsockname()[1])
        return bound

    # --- start and stop ---

    async def start(self) -> None:
        for route in self.routes.values():
            if route.config.mode == "activator":
                self._add_activator(route)
            self._start_readiness(route)
            self._start_wake(route)
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self), self.config.bind, self.config.port, backlog=_BACKLOG
        )
        for name, activator in self.activators.items():
            router: Router[Route] = Router([(["*"], "/", self.routes[name])])
            self._route_servers.append(
                await self.loop.create_server(
                    functools.partial(ClientConnection, self, router),
                    self.config.bind,
                    activator.port,
                    backlog=_BACKLOG,
                )
            )
            activator.start()
        if self.leader is not None and self._proxy_pods is not None:
            self._proxy_pods.start()
            self.leader.start()
        self._admin = await start_admin(
            self.config.admin_bind, self.config.admin_port, lambda: not self.draining, self.config.admin_max_connections
        )
        self._sweeper = self.loop.create_task(self._sweep())
        log.info("proxy listening on %s:%d, admin on %d", self.config.bind, self.port, self.admin_port)

    async def _sweep(self) -> None:
        """Every connection's deadlines (head, body, response, send, idle, tunnel idle): set on the hot path as
        plain numbers, checked here a few times a second.

        The tick is a quarter of the shortest timeout (at most 1 s), so a timeout fires at most 25% late.
        Deliberate, see docs/architecture.md#hot-lazy-deadline. Why not one timer design everywhere: the API
        server follows the same per-connection number with one lazy timer each (it holds few connections,
        the proxy up to max_connections, most idle); a held request keeps its own timer (Exchange.timer):
        only held ones pay for it, off the warm path, and their 504 must not come up to 25% late.
        """
        config = self.config
        limits = [route.limits for route in self.routes.values()]
        shortest = min(
            [
                config.header_timeout,
                config.idle_timeout,
                config.send_timeout,
                *(limit.response_timeout for limit in limits),
                *(limit.body_timeout for limit in limits),
                *(limit.tunnel_idle_timeout for limit in limits),
            ]
        )
        tick = min(max(shortest / 4, _MIN_TICK), _MAX_TICK)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for connection in list(self.connections):
                connection.check_deadlines(now)

    def _kube_client(self) -> KubeClient | None:
        if self._kube is None:
            try:
                self._kube = KubeClient.from_config(self.config.kubernetes)
                self._own_kube = True
            except KubeConfigError as err:
                log.warning("no Kubernetes API access: %s", err)
                return None
        return self._kube

    def _start_readiness(self, route: Route) -> None:
        config: RouteConfig = route.config
        upstream = config.upstream
        if not isinstance(upstream, ServiceUpstream) or config.readiness == "probe":
            route.set_static_endpoint(probe_address(upstream))
            return
        kube = self._kube_client()
        if kube is None:
            if config.readiness == "endpointslice":
                raise SystemExit(f"route {route.name}: readiness endpointslice needs Kubernetes API access")
            log.warning("route %s: no API access, readiness falls back to connect probes", route.name)
            route.set_static_endpoint(probe_address(upstream))
            return
        activator = self.activators.get(route.name)
        also = activator.pods_changed if activator is not None else None
        # An activator route copies the slices it reads: connect probes are no fallback for it.
        fallback = config.readiness == "auto" and activator is None
        watcher = endpoint_slice_watcher(kube, route, upstream, fallback=fallback, also=also)
        if activator is not None:
            activator.pods_watch = watcher  # re-read at each resync
        watcher.start()
        self._watchers.append(watcher)

    def _start_wake(self, route: Route) -> None:
        config = route.config
        if config.wake not in ("scale", "always") or config.target is None:
            return
        if isinstance(config.target, LocalScaleTarget):  # development mode (`zeroscale demo`)
            waker = Waker.local(route, config.target, config.wake_replicas, config.wake_retry_interval)
        else:
            kube = self._kube_client()
            if kube is None:
                log.warning("route %s: no API access, cannot wake %s; counts only", route.name, config.target.name)
                return
            refusal = None
            if config.wake == "scale":  # the HPAs are read before each patch (docs/architecture.md#wake)
                namespace = config.target.namespace
                hpas = self._hpas.setdefault(namespace, NamespaceHPAs(kube, namespace))
                refusal = functools.partial(read_refusal, hpas, config.target, config.wake_without_hpa)
            waker = Waker(kube, route, config.target, config.wake_replicas, config.wake_retry_interval, refusal)
        route.on_cold = waker.request
        route.on_endpoints = waker.observe
        waker.observe()
        self._wakers.append(waker)

    def _add_activator(self, route: Route) -> None:
        settings = self.config.activator
        kube = self._kube_client()
        if kube is None or settings is None:
            raise SystemExit(
                f"route {route.name}: mode activator writes EndpointSlices: it needs Kubernetes API access"
            )
        if self.leader is None:
            self.leader = LeaderElector(kube, settings, self.config.activator_routes())
            self._proxy_pods = ProxyPods(kube, settings)
        assert self._proxy_pods is not None
        self.activators[route.name] = Activator(kube, route, self._proxy_pods, self.leader, settings.resync_interval)

    async def _drained(self, grace: float) -> None:
        """Wait until no route holds or forwards anything, or `grace` seconds."""
        drained = asyncio.Event()

        def check(_route: str, _held: int, _inflight: int) -> None:
            if not any(route.counts.pending for route in self.routes.values()):
                drained.set()

        unsubscribe = [route.counts.subscribe(check) for route in self.routes.values()]
        try:
            async with asyncio.timeout(grace):
                await drained.wait()
        except TimeoutError:
            log.warning("grace period over: answering what is left with 503")
        finally:
            for stop in unsubscribe:
                stop()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting; let held and in-flight requests finish within the grace period; 503 the rest."""
        grace = self.config.grace_period if grace is None else grace
        self.draining = True  # /readyz answers 503 from now on, and answered connections are not kept alive
        if self.config.stop_delay and grace:
            # Still accepting: connections made while the data plane learns this pod is going find a listener.
            await asyncio.sleep(self.config.stop_delay)
        for listener in (self._server, *self._route_servers):
            if listener is not None:
                listener.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        await self._drained(grace)
        for route in self.routes.values():
            route.fail_held(503, "the proxy is shutting down")
        for connection in list(self.connections):
            connection.shut_down()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in list(self.connections):
            # Lingering closes end here (the sweeper that would end them is gone); written answers still flush.
            connection.transport.close()
        for activator in self.activators.values():
            await activator.close()
        if self._proxy_pods is not None:
            await self._proxy_pods.close()
        if self.leader is not None:
            await self.leader.close()  # gives the Lease up: another replica writes within its retry_period
        for watcher in self._watchers:
            await watcher.close()
        for waker in self._wakers:
            await waker.close()
        for hpas in self._hpas.values():
            await hpas.close()
        for route in self.routes.values():
            await route.close()
        if self._admin is not None:
            self._admin.close()
        if self._kube is not None and self._own_kube:
            await self._kube.close()
        log.info("proxy stopped")
