"""Waking a scale target from zero (docs/protocols.md#scale-subresource) when a request is held and no endpoint is
ready.

Only a Scale that reads 0 is patched, with its resourceVersion as a precondition, so the proxy never
overrides a size the HPA chose; a conflict means someone changed it meanwhile: read again and decide again.
While requests stay held and nothing is ready, the check repeats every `retry_interval`. With a `refusal`
(route `wake: scale`, see intent.py), the HPAs are read between the Scale's read and the patch, every attempt
(docs/architecture.md#wake): a target at 0 that its HPA did not put there is not woken and the held requests are
answered at once with the refusal's words; while that read fails, nothing is woken and the requests stay held
(up to their hold_timeout) for the next attempt.

Development mode: a `Local` target (`zeroscale demo`) is woken the same way, through a client of the
demo's loopback scaler, which answers the scale subresource calls for its local processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from adapter.config.kube import KubeAPIConfig
from adapter.config.route import LocalScaleTarget, ScaleTarget
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeConnectionError, KubeError
from adapter.kube.scale import Scale, get_scale, set_replicas
from adapter.proxy import trace
from adapter.proxy.intent import Refusal
from adapter.telemetry import proxy as telemetry

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)
_CONFLICT_RETRIES = 3
# The namespace a Local target's scale subresource is addressed in (the local scaler ignores it).
LOCAL_NAMESPACE = "local"


class HPAsUnread(Exception):
    """This attempt could not read the HPAs: nothing is woken, the held requests wait for the next attempt."""


class WakeListener(Protocol):
    """What a waker wakes for and reports to (a Route): the only object it reads from or tells anything."""

    @property
    def name(self) -> str: ...

    @property
    def cold(self) -> bool:
        """Requests are held and no endpoint is usable: keep waking."""
        ...

    def wake_sent(self) -> None:
        """The scale subresource is about to be patched (the start of the wake-to-ready time)."""

    def wake_refused(self, message: str, reason: str) -> None:
        """The target is not woken (see intent.py): the held requests get `message`; `reason` labels
        zeroscale_proxy_wake_refusals_total."""

    def wake_failed(self, message: str, reason: str = "") -> None:
        """Why the latest attempt failed ("": it did not; `reason`: hpas_unread, conflict or api_error); said to held
        requests whose hold_timeout ends."""

    def wake_parent(self) -> Span | None:
        """The span a wake's span is a child of (None: none traced)."""


class Waker:
    def __init__(
        self,
        kube: KubeClient,
        route: WakeListener,
        target: ScaleTarget,
        replicas: int,
        retry_interval: float,
        refusal: Callable[[], Awaitable[Refusal | None]] | None = None,
        awake: Callable[[], None] | None = None,
    ) -> None:
        self._kube = kube
        self._refusal = refusal
        # Called after each attempt that woke the target or found it above 0: the route's also_wake targets follow
        # (adapter/proxy/also_wake.py), never a target refused or not read.
        self._awake = awake
        self._listener = route
        self._target = target
        self._replicas = replicas
        self._retry_interval = retry_interval
        self._task: asyncio.Task[None] | None = None
        self._observer: asyncio.Task[None] | None = None
        self._replicas_gauge = telemetry.TARGET_REPLICAS.labels(route.name, target.namespace, target.kind, target.name)
        self._own_kube = False

    @classmethod
    def local(
        cls,
        route: WakeListener,
        target: LocalScaleTarget,
        replicas: int,
        retry_interval: float,
        awake: Callable[[], None] | None = None,
    ) -> Waker:
        """Development mode: wake a Local target through the demo's loopback scaler (same calls as Kubernetes)."""
        kube = KubeClient.from_config(KubeAPIConfig(url=target.url))
        as_deployment = ScaleTarget(namespace=LOCAL_NAMESPACE, kind="Deployment", name=target.name)
        waker = cls(kube, route, as_deployment, replicas, retry_interval, awake=awake)
        waker._own_kube = True
        return waker

    def request(self) -> None:
        """Called on every request held while the route is cold; starts one wake loop at most."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def observe(self) -> None:
        """Read the target's replicas for zeroscale_proxy_target_replicas (at start and when endpoints change)."""
        if self._observer is None or self._observer.done():
            self._observer = asyncio.get_running_loop().create_task(self._read_replicas())

    async def _read_replicas(self) -> None:
        target = self._target
        try:
            scale = await get_scale(self._kube, target.namespace, target.kind, target.name)
        except KubeError as err:
            log.debug("route %s: cannot read the scale of %s: %s", self._listener.name, target.name, err)
            return
        self._replicas_gauge.set(scale.replicas)

    async def close(self) -> None:
        for task in (self._task, self._observer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._own_kube:
            await self._kube.close()

    async def _run(self) -> None:
        while self._listener.cold:
            await self.wake_once()
            await asyncio.sleep(self._retry_interval)

    async def wake_once(self) -> str:
        """One attempt; returns the result also counted in zeroscale_proxy_wakes_total."""
        name, target = self._listener.name, self._target
        where = f"{target.kind} {target.namespace}/{target.name}"
        result, failure, reason = "error", "", ""
        for _ in range(_CONFLICT_RETRIES):
            try:
                scale = await get_scale(self._kube, target.namespace, target.kind, target.name)
                self._replicas_gauge.set(scale.replicas)
                if scale.replicas > 0:
                    result = "already_awake"
                    break
                if not scale.resource_version:  # an empty one in the patch is no precondition at all
                    raise KubeConnectionError(f"the API sent the Scale of {where} with no resourceVersion")
                if await self._refused():
                    result = "refused"
                    break
                self._listener.wake_sent()
                woken = await self._patch(where, scale.resource_version)
                self._replicas_gauge.set(woken.replicas)
                result = "patched"
                log.info("route %s: woke %s/%s to %d", name, target.kind, target.name, self._replicas)
                break
            except HPAsUnread as err:
                failure, reason = str(err), "hpas_unread"
                log.warning(
                    "route %s: not waking %s: %s; the held requests wait (limits.hold_timeout) and it is read again "
                    "in %gs (wake_retry_interval)",
                    name,
                    target.name,
                    failure,
                    self._retry_interval,
                )
                break
            except KubeAPIError as err:
                if err.status == 409:
                    result = "conflict"
                    telemetry.WAKES.labels(name, result).inc()  # each try counted once, this one here
                    continue
                hint = " (grant patch on the scale subresource, or use wake: hpa)" if err.status == 403 else ""
                failure, reason = f"cannot wake {target.name}: {err}{hint}", "api_error"
                log.warning("route %s: %s", name, failure)
                break
            except KubeError as err:
                failure, reason = f"cannot wake {target.name}: {err}", "api_error"
                log.warning("route %s: %s", name, failure)
                break
        else:  # every try met a conflict, each counted already
            failure = f"the Scale of {where} changed between each read and patch ({_CONFLICT_RETRIES} tries)"
            log.warning("route %s: not waking: %s; trying again in %gs", name, failure, self._retry_interval)
            self._listener.wake_failed(failure, "conflict")
            return result
        self._listener.wake_failed(failure, reason)
        telemetry.WAKES.labels(name, result).inc()
        if self._awake is not None and result in ("patched", "already_awake"):
            self._awake()
        return result

    async def _patch(self, where: str, resource_version: str) -> Scale:
        """The PATCH that wakes the target, in a `zeroscale.proxy.wake` span when tracing is on."""
        target = self._target
        span = trace.wake_span(self._listener.wake_parent(), self._listener.name, where, self._replicas)
        try:
            woken = await set_replicas(
                self._kube, target.namespace, target.kind, target.name, self._replicas, resource_version
            )
        except KubeError as err:
            if span is not None:
                conflict = isinstance(err, KubeAPIError) and err.status == 409
                trace.wake_done(span, "conflict" if conflict else "error", str(err))
            raise
        if span is not None:
            trace.wake_done(span, "patched")
        return woken

    async def _refused(self) -> bool:
        """Decide from the HPAs read now (route wake: scale): True when they refuse, the held requests answered.
        Raises HPAsUnread when they could not be read."""
        if self._refusal is None:
            return False
        try:
            refusal = await self._refusal()
        except KubeError as err:
            raise HPAsUnread(f"its namespace's HorizontalPodAutoscalers could not be read ({err})") from err
        if refusal is None:
            return False
        telemetry.WAKE_REFUSALS.labels(self._listener.name, refusal.reason).inc()
        level = logging.WARNING if refusal.needs_fix else logging.INFO
        log.log(level, "route %s: not waking: %s", self._listener.name, refusal.message)
        self._listener.wake_refused(refusal.message, refusal.reason)
        return True
