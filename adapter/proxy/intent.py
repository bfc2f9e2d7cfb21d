"""Whether waking a target at zero goes along with what its HPA intends (route `wake: scale`,
docs/architecture.md#wake).

Kubernetes v1.37's HPA scales a workload up from zero only if it scaled it there itself (its `ScaledToZero`
condition is True); a workload found at zero otherwise was stopped by a person (`kubectl scale
--replicas=0`) and the HPA leaves it there. The proxy respects the same intent: it wakes a target only when
the one HPA that scales it has ScaledToZero=True, or when no HPA scales it and the route's `wake_without_hpa`
allows it. Otherwise held requests are answered at once with 503 and a body that says why and what to do.

Waking cannot be undone, so it is decided from the HPAs as the API holds them just before the patch: a list
sent after that attempt read the Scale (shared with the other routes of the namespace waking then, see
NamespaceHPAs), never a watch's copy (an open watch can go silent for minutes and still say
ScaledToZero=True long after the HPA changed its mind). A read that fails wakes nothing: the API refusing it
(401, 403, 404) is answered at once, as it will not pass by itself; a failure that may pass (no answer, a
timeout, 410, 429, 5xx, an answer that is no list) leaves the requests held, and the waker reads again on its
next attempt (adapter/proxy/wake.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from adapter.config.route import ScaleTarget
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError
from adapter.kube.hpas import HPA, list_hpas
from adapter.kube.scale import GROUP
from adapter.telemetry import proxy as telemetry

# The API's answers that may pass by themselves (a timeout, a page's `continue` expired (410), too many requests, the
# server's own failure): the requests stay held and the list is read again. Any other refusal (401, 403, 404:
# autoscaling/v2 not served) stays until a person acts, and is answered at once.
_PASSING = frozenset({408, 410, 429})


@dataclass(frozen=True)
class Refusal:
    """Why a target is not woken: `reason` labels zeroscale_proxy_wake_refusals_total, `message` answers the held
    requests; `needs_fix`: a configuration problem (logged as a warning), not a person's choice."""

    reason: str
    message: str
    needs_fix: bool = False


class NamespaceHPAs:
    """The HPA lists of one namespace, shared by the wakers of its routes: routes going cold together send one list
    between them, not one each (each a whole namespace parsed in the event loop).

    A read never takes the answer of a list already in flight: that list may have been sent before the reader read
    its Scale, and an HPA that changed its mind since (finding 2) would be missed. It shares the next list instead,
    which starts when the one in flight ends: one list in flight per namespace, and every answer a reader gets was
    asked for after it called read()."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self._current: asyncio.Task[list[HPA]] | None = None  # the list in flight
        self._next: asyncio.Task[list[HPA]] | None = None  # the list that starts when it ends

    async def read(self) -> list[HPA]:
        """The namespace's HPAs from a list sent after this call. Raises KubeError as list_hpas does."""
        if self._next is None:
            if self._current is None or self._current.done():
                self._current = self._start(None)
                return await asyncio.shield(self._current)
            self._next = self._start(self._current)
        return await asyncio.shield(self._next)

    def _start(self, after: asyncio.Task[list[HPA]] | None) -> asyncio.Task[list[HPA]]:
        task = asyncio.get_running_loop().create_task(self._list(after))
        # Its readers may all be gone (cancelled): its failure is theirs, not the loop's to report.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return task

    async def _list(self, after: asyncio.Task[list[HPA]] | None) -> list[HPA]:
        if after is not None:
            await asyncio.wait([after])
            self._current, self._next = self._next, None  # sent from now on: later readers wait for another
        telemetry.HPA_LISTS.labels(self.namespace).inc()
        listed = await list_hpas(self._kube, self.namespace)
        telemetry.HPAS_LISTED.labels(self.namespace).set(len(listed))
        return listed

    async def close(self) -> None:
        for task in (self._next, self._current):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


async def read_refusal(hpas: NamespaceHPAs, target: ScaleTarget, wake_without_hpa: bool) -> Refusal | None:
    """Read the target's namespace's HPAs now and decide; None: wake it. Raises KubeError when the read failed for
    a reason that may pass (the caller keeps the requests held and reads again)."""
    try:
        listed = await hpas.read()
    except KubeAPIError as err:
        if err.status in _PASSING or err.status >= 500:
            raise
        return Refusal(
            "hpas_unreadable",
            f"{_where(target)} is at 0 replicas and the HorizontalPodAutoscalers of {target.namespace} cannot be "
            f"read ({err}), so whether a person stopped it is unknown and it is not woken; {_fix(err.status, target)}"
            ", or set the route's wake: always",
            needs_fix=True,
        )
    return decide(listed, target, wake_without_hpa)


def decide(hpas: list[HPA], target: ScaleTarget, wake_without_hpa: bool) -> Refusal | None:
    """From the namespace's HPAs: None when the target may be woken, else why not."""
    scaling = sorted((hpa for hpa in hpas if hpa.targets(GROUP, target.kind, target.name)), key=lambda hpa: hpa.name)
    start = f"kubectl scale -n {target.namespace} {target.kind.lower()}/{target.name} --replicas=1"
    if not scaling:
        if wake_without_hpa:
            return None
        return Refusal(
            "no_hpa",
            f"{_where(target)} is at 0 replicas and no HorizontalPodAutoscaler scales it; this route wakes only "
            f"what an HPA scaled to zero (wake_without_hpa: false). Start it with: {start}",
        )
    if len(scaling) > 1:
        # The HPA controller refuses to act on such a target once it has pods (ScalingActive=False, reason
        # AmbiguousSelector; docs/protocols.md#hpa-scale-to-zero); which of their conditions to believe is unknown,
        # so neither is.
        return Refusal(
            "ambiguous_hpas",
            f"AmbiguousSelector: {_where(target)} is at 0 replicas and is scaled by more than one "
            f"HorizontalPodAutoscaler ({', '.join(hpa.name for hpa in scaling)}); the HPA controller acts on none of "
            "them once it has pods, and this proxy does not wake it. Delete all but one of them",
            needs_fix=True,
        )
    (only,) = scaling
    if only.scaled_to_zero:
        return None
    return Refusal(
        "stopped_by_hand",
        f"{_where(target)} was stopped by hand: it is at 0 replicas, but its HorizontalPodAutoscaler {only.name} "
        f"did not scale it there (ScaledToZero is not True), so neither the HPA nor this proxy starts it. "
        f"Start it again with: {start}",
    )


def _fix(status: int, target: ScaleTarget) -> str:
    """What to change, for an HPA list the API refused with `status`."""
    if status == 401:
        return "fix the proxy's credentials (the API server did not accept its token or client certificate)"
    if status == 404:
        return "the API server does not serve autoscaling/v2 (Kubernetes 1.23 and later do)"
    return f"grant the proxy list on horizontalpodautoscalers (API group autoscaling) in {target.namespace}"


def _where(target: ScaleTarget) -> str:
    return f"{target.kind} {target.namespace}/{target.name}"
