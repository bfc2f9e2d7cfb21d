"""The status of each ZeroscaleRoute object (docs/architecture.md#route-status): its conditions (Accepted, Ready), the
generation they describe, and a few live facts (cold or warm, held now, the last cold start's duration).

One replica writes, the activator Lease's holder, through the status subresource (a merge patch), each write
bounded to land while it still holds the Lease. Never a write per request: a route is marked dirty by events (a
table rebuild, the route turning cold or warm, its readiness first known) and by a sweep every status_interval that
looks for changed live facts; one worker, `_CONCURRENCY` calls at a time, then writes a dirty route's status only
when it differs from what the object has, at once when its conditions changed, else at most once per
status_interval. Whether a route's Service and target exist is read from the API (a GET each) only when its
generation changes or its last reading is `_RECHECK_FOUND` / `_RECHECK_MISSING` old: the API's load follows the
number of routes over time, not the events. In mode activator, Ready also says whether the route's slice writer
(adapter/proxy/activator.py) has read its inputs and written the Service's slices, or why not.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from adapter.config.route import ScaleTarget, ServiceUpstream
from adapter.config.route_object import GROUP, PLURAL, VERSION
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.scale import MERGE_PATCH, scale_path
from adapter.kube.watching import WatchTask, field
from adapter.proxy.activator import Activator
from adapter.proxy.claims import ACCEPTED, Refusal
from adapter.proxy.leader import LeaderElector
from adapter.proxy.route import Route
from adapter.proxy.route_objects import RouteObject
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)

READY = "Ready"
# API calls (reads of Services and targets, status writes) in flight at once: 10,000 routes never flood the API.
_CONCURRENCY = 4
# A route's Service and target, found, are read again after this long (a deletion shows up within it); missing or
# unreadable, sooner: someone is likely fixing it.
_RECHECK_FOUND = 300.0
_RECHECK_MISSING = 30.0
# A failing write is logged at most this often (it is retried every status_interval).
_FAILURE_LOG_INTERVAL = 60.0


class ServedRoute(Protocol):
    """What the writer reads of a route version (control.Version)."""

    @property
    def route(self) -> Route: ...

    @property
    def activator(self) -> Activator | None: ...


@dataclass
class _Entry:
    """One route object as the writer follows it."""

    obj: RouteObject
    version: ServedRoute | None  # the version serving it now; None: not served
    refusal: Refusal | None
    known: dict[str, Any]  # the status the object has: as last read, or as our last write answered
    started: float = -math.inf  # when its version began serving (the loop's clock)
    written_at: float = -math.inf  # when its status was last written (the loop's clock)
    due: float | None = None  # a write put off by the interval, scheduled then
    retry_at: float = -math.inf  # after a failed write: none before then, whatever changed
    facts: tuple[str, int, float | None] = ("Unknown", 0, None)  # the live facts last written or found unchanged
    slices: tuple[bool, str | None] = (True, None)  # mode activator: its slice writer's state as last looked at
    service: bool | None = None  # whether its upstream Service exists (None: not known)
    target: bool | None = None  # whether its target's scale subresource exists (None: not known, or no target)
    check_error: str = ""
    checked_at: float = -math.inf
    checked_generation: int = -1

    @property
    def route(self) -> Route | None:
        return None if self.version is None else self.version.route


class StatusWriter(WatchTask):
    watch_name = "route status writer"

    def __init__(self, kube: KubeClient, leader: LeaderElector, interval: float) -> None:
        self._kube = kube
        self._leader = leader
        self._interval = interval
        self._entries: dict[str, _Entry] = {}
        self._dirty: set[str] = set()
        self._due: list[tuple[float, str]] = []  # a heap of (when, key): writes put off by the interval
        self._working: deque[str] = deque()  # the routes the worker has taken and not yet looked at
        self._wake = asyncio.Event()
        self._failures = 0  # since the last message
        self._failure_logged_at = -math.inf
        leader.subscribe(self._leading_changed)
        telemetry.ROUTE_STATUS_BACKLOG.set_function(lambda: len(self._dirty) + len(self._working))

    # --- what the control plane tells it ---

    def changed(
        self, objects: list[RouteObject], refusals: Mapping[str, Refusal], versions: Mapping[str, ServedRoute]
    ) -> None:
        """After each table rebuild: every route object seen, why the unserved ones are not, the served versions.
        Marks dirty what changed; forgets the deleted."""
        entries = {
            # A refused object has no version, even when its key is served (by a file route of that name, NameClaimed).
            obj.key: self._entry(obj, refusal, None if refusal is not None else versions.get(obj.key))
            for obj in objects
            for refusal in [refusals.get(obj.key)]
        }
        self._dirty.intersection_update(entries)
        self._entries = entries
        served = sum(1 for entry in entries.values() if entry.version is not None)
        telemetry.ROUTE_OBJECTS.labels("accepted").set(served)
        telemetry.ROUTE_OBJECTS.labels("refused").set(len(entries) - served)
        self._wake.set()

    def statuses_changed(self, objects: list[RouteObject]) -> None:
        """Only these objects' statuses changed (most often by this writer): nothing was placed again, so each keeps
        its refusal and version; costs these objects, not every route."""
        for obj in objects:
            entry = self._entries.get(obj.key)
            if entry is not None:
                self._entry(obj, entry.refusal, entry.version)
        self._wake.set()

    def _entry(self, obj: RouteObject, refusal: Refusal | None, version: ServedRoute | None) -> _Entry:
        """The entry of `obj`, made or brought up to date; dirty when anything it shows may have changed."""
        key = obj.key
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(obj, None, refusal, obj.status)
            self._dirty.add(key)
        elif entry.obj is not obj or entry.version is not version or entry.refusal != refusal:
            # (Identity first: on 10,000 routes a rebuild runs this for each, most of them changing nothing here.)
            if obj.status is not entry.obj.status:
                entry.known = obj.status
            self._dirty.add(key)
            entry.obj, entry.refusal = obj, refusal
        if version is not None and version is not entry.version:
            version.route.on_warmth = lambda key=key: self._poke(key)
            entry.started = asyncio.get_running_loop().time()
        entry.version = version
        return entry

    def _poke(self, key: str) -> None:
        if key in self._entries:
            self._dirty.add(key)
            self._wake.set()

    def _leading_changed(self, leading: bool) -> None:
        if leading:  # what the previous holder wrote is compared with what this replica sees
            self._dirty.update(self._entries)
            self._wake.set()

    # --- the worker ---

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sweep_at = loop.time() + self._interval
        while True:
            wake_at = min(sweep_at, self._due[0][0] if self._due else math.inf)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(wake_at):
                    await self._wake.wait()
            self._wake.clear()
            now = loop.time()
            leading = self._leader.leading
            if now >= sweep_at:
                sweep_at = now + self._interval
                if leading:
                    self._sweep(now)
            while self._due and self._due[0][0] <= now:
                _, key = heapq.heappop(self._due)
                entry = self._entries.get(key)
                if entry is not None and entry.due is not None and entry.due <= now:
                    entry.due = None
                    self._dirty.add(key)
            if not leading or not self._dirty:
                continue  # kept dirty until this replica leads (then every route is looked at anyway)
            keys, self._dirty = self._dirty, set()
            await self._drain(keys)

    def _sweep(self, now: float) -> None:
        """Dirty: the routes whose live facts or slice writer changed, and those whose Service and target are due to
        be read again."""
        for key, entry in self._entries.items():
            if (
                _facts(entry.route) != entry.facts
                or _slices(entry.version) != entry.slices
                or (entry.route is not None and self._check_due(entry, now))
            ):
                self._dirty.add(key)

    async def _drain(self, keys: set[str]) -> None:
        pending = self._working = deque(keys)

        async def work() -> None:
            while pending:
                key = pending.popleft()
                try:
                    await self._update(key)
                except Exception:  # a bug or a shape nobody foresaw: the other routes' statuses still get written
                    log.exception("route %s: writing its status failed", key)
                    telemetry.ROUTE_STATUS_WRITES.labels("error").inc()

        await asyncio.gather(*(work() for _ in range(min(_CONCURRENCY, len(pending)))))

    async def _update(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return  # deleted meanwhile
        loop = asyncio.get_running_loop()
        if entry.route is not None and self._check_due(entry, loop.time()):
            await self._check(entry)
        desired = self._desired(entry)
        entry.facts, entry.slices = _facts(entry.route), _slices(entry.version)
        known = entry.known
        if all(known.get(name) == value for name, value in desired.items()):
            return
        now = loop.time()
        route = entry.route
        if route is not None and not route.readiness_known and now < entry.started + self._interval:
            # A new version reads its slices within moments (its first reading pokes it): a spec edit is not worth
            # a Ready=False ReadinessUnknown of a few milliseconds, written and then taken back.
            self._put_off(key, entry, entry.started + self._interval)
            return
        conditions_same = (known.get("observedGeneration"), known.get("conditions")) == (
            desired["observedGeneration"],
            desired["conditions"],
        )
        if (conditions_same or now < entry.retry_at) and now < entry.written_at + self._interval:
            self._put_off(key, entry, entry.written_at + self._interval)
            return
        await self._write(key, entry, desired)

    def _put_off(self, key: str, entry: _Entry, when: float) -> None:
        if entry.due is None or when < entry.due:
            entry.due = when
            heapq.heappush(self._due, (when, key))
            self._wake.set()  # the worker's wait counts to the earliest one

    async def _write(self, key: str, entry: _Entry, status: dict[str, Any]) -> None:
        left = self._leader.write_time_left()
        if left <= 0:
            self._dirty.add(key)  # written once this replica leads again, if it is still needed
            return
        loop = asyncio.get_running_loop()
        entry.written_at = loop.time()
        namespace, name = key.split("/", 1)
        # The API server drops the write rather than apply it after this replica may have lost the Lease.
        path = f"{status_path(namespace, name)}?timeout={max(1, int(left * 1000))}ms"
        try:
            _, answer = await self._kube.request(
                "PATCH", path, {"status": status}, content_type=MERGE_PATCH, within=left
            )
        except KubeAPIError as err:
            if err.status == 404:  # deleted meanwhile: its DELETED event forgets it
                telemetry.ROUTE_STATUS_WRITES.labels("gone").inc()
                return
            self._failed(key, entry, err)
            return
        except KubeError as err:
            self._failed(key, entry, err)
            return
        telemetry.ROUTE_STATUS_WRITES.labels("written").inc()
        if self._entries.get(key) is entry:
            entry.known = field(answer, "status") or status

    def _failed(self, key: str, entry: _Entry, err: KubeError) -> None:
        telemetry.ROUTE_STATUS_WRITES.labels("error").inc()
        self._failures += 1
        entry.retry_at = entry.written_at + self._interval
        self._put_off(key, entry, entry.retry_at)  # tried again then, and not before (an API in trouble)
        now = asyncio.get_running_loop().time()
        if now >= self._failure_logged_at + _FAILURE_LOG_INTERVAL:
            hint = (
                " (grant patch on zeroscaleroutes/status)"
                if isinstance(err, KubeAPIError) and err.status == 403
                else ""
            )
            log.warning(
                "cannot write the status of route %s%s (%d failed writes since the last message; retried every %gs): "
                "%s",
                key,
                hint,
                self._failures,
                self._interval,
                err,
            )
            self._failure_logged_at, self._failures = now, 0

    # --- whether the Service and the target exist ---

    @staticmethod
    def _check_due(entry: _Entry, now: float) -> bool:
        found = entry.service is True and entry.target is not False and not entry.check_error
        recheck = _RECHECK_FOUND if found else _RECHECK_MISSING
        return entry.checked_generation != entry.obj.generation or now >= entry.checked_at + recheck

    async def _check(self, entry: _Entry) -> None:
        assert entry.route is not None
        service, target = _references(entry.route)
        entry.check_error = ""
        entry.service = await self._exists(entry, service_path(*service))
        entry.target = None if target is None else await self._exists(entry, scale_path(*target))
        entry.checked_at, entry.checked_generation = asyncio.get_running_loop().time(), entry.obj.generation

    async def _exists(self, entry: _Entry, path: str) -> bool | None:
        """Whether the object at `path` exists; None when it cannot be read (why: in entry.check_error)."""
        try:
            await self._kube.request("GET", path)
        except KubeAPIError as err:
            if err.status == 404:
                return False
            entry.check_error = str(err)
            return None
        except KubeError as err:
            entry.check_error = str(err)
            return None
        return True

    # --- the status ---

    def _desired(self, entry: _Entry) -> dict[str, Any]:
        obj = entry.obj
        prior = {
            condition.get("type"): condition
            for condition in entry.known.get("conditions") or []
            if isinstance(condition, dict)
        }
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
            before = prior.get(kind) or {}
            # Kept while the status stays: `kubectl describe` says since when it has been so.
            since = before.get("lastTransitionTime") if before.get("status") == status else None
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or now,
                "observedGeneration": obj.generation,
            }

        refusal = entry.refusal
        accepted = (
            condition(ACCEPTED, "True", ACCEPTED, "the route is valid, allowed, and serves its hosts")
            if refusal is None
            else condition(ACCEPTED, "False", refusal.reason, refusal.message)
        )
        state, held, cold_start = _facts(entry.route)
        return {
            "observedGeneration": obj.generation,
            "conditions": [accepted, condition(READY, *_readiness(entry))],
            "state": state,
            "held": held,
            "lastColdStartSeconds": cold_start,
        }


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


def _facts(route: Route | None) -> tuple[str, int, float | None]:
    """Cold or warm, held now on this replica, the last cold start's duration (ms precision: no churn)."""
    if route is None:
        return ("Unknown", 0, None)
    last = route.last_cold_start
    return ("Warm" if route.has_usable() else "Cold", len(route.queue), None if last is None else round(last, 3))


def service_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/services/{name}"


def _references(route: Route) -> tuple[tuple[str, str], tuple[str, str, str] | None]:
    """(namespace, name) of the route's upstream Service; (namespace, kind, name) of its target, if it has one."""
    config = route.config
    upstream = config.upstream
    # An object's upstream is always a Service (adapter/config/route_object.py).
    service = (upstream.namespace, upstream.service) if isinstance(upstream, ServiceUpstream) else ("", "")
    target = config.target
    return service, ((target.namespace, target.kind, target.name) if isinstance(target, ScaleTarget) else None)


def _slices(version: ServedRoute | None) -> tuple[bool, str | None]:
    """Mode activator: whether its slice writer has read what it decides from, and why its latest write failed."""
    activator = None if version is None else version.activator
    return (True, None) if activator is None else (activator.inputs_read, activator.problem)


def _readiness(entry: _Entry) -> tuple[str, str, str]:
    """The Ready condition's status, reason and message: what keeps the route from working, and what to fix."""
    route = entry.route
    if route is None or entry.refusal is not None:
        return "False", "NotAccepted", "the route is not accepted: see the Accepted condition for what to change"
    (namespace, name), target = _references(route)
    service = f"Service {namespace}/{name}"
    workload = "" if target is None else f"{target[1]} {target[0]}/{target[2]}"
    if entry.service is False:
        why = f"{service} (spec.upstream.service) does not exist: create it, or name the Service selecting the pods"
        return "False", "ServiceNotFound", why
    if entry.target is False:
        return "False", "TargetNotFound", f"{workload} (spec.target) does not exist: create it, or name the workload"
    if entry.service is None or (target is not None and entry.target is None):
        what = service if target is None else f"{service} or the scale subresource of {workload}"
        return "Unknown", "CannotCheck", f"the proxy cannot read {what} (grant it get on them): {entry.check_error}"
    if not route.readiness_known:
        why = f"the proxy has not read the EndpointSlices of {service} yet (it needs list and watch on endpointslices)"
        return "False", "ReadinessUnknown", why
    read, problem = _slices(entry.version)
    if problem is not None:
        return "False", "SlicesNotWritten", problem
    if not read:
        why = "the proxy has not yet read the target, its pods and the proxy's own pods, which decide the slices"
        return "False", "SlicesPending", why
    found = service if target is None else f"{service} and {workload}"
    return "True", READY, f"{found} exist, and the proxy knows the Service's ready endpoints"
