"""Whether waking a target at zero goes along with what its HPA intends (route `wake: scale`).

Kubernetes v1.37's HPA scales a workload up from zero only if it scaled it there itself (its `ScaledToZero`
condition is True); a workload found at zero otherwise was stopped by a person (`kubectl scale
--replicas=0`) and the HPA leaves it there. The proxy respects the same intent: it wakes a target only when
an HPA that scales it has ScaledToZero=True, or when no HPA scales it and the route's `wake_without_hpa`
allows it. Otherwise held requests are answered at once with 503 and a body that says how to start the
workload again. Until the first list of HPAs has been tried the intent is unknown and the proxy wakes, as it
did before it watched HPAs (`wake: always` keeps that behaviour for good). Once a list has failed and none
has succeeded, nothing is woken: a proxy that cannot read the HPAs (no RBAC, API down) must not let any
client start a workload a person stopped; the answer names the error and the fix.

One watcher per namespace, shared by that namespace's routes.
"""

from __future__ import annotations

import logging
from typing import Any

from adapter.config.proxy import ScaleTarget
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError
from adapter.kube.hpas import hpas_path, scaled_to_zero, targets
from adapter.kube.watching import ListWatch, collection_lister

log = logging.getLogger(__name__)


class HPAIntent:
    """The HPAs of one namespace, kept current by a watch."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.namespace = namespace
        self._hpas: dict[str, dict[str, Any]] | None = None  # None until the first list
        self._failure: str | None = None  # why the latest list failed, while none has succeeded
        lister = collection_lister(kube, hpas_path(namespace))
        self._watch = ListWatch(kube, lister, f"HPA watch of {namespace}", self._changed, self._failed)

    @property
    def synced(self) -> bool:
        """The first list of HPAs has arrived (until then every wake goes ahead)."""
        return self._hpas is not None

    def start(self) -> None:
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()

    def refusal(self, target: ScaleTarget, wake_without_hpa: bool) -> str | None:
        """None when the target may be woken; otherwise what the held requests are answered with."""
        if self._hpas is None:
            if self._failure is None:
                return None
            return (
                f"{target.kind} {target.namespace}/{target.name} is at 0 replicas and the HorizontalPodAutoscalers "
                f"of {self.namespace} cannot be read ({self._failure}), so whether a person stopped it is unknown "
                "and it is not woken; grant the proxy list and watch on horizontalpodautoscalers, or set the "
                "route's wake: always"
            )
        scaling = [name for name, hpa in self._hpas.items() if targets(hpa, target.kind, target.name)]
        where = f"{target.kind} {target.namespace}/{target.name}"
        start = f"kubectl scale -n {target.namespace} {target.kind.lower()}/{target.name} --replicas=1"
        if not scaling:
            if wake_without_hpa:
                return None
            return (
                f"{where} is at 0 replicas and no HorizontalPodAutoscaler scales it; this route wakes only what "
                f"an HPA scaled to zero (wake_without_hpa: false). Start it with: {start}"
            )
        if any(scaled_to_zero(self._hpas[name]) for name in scaling):
            return None
        return (
            f"{where} was stopped by hand: it is at 0 replicas, but its HorizontalPodAutoscaler {scaling[0]} did "
            f"not scale it there (ScaledToZero is not True), so neither the HPA nor this proxy starts it. "
            f"Start it again with: {start}"
        )

    def _changed(self, hpas: dict[str, dict[str, Any]]) -> None:
        self._hpas, self._failure = hpas, None

    def _failed(self, err: KubeError) -> bool:
        hint = ""
        if isinstance(err, KubeAPIError) and err.status == 403:
            hint = " (grant list and watch on horizontalpodautoscalers, or use wake: always)"
        log.warning("HPA watch in %s failed: %s%s", self.namespace, err, hint)
        self._failure = str(err)
        return False
