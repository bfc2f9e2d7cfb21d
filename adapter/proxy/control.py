"""The proxy's control plane: the routes (the config file's and ZeroscaleRoute objects'), the table the data plane
serves, and everything Kubernetes behind them (readiness, wake, the activator's Lease and slices, route status).

Each change of the routes (an object added, edited or deleted; at start, the file) builds a new table and installs
it whole (adapter/proxy/table.py). Per route key:

- unchanged: the same `Route` goes on: its pools, held queue, counters and watches are untouched;
- changed: a new version serves new requests at once; the old one keeps what it admitted (held requests wait on
  its readiness and waker as before) and is closed once idle; both add to the route's one set of counts;
- deleted, or no longer accepted: its held requests are answered 503 saying so, what is in flight finishes, and
  the route is closed once idle; its series go with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from adapter.config.proxy import ProxyConfig
from adapter.config.route import RouteConfig, ScaleTarget, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConfigError
from adapter.proxy.activator import Activator, ProxyPods
from adapter.proxy.claims import Candidate, Refusal, place
from adapter.proxy.counts import CountsBoard, CountsListener
from adapter.proxy.leader import LeaderElector
from adapter.proxy.route import Route, fallback_name
from adapter.proxy.route_objects import RouteObject, RouteObjects
from adapter.proxy.route_status import StatusWriter
from adapter.proxy.routing import Match, Router
from adapter.proxy.server import ProxyServer
from adapter.proxy.services import RouteServices, RouteUnservable
from adapter.proxy.table import Listener, RouteTable
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)


@dataclass
class Version:
    """One version of a route and what keeps it going. Its activator (mode activator) is started and stopped by the
    control plane's activator sync, never by the version: two versions must not write one Service's slices."""

    route: Route
    activator: Activator | None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    activator_started: bool = False

    async def close(self) -> None:
        for close in self.closers:
            await close()
        await self.route.close()


class ControlPlane:
    def __init__(self, config: ProxyConfig, data: ProxyServer, *, kube: KubeClient | None = None) -> None:
        self.config = config
        self._data = data
        self.board = CountsBoard()
        self.table = RouteTable()
        self.versions: dict[str, Version] = {}  # serving now, by route key
        self._retired: set[asyncio.Task[None]] = set()
        # Retired versions not yet closed, by route key: a route deleted, re-created and deleted again has two, and
        # its counts and series go only with the last of them.
        self._retiring: collections.Counter[str] = collections.Counter()
        # Routes some version of which had a fallback: its `<route>/fallback` series go when no version has one.
        self._fallback_series: set[str] = set()
        self._kube = kube
        self._own_kube = False
        # A sidecar's upstream is the app beside it in the pod: on loopback by design.
        self._loopback = config.allow_loopback_endpoints or config.sidecar is not None
        self._file_routes = [Candidate(route) for route in config.effective_routes()]
        self.refusals: dict[str, Refusal] = {}  # route objects not served, and why
        self.route_objects: RouteObjects | None = None
        self.status_writer: StatusWriter | None = None  # the route objects' status (the Lease holder writes)
        self._rebuild_scheduled = False
        # The route objects were placed after their latest spec change (False again while placing: a table that could
        # not be built is placed again at the next event, whatever that event changed).
        self._placed = False
        self._next_place_at = 0.0  # monotonic: when the next placement may run (see _rebuild)
        self.leader: LeaderElector | None = None
        self._proxy_pods: ProxyPods | None = None
        self.services = RouteServices(None, None, None, None)
        self._closing = False
        # Activator routes' listener ports: port -> (its listener, the route key holding it); activators of
        # versions no longer served, still to stop.
        self._ports: dict[int, tuple[Listener, str]] = {}
        self._stale_activators: list[Activator] = []
        self._activators_dirty = asyncio.Event()
        # What start() started, closed in reverse by close(): route objects first, then the routes (activators
        # before the Lease they write under), the Lease (given up for another replica), the proxy's pods, the HPAs.
        self._stack = contextlib.AsyncExitStack()

    # --- start and stop ---

    async def start(self) -> None:
        """Serve the config file's routes (a route that cannot run stops the process, as a bad config does), then
        follow the route objects when enabled."""
        self._start_services()
        stack = self._stack
        stack.push_async_callback(self.services.close)
        if self._proxy_pods is not None and self.leader is not None:
            stack.push_async_callback(self._proxy_pods.close)
            stack.push_async_callback(self.leader.close)
        stack.push_async_callback(self._close_routes)
        self._rebuild()
        await self._sync_activators(strict=True)  # the file's activator ports: one that cannot be bound stops us
        syncing = asyncio.get_running_loop().create_task(self._follow_activators(), name="activator sync")
        stack.push_async_callback(_cancel, syncing)
        if self._proxy_pods is not None and self.leader is not None:
            self._proxy_pods.start()
            self.leader.start()
        if self.status_writer is not None:
            stack.push_async_callback(self.status_writer.close)
            self.status_writer.start()
        if self.route_objects is not None:
            stack.push_async_callback(self.route_objects.close)
            self.route_objects.start()

    def _start_services(self) -> None:
        config = self.config
        needs_api = config.route_objects.enabled or any(route.config.mode == "activator" for route in self._file_routes)
        kube = self._kube_client() if needs_api or self._wants_api() else None
        if needs_api and (kube is None or config.activator is None):
            raise SystemExit(
                "mode activator routes and route objects need Kubernetes API access and proxy.activator "
                "(proxy_service, lease_namespace)"
            )
        if needs_api and kube is not None and config.activator is not None:
            self.leader = LeaderElector(kube, config.activator, config.activator_routes())
            self._proxy_pods = ProxyPods(kube, config.activator)
        self.services = RouteServices(kube, config.activator, self.leader, self._proxy_pods)
        if config.route_objects.enabled and kube is not None and self.leader is not None:
            self.route_objects = RouteObjects(kube, config.route_objects, self._schedule_rebuild)
            self.status_writer = StatusWriter(kube, self.leader, config.route_objects.status_interval)

    def _wants_api(self) -> bool:
        """A file route that reads slices (its upstream's or its fallback's) or wakes a Kubernetes workload."""
        return any(
            ((isinstance(route.upstream, ServiceUpstream) or route.fallback is not None) and route.readiness != "probe")
            or (isinstance(route.target, ScaleTarget) and route.wake in ("scale", "always"))
            for route in (candidate.config for candidate in self._file_routes)
        )

    def _kube_client(self) -> KubeClient | None:
        if self._kube is None:
            try:
                self._kube = KubeClient.from_config(self.config.kubernetes)
                self._own_kube = True
            except KubeConfigError as err:
                log.warning("no Kubernetes API access: %s", err)
                return None
        return self._kube

    async def drained(self, grace: float) -> None:
        """Wait until no route holds or forwards anything, or `grace` seconds."""
        drained = asyncio.Event()
        for version in self.versions.values():
            version.route.forget_page()  # a browser's reload is not something to wait for

        def check(_route: str, _held: int, _inflight: int) -> None:
            if not self.board.pending():
                drained.set()

        unsubscribe = self.board.subscribe(check)
        try:
            async with asyncio.timeout(grace):
                await drained.wait()
        except TimeoutError:
            log.warning("grace period over: answering what is left with 503")
        finally:
            unsubscribe()

    def fail_held(self, code: int, message: str) -> None:
        for version in self.versions.values():
            version.route.fail_held(code, message)

    async def close(self) -> None:
        self._closing = True
        await self._stack.aclose()
        if self._kube is not None and self._own_kube:
            await self._kube.close()

    async def _close_routes(self) -> None:
        for version in self.versions.values():
            if version.activator is not None and version.activator_started:
                self._stale_activators.append(version.activator)
        for activator in self._stale_activators:
            await activator.close()
        for version in self.versions.values():
            await version.close()
        for task in list(self._retired):
            task.cancel()
        await asyncio.gather(*self._retired, return_exceptions=True)

    # --- the table ---

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        """Held and in-flight counts of every route, present and future, after each change (the counts stream)."""
        return self.board.subscribe(listener)

    def routes_known(self) -> bool:
        """The route objects were listed once (or there are none to list: not enabled, or no CRD installed)."""
        objects = self.route_objects
        return objects is None or objects.listed or objects.absent

    @property
    def routes(self) -> dict[str, Route]:
        return {key: version.route for key, version in self.versions.items()}

    @property
    def activators(self) -> dict[str, Activator]:
        return {key: v.activator for key, v in self.versions.items() if v.activator is not None}

    def _schedule_rebuild(self) -> None:
        """Once per loop turn however many events came in it: a burst of changes costs one table."""
        if not self._rebuild_scheduled and not self._closing:
            self._rebuild_scheduled = True
            loop = asyncio.get_running_loop()
            loop.call_later(max(0.0, self._next_place_at - time.monotonic()), self._rebuild_from_objects)

    def _rebuild_from_objects(self) -> None:
        try:
            self._rebuild()
        except Exception:
            # A bug, or an object no check foresaw: the table in force stays, and the next change tries again.
            telemetry.ROUTE_TABLE_FAILURES.inc()
            log.exception("building the route table failed; serving the table as it was")

    def _rebuild(self) -> None:
        self._rebuild_scheduled = False
        objects = self.route_objects
        if objects is not None and self._placed:
            changed, specs = objects.take_changes()
            if not specs:
                # Only statuses changed (most events are the status writer's own): placing 10,000 routes again would
                # cost the event loop a few hundred milliseconds per write; this costs the changed objects alone.
                if self.status_writer is not None:
                    seen = [obj for obj in map(objects.get, changed) if obj is not None]
                    self.status_writer.statuses_changed(seen)
                return
        self._placed = False
        started = time.monotonic()
        # Objects are placed once every namespace served was listed: placed from some namespaces only, a younger
        # claim could be served for a moment and then displaced by an older one listed later.
        listed = objects is None or objects.listed
        if objects is not None:
            objects.take_changes()  # all of them are placed now
        every: list[RouteObject] = objects.objects() if objects is not None and listed else []
        refusals = {obj.key: obj.invalid for obj in every if obj.invalid is not None}
        candidates = list(self._file_routes)
        candidates += [Candidate(obj.config, obj.created) for obj in every if obj.config is not None]
        served, refused = place(candidates, self.config.route_objects)
        refusals.update(refused)
        self.refusals = refusals
        self._swap(served)
        self._placed = listed
        # The next placement waits twice as long as this one took: a tenant editing a route in a loop holds at
        # most a third of the event loop, however many routes there are.
        self._next_place_at = time.monotonic() + 2 * (time.monotonic() - started)
        if self.status_writer is not None:
            self.status_writer.changed(every, refusals, self.versions)

    def _swap(self, served: list[RouteConfig]) -> None:
        before = self.versions
        after: dict[str, Version] = {}
        for config in served:
            key = config.key
            version = before.get(key)
            if version is None or (version.route.config is not config and version.route.config != config):
                version = self._start_version(config)
            after[key] = version
        if list(after) == list(before) and all(after[key] is before[key] for key in after):
            return  # an event that changed no route (a status written, an object refused again): the table stands
        self.versions = after
        self.table = RouteTable.of([version.route for version in after.values()])
        self._data.install(self.table)
        for key, version in before.items():
            if after.get(key) is version:
                continue
            if version.activator is not None:
                self._stale_activators.append(version.activator)
                self._activators_dirty.set()
            if key in after:
                self._retire(version, None)  # changed: what it admitted finishes there
                continue
            why = self.refusals.get(key)
            message = (
                f"route {key} was deleted"
                if why is None
                else f"route {key} is no longer served ({why.reason}: {why.message})"
            )
            self._retire(version, message)

    def _start_version(self, config: RouteConfig) -> Version:
        route = Route(config, allow_loopback=self._loopback, board=self.board, sidecar=self.config.sidecar is not None)
        if route.fallback is not None:
            self._fallback_series.add(route.name)
        try:
            activator, closers = self.services.start(route)
        except RouteUnservable as err:  # only the config file's routes can be unservable: a bad config
            raise SystemExit(str(err)) from None
        if activator is not None:
            self._activators_dirty.set()
        return Version(route, activator, closers)

    # --- activator routes: their ports, their slice writers, the Lease's list ---

    async def _follow_activators(self) -> None:
        while True:
            await self._activators_dirty.wait()
            await self._sync_activators(strict=False)

    async def _sync_activators(self, *, strict: bool) -> None:
        """Stop the slice writers of versions no longer served, then give each activator route its port and start
        its writer, and tell the Lease what this replica writes. `strict` (the file's routes at start): a port that
        cannot be bound raises OSError; later, the route's status says so and the next sync tries again."""
        self._activators_dirty.clear()
        stale, self._stale_activators = self._stale_activators, []
        for activator in stale:
            await activator.close()
        wanted = {v.activator.port: (key, v) for key, v in self.versions.items() if v.activator is not None}
        for port, (listener, key) in list(self._ports.items()):
            if wanted.get(port, ("",))[0] != key:
                listener.router = Router([])  # its open connections find no route from here
                self._data.unlisten(key)
                del self._ports[port]
        for port, (key, version) in wanted.items():
            # Every request on its port is the route's, whatever its Host, path or headers
            # (docs/architecture.md#route-precedence).
            router: Router[Route] = Router([(Match(), version.route)])
            if port in self._ports:
                self._ports[port][0].router = router
            else:
                listener = Listener(router)
                try:
                    await self._data.listen(key, port, listener)
                except OSError as err:
                    if strict:
                        raise
                    log.warning(
                        "route %s: cannot listen on activator.port %d: %s; trying again at the next change",
                        key,
                        port,
                        err,
                    )
                    continue
                self._ports[port] = (listener, key)
            if self.versions.get(key) is version and not version.activator_started:
                assert version.activator is not None
                version.activator.start()
                version.activator_started = True
        if self.leader is not None:
            routes = [version.route.config for _, version in wanted.values()]
            self.leader.set_routes(self.config.activator_routes(routes))

    def _retire(self, version: Version, failure: str | None) -> None:
        """Stop admitting to `version`: with `failure`, its held requests are answered 503 with it at once; it is
        closed once idle (and, when its route is gone for good, the route's counts and series with it)."""
        route = version.route
        if failure is not None:
            log.info("%s: answering its %d held requests 503", failure, len(route.queue))
            route.fail_held(503, failure)
        self._retiring[route.name] += 1
        task = asyncio.get_running_loop().create_task(self._close_when_idle(version), name=f"retire {route.name}")
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def _close_when_idle(self, version: Version) -> None:
        route = version.route
        idle = asyncio.Event()
        loop = asyncio.get_running_loop()

        def check(_route: str, _held: int, _inflight: int) -> None:
            # Every request leaving this version changes the route's counts; looked at once the change is complete
            # (a request is counted before it is assigned its endpoint).
            loop.call_soon(lambda: idle.set() if route.idle else None)

        # A request at the version's fallback changes the fallback's own counts only (they are not the route's):
        # both are heard, or a version whose last request was at its fallback would never be seen idle.
        watched = [route.counts] if route.fallback is None else [route.counts, route.fallback.counts]
        unsubscribes = [counts.subscribe(check) for counts in watched]
        try:
            await idle.wait()
        finally:
            for unsubscribe in unsubscribes:
                unsubscribe()
        await version.close()
        self._retiring[route.name] -= 1
        if self._retiring[route.name] <= 0:
            del self._retiring[route.name]
        if route.name in self._retiring:
            return
        current = self.versions.get(route.name)
        if current is None:
            self.board.drop(route.name)
            telemetry.forget_route(route.name)
        if (current is None or current.route.fallback is None) and route.name in self._fallback_series:
            # No version has a fallback any more: its series would read a closed one for ever (and keep it alive).
            self._fallback_series.discard(route.name)
            telemetry.forget_route(fallback_name(route.name))


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
