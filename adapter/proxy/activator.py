"""Route `mode: activator`: the proxy in the path only while the workload has no ready pod
(docs/architecture.md#activator).

Clients call a selector-less Service whose EndpointSlices Zeroscale writes. While the workload is warm they list
its pods, copied from the slices of the second Service that selects them (the route's upstream), so new
connections go straight to the pods; while it is cold they list the proxy's own pods on the route's
`activator.port`, so new connections land on the proxy, which holds, wakes and forwards as in the path.

When to switch, decided on every change of what it depends on:

    cold -> warm  the target's spec.replicas > 0, a pod is ready (ready and not terminating), and this replica
                  holds no request (the ones it held were sent to the pods first)
    warm -> cold  the target's spec.replicas is 0 (before the last pod goes: connections made during the
                  scale-down must still find a listener), or no pod is ready

Every resync_interval the inputs are read again (listed, not taken from the watches: an open watch may have
gone silent) and the written slices compared with what they should be. The written slices and the Service are
watched too, so a slice deleted or changed by someone else (a person, the garbage collector after the Service was
created again) is written back at once, not at the next resync (docs/architecture.md#staleness-bounds).

Nothing is written until the target, its pods and the proxy's pods have each been read once, so a restart or a
new writer never flips a warm Service to the proxy while it looks. The HPA's status.desiredReplicas is not a
signal: the HPA controller writes the scale subresource first and its status after, so spec.replicas is the
earlier of the two, and after a wake desiredReplicas would still read 0 for up to one HPA sync.

Cold with no proxy pod to list (none ready or serving), the slices keep listing the pods the upstream has: a
listener that may still answer is better than a Service that refuses every connection.

Only the replica holding the Lease (leader.py) writes; every replica decides, serves and holds alike. The writer
touches only slices that carry our managed-by label and the Service's name, and refuses a Service with a
selector (Kubernetes' own controller writes that one's slices): the slices it wrote before the selector came are
deleted, so the two writers' endpoints are not merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from adapter.config.proxy import ActivatorConfig
from adapter.config.route import RouteConfig, ScaleTarget, ServiceUpstream
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import (
    build_slices,
    endpoints_by_port,
    is_usable,
    kept_endpoints,
    owned_slices_path,
    refused_addresses,
    routable,
    same_slice,
    slice_path,
)
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.scale import spec_replicas, workload_collection_path
from adapter.kube.watching import ListWatch, collection_lister, field, objects_by_name
from adapter.proxy.leader import LeaderElector
from adapter.proxy.readiness import slice_lister
from adapter.proxy.refused import RefusedEndpoints
from adapter.proxy.route import Route
from adapter.proxy.slices import SliceSubscription
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)
_RETRY_START, _RETRY_MAX = 0.1, 5.0


class ProxyPods:
    """The proxy's own pods, from the slices of the Service that selects them: what a cold slice lists."""

    def __init__(self, kube: KubeClient, config: ActivatorConfig) -> None:
        service = config.proxy_service
        self.endpoints: list[dict[str, Any]] = []
        self.seen = False  # listed at least once
        self._listeners: list[Activator] = []
        self._refused = RefusedEndpoints("", "proxy_service", f"the activator: the proxy's Service {service.service}")
        name = f"EndpointSlice watch of the proxy's Service {service.namespace}/{service.service}"
        self.watch = ListWatch(kube, slice_lister(kube, service), name, self._changed, self._failed)

    def subscribe(self, activator: Activator) -> Callable[[], None]:
        self._listeners.append(activator)
        return lambda: self._listeners.remove(activator)

    def start(self) -> None:
        self.watch.start()

    async def close(self) -> None:
        await self.watch.close()

    def _changed(self, slices: dict[str, dict[str, Any]]) -> None:
        # Any port of the Service (the chart names its port, a Service may have several): only the addresses are
        # used, each with the route's activator.port, so a pod listed once per port is one endpoint.
        # Never loopback: the cold slices send clients' connections to these addresses through kube-proxy.
        self._refused.report(refused_addresses(slices.values()))
        every = list({tuple(ep["addresses"]): ep for s in slices.values() for ep in kept_endpoints(s)}.values())
        # While none is ready, those still serving (a rollout's last old pods).
        self.endpoints = routable(every)
        self.seen = True
        for activator in self._listeners:
            activator.changed("the proxy's pods changed")

    def _failed(self, err: KubeError) -> bool:
        log.warning("activator: cannot read the proxy's own EndpointSlices (keeping the last seen): %s", err)
        return False


class Activator:
    """One activator route: decides warm or cold, and, while this replica leads, writes the Service's slices."""

    def __init__(
        self,
        kube: KubeClient,
        route: Route,
        proxies: ProxyPods,
        leader: LeaderElector,
        resync_interval: float,
    ) -> None:
        config: RouteConfig = route.config
        assert config.activator is not None
        assert isinstance(config.upstream, ServiceUpstream)
        assert isinstance(config.target, ScaleTarget)
        self._kube = kube
        self._route = route
        self._settings = config.activator
        self._upstream = config.upstream
        self._target = config.target
        self._port_name = config.slice_port_name()
        self._proxies = proxies
        self._leader = leader
        self._resync_interval = resync_interval
        self.namespace = config.upstream.namespace
        self.service = config.activator.service
        self.port = config.activator.port
        self._replicas: int | None = None  # the target's spec.replicas; None until first read
        self._pods: dict[str, dict[str, Any]] | None = None  # the upstream's slices by name; None until listed
        self.warm = False
        self._decided_at = time.monotonic()  # when the latest switch was decided (for the switch-time histogram)
        self._unwritten_switch = False
        self._written: dict[str, dict[str, Any]] = {}  # our slices as last read or written
        self._relist = True  # list our slices before the next write (a new writer, a failed write, a resync)
        self._owner: dict[str, Any] | None = None  # the Service's ownerReference, once read
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_problem: str | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        lister = collection_lister(kube, workload_collection_path(self.namespace, self._target.kind, self._target.name))
        name = f"{self._target.kind} watch of route {route.name}"
        self._workload = ListWatch(kube, lister, name, self._workload_changed, self._workload_failed)
        # The upstream Service's slices are watched for the route (readiness.py): the server hands that watch over.
        self.pods_watch: SliceSubscription | None = None
        # Our outputs, watched: what someone else did to them is repaired at once.
        where = f"route {route.name}'s Service {self.namespace}/{self.service}"
        owned = collection_lister(kube, owned_slices_path(self.namespace, self.service))
        self._outputs = ListWatch(kube, owned, f"EndpointSlice watch of {where}", self._outputs_changed, self._failed)
        service = collection_lister(kube, service_collection_path(self.namespace, self.service))
        self._service_watch = ListWatch(kube, service, f"watch of {where}", self._service_changed, self._failed)
        self._service_seen: tuple[object, bool] | None = None  # (uid, has a selector) as the watch last said
        telemetry.ACTIVATOR_DIRECT.labels(route.name).set_function(lambda: int(self.warm))

    # --- inputs ---

    def start(self) -> None:
        self._unsubscribe = [
            self._proxies.subscribe(self),
            self._leader.subscribe(self._leadership),
            self._route.counts.subscribe(self._counts),
        ]
        self._workload.start()
        self._outputs.start()
        self._service_watch.start()
        self._task = asyncio.get_running_loop().create_task(self._write_loop(), name=f"activator {self._route.name}")

    def pods_changed(self, slices: dict[str, dict[str, Any]]) -> None:
        """The upstream Service's slices (from the route's readiness watch)."""
        self._pods = slices
        self.changed("the pods changed")

    def _workload_changed(self, objects: dict[str, dict[str, Any]]) -> None:
        self._replicas = spec_replicas(objects.get(self._target.name))
        self.changed(f"spec.replicas is {self._replicas}")

    def _workload_failed(self, err: KubeError) -> bool:
        target = self._target
        log.warning(
            "route %s: cannot watch %s %s: %s%s", self._route.name, target.kind, target.name, err, self._hint(err)
        )
        return False

    async def _reread_inputs(self) -> None:
        """List the target, its pods and the proxy's pods again: a watch that went silent, or dropped an event,
        would otherwise feed every later decision and resync with the same stale copy."""
        watches = (self._workload, self.pods_watch, self._proxies.watch)
        await asyncio.gather(*(watch.relist() for watch in watches if watch is not None))

    # --- our outputs ---

    def _outputs_changed(self, slices: dict[str, dict[str, Any]]) -> None:
        """Our slices as the watch says: anything but what they should be is read again and written back (also the
        echo of a write still on its way, which costs one read)."""
        if not self._leader.leading or not self.inputs_read:
            return
        wanted = self.wanted()
        if slices.keys() != wanted.keys() or not all(same_slice(slices[name], wanted[name]) for name in wanted):
            self._relist = True
            self._dirty.set()

    def _service_changed(self, services: dict[str, dict[str, Any]]) -> None:
        """Created again (a new uid owns the slices), deleted, or given a selector: read it again at once."""
        service = services.get(self.service)
        seen = (
            None
            if service is None
            else (field(service, "metadata").get("uid"), bool(field(service, "spec").get("selector")))
        )
        if seen != self._service_seen:
            self._service_seen = seen
            self._relist = True
            self._dirty.set()

    def _failed(self, err: KubeError) -> bool:
        log.warning(
            "route %s: cannot watch Service %s/%s or its slices (someone else's changes wait for the next resync): %s",
            self._route.name,
            self.namespace,
            self.service,
            err,
        )
        return False

    def _counts(self, _route: str, held: int, _inflight: int) -> None:
        # On the proxy's hot path while cold: only the last held request going out matters here.
        if held == 0 and not self.warm and self._replicas:
            self.changed("the held requests were sent")

    def _leadership(self, leading: bool) -> None:
        if leading:
            self._relist = True  # whoever wrote before us: read what is there first
            self._dirty.set()

    # --- the decision ---

    @property
    def inputs_read(self) -> bool:
        """The target, its pods and the proxy's pods have each been read once: a decision can be written."""
        return self._replicas is not None and self._pods is not None and self._proxies.seen

    def cold_reason(self) -> str | None:
        """Why the Service must list the proxy now, or None when it may list the pods."""
        if not self._replicas:
            return f"{self._target.kind} {self._target.name} is at 0 replicas (or not read yet)"
        groups = self._pod_groups()
        if not any(is_usable(ep) for group in groups.values() for ep in group):
            return "no pod is ready"
        return None

    def changed(self, why: str) -> None:
        reason = self.cold_reason()
        warm = reason is None and (self.warm or self._route.counts.held == 0)
        if warm != self.warm:
            self.warm = warm
            self._decided_at = time.monotonic()
            self._unwritten_switch = True
            log.info("route %s: %s (%s)", self._route.name, "pods take new connections" if warm else "proxy", why)
        self._dirty.set()

    def _pod_groups(self) -> dict[int, list[dict[str, Any]]]:
        """The pods' endpoints by port number: only IP ones (docs/architecture.md#only-ip-endpoints), which the API
        takes in the slices we write (an FQDN slice's name copied into an IPv4 slice fails every write)."""
        pods = (self._pods or {}).values()
        return endpoints_by_port(pods, self._upstream.port, loopback=self._route.allow_loopback)

    def wanted(self) -> dict[str, dict[str, Any]]:
        """The slices the Service should have now."""
        pods = self._pod_groups()
        groups = pods if self.warm or not self._proxies.endpoints else {self._settings.port: self._proxies.endpoints}
        return build_slices(
            self.namespace,
            self.service,
            self._route.config.name,  # a label value: the name alone (the slices are in the route's namespace)
            self._owner,
            self._port_name,
            groups,
            self._settings.max_endpoints_per_slice,
        )

    # --- writing ---

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        delay = _RETRY_START
        resync_at = loop.time() + self._resync_interval
        while True:
            # A schedule, not a quiet period: inputs that change more often than resync_interval must not put off
            # the comparison with what is really there (a slice someone changed) for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(resync_at):
                    await self._dirty.wait()
            if loop.time() >= resync_at:
                await self._reread_inputs()
                self._relist = True
                resync_at = loop.time() + self._resync_interval
            self._dirty.clear()
            if not self._leader.leading or not self.inputs_read:
                continue
            try:
                await self._reconcile()
                delay = _RETRY_START
                continue
            except _NotLeading:
                self._relist = True  # what we wrote last may not be what is there when we lead again
                continue
            except KubeError as err:
                self._problem(
                    f"cannot write the slices of Service {self.namespace}/{self.service}: {err}{self._hint(err)}"
                )
                telemetry.SLICE_WRITES.labels(self._route.name, _result(err)).inc()
            except Exception:  # a bug or a shape nobody foresaw: the writer must outlive it, as watches do
                log.exception("route %s: the slice writer failed; trying again in %gs", self._route.name, delay)
                telemetry.SLICE_WRITES.labels(self._route.name, "error").inc()
            self._relist = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)
            self._dirty.set()

    async def _reconcile(self) -> None:
        written = self._written
        if self._relist:
            # The Service too, each time: created again it has a new uid, and slices owned by the old one are the
            # garbage collector's to delete; given a selector since, it is no longer ours to write.
            if not await self._read_service():
                return
            self._relist = False
            _, listing = await self._kube.request("GET", owned_slices_path(self.namespace, self.service))
            before, written = self._written, objects_by_name(listing)
            self._written = written
            if before and _versions(before) != _versions(written):
                log.info(
                    "route %s: the slices of Service %s/%s were changed since this replica wrote them (by another "
                    "replica, a person or the garbage collector); writing what they should be",
                    self._route.name,
                    self.namespace,
                    self.service,
                )
        switch, decided_at, warm = self._unwritten_switch, self._decided_at, self.warm
        route = self._route.name
        wanted = self.wanted()
        wrote = False
        for name, body in wanted.items():
            existing = written.get(name)
            if existing is not None and existing.get("addressType") != body["addressType"]:
                # The API refuses to change a slice's addressType (immutable): the family at this index changed
                # (dual-stack endpoints over a different number of slices), so the slice is made again.
                await self._delete(name)
                del written[name]
                telemetry.SLICE_WRITES.labels(route, "deleted").inc()
                existing = None
            if existing is None:
                written[name] = await self._create(body)
                telemetry.SLICE_WRITES.labels(route, "created").inc()
                wrote = True
            elif not same_slice(existing, body):
                version = field(existing, "metadata").get("resourceVersion", "")
                body = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
                written[name] = await self._replace(name, body)
                telemetry.SLICE_WRITES.labels(route, "updated").inc()
                wrote = True
        for name in [name for name in written if name not in wanted]:
            await self._delete(name)
            del written[name]
            telemetry.SLICE_WRITES.labels(route, "deleted").inc()
            wrote = True
        # Observed once the writes succeeded (a failed write keeps the switch to time on the next try), unless
        # another switch was decided meanwhile (that one is timed from its own decision), and only when this write
        # made the switch: a replica that decided it while another one held the Lease finds it written already
        # when it takes over, long after its decision.
        if switch and decided_at == self._decided_at:
            self._unwritten_switch = False
            if wrote:
                telemetry.SWITCH_SECONDS.labels(route, "pods" if warm else "proxy").observe(
                    time.monotonic() - decided_at
                )
        self._last_problem = None

    # The writes, each only while this replica leads and bounded to land while it still may: a write can take up to
    # the API client's timeout (10 s), longer than the margin before another replica may take the Lease.

    async def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        left, timeout = self._write_deadline()
        with self._cut_off_when_no_longer_leading():
            _, answer = await self._kube.request("POST", slice_path(self.namespace) + timeout, body, within=left)
        return answer

    async def _replace(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        left, timeout = self._write_deadline()
        with self._cut_off_when_no_longer_leading():
            _, answer = await self._kube.request("PUT", slice_path(self.namespace, name) + timeout, body, within=left)
        return answer

    async def _delete(self, name: str) -> None:
        left, timeout = self._write_deadline()
        with self._cut_off_when_no_longer_leading():
            await self._kube.request("DELETE", slice_path(self.namespace, name) + timeout, within=left)

    def _write_deadline(self) -> tuple[float, str]:
        """The leadership time left, as the client's deadline and as the API server's `?timeout=` query: the
        client gives up then, and the server drops the write rather than apply it later
        (docs/architecture.md#activator). Each write is its own `request` call, so the RBAC check sees its verb."""
        left = self._leader.write_time_left()
        if left <= 0:
            raise _NotLeading  # not sent: it could land after another replica's
        return left, f"?timeout={max(1, int(left * 1000))}ms"  # whole milliseconds, rounded down (1 at least)

    @contextlib.contextmanager
    def _cut_off_when_no_longer_leading(self) -> Iterator[None]:
        try:
            yield
        except KubeError:
            if not self._leader.leading:
                raise _NotLeading from None  # cut off at the leadership's end (a timeout, the server's 504)
            raise

    async def _read_service(self) -> bool:
        """Read the Service for its ownerReference; False (nothing written) when it is not ours to write."""
        try:
            _, service = await self._kube.request("GET", f"/api/v1/namespaces/{self.namespace}/services/{self.service}")
        except KubeAPIError as err:
            if err.status != 404:
                raise
            telemetry.SLICE_WRITES.labels(self._route.name, "refused").inc()
            self._problem(
                f"Service {self.namespace}/{self.service} does not exist: create it without a selector (clients "
                "call it; Zeroscale writes its EndpointSlices), or correct the route's activator.service"
            )
            return False
        if field(service, "spec").get("selector"):
            telemetry.SLICE_WRITES.labels(self._route.name, "refused").inc()
            self._problem(
                f"Service {self.namespace}/{self.service} has a selector, so Kubernetes writes its EndpointSlices; "
                "remove its selector (the route's upstream Service selects the pods) for the activator to route it"
            )
            await self._delete_ours()
            return False
        metadata = field(service, "metadata")
        self._owner = {"apiVersion": "v1", "kind": "Service", "name": self.service, "uid": metadata.get("uid", "")}
        return True

    async def _delete_ours(self) -> None:
        """Delete the slices we wrote (a Service given a selector since: its controller's slices are the truth)."""
        _, listing = await self._kube.request("GET", owned_slices_path(self.namespace, self.service))
        for name in objects_by_name(listing):
            await self._delete(name)
            telemetry.SLICE_WRITES.labels(self._route.name, "deleted").inc()
        self._written = {}

    def _hint(self, err: KubeError) -> str:
        """What to grant when the API refused (403): deploy/base grants nothing of this mode, and the chart only
        in the namespaces its routes name (docs/reference/security.md)."""
        if not (isinstance(err, KubeAPIError) and err.status == 403):
            return ""
        return (
            f"; the proxy's ServiceAccount needs mode activator's Role in namespace {self.namespace} (the Helm chart "
            "renders it from the routes in its config; with kustomize, apply deploy/overlays/activator edited for "
            f"Service {self.service} and {self._target.kind} {self._target.name})"
        )

    @property
    def problem(self) -> str | None:
        """Why the Service's slices could not be written as they should be (None: the latest write went through);
        the route's status says it (Ready=False)."""
        return self._last_problem

    def _problem(self, message: str) -> None:
        if message != self._last_problem:  # once per distinct problem, not every retry
            self._last_problem = message
            log.warning("route %s: %s", self._route.name, message)

    async def close(self) -> None:
        """Stop deciding and writing (the slices stay as last written: a new version of the route, or whoever
        takes the Service over, writes them next)."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        await self._workload.close()
        await self._outputs.close()
        await self._service_watch.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class _NotLeading(Exception):
    """Leading stopped in the middle of writing: stop writing."""


def service_collection_path(namespace: str, name: str) -> str:
    """The collection holding just this Service, to list and watch it (fieldSelector on its name)."""
    return f"/api/v1/namespaces/{namespace}/services?fieldSelector=metadata.name%3D{name}"


def _versions(slices: dict[str, dict[str, Any]]) -> dict[str, object]:
    return {name: field(body, "metadata").get("resourceVersion") for name, body in slices.items()}


def _result(err: KubeError) -> str:
    return "conflict" if isinstance(err, KubeAPIError) and err.status in (404, 409) else "error"
