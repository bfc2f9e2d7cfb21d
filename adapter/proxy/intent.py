"""Whether waking a target at zero goes along with what its HPA intends (route `wake: scale`,
docs/architecture.md#wake).

Kubernetes v1.37's HPA scales a workload up from zero only if it scaled it there itself (its `ScaledToZero`
condition is True); a workload found at zero otherwise was stopped by a person (`kubectl scale
--replicas=0`) and the HPA leaves it there. The proxy respects the same intent: it wakes a target only when
the one HPA that scales it has ScaledToZero=True, or when no HPA scales it and the route's `wake_without_hpa`
allows it. Otherwise held requests are answered at once with 503 and a body that says why and what to do.

Waking cannot be undone, so it is decided from the HPAs as the API holds them just before the patch: a list
read for that attempt, never a watch's copy (an open watch can go silent for minutes and still say
ScaledToZero=True long after the HPA changed its mind). A read that fails wakes nothing: the API refusing it
(401, 403, 404) is answered at once, as it will not pass by itself; a failure that may pass (no answer, a
timeout, 429, 5xx) leaves the requests held, and the waker reads again on its next attempt
(adapter/proxy/wake.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter.config.proxy import ScaleTarget
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError
from adapter.kube.hpas import hpa_name, list_hpas, scaled_to_zero, targets
from adapter.kube.scale import GROUP

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


async def read_refusal(kube: KubeClient, target: ScaleTarget, wake_without_hpa: bool) -> Refusal | None:
    """Read the target's namespace's HPAs now and decide; None: wake it. Raises KubeError when the read failed for
    a reason that may pass (the caller keeps the requests held and reads again)."""
    try:
        hpas = await list_hpas(kube, target.namespace)
    except KubeAPIError as err:
        if err.status in _PASSING or err.status >= 500:
            raise
        return Refusal(
            "hpas_unreadable",
            f"{_where(target)} is at 0 replicas and the HorizontalPodAutoscalers of {target.namespace} cannot be "
            f"read ({err}), so whether a person stopped it is unknown and it is not woken; grant the proxy list on "
            "horizontalpodautoscalers, or set the route's wake: always",
            needs_fix=True,
        )
    return decide(hpas, target, wake_without_hpa)


def decide(hpas: list[dict[str, Any]], target: ScaleTarget, wake_without_hpa: bool) -> Refusal | None:
    """From the namespace's HPAs: None when the target may be woken, else why not."""
    scaling = sorted((hpa for hpa in hpas if targets(hpa, GROUP, target.kind, target.name)), key=hpa_name)
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
        # The HPA controller refuses to act on such a target (ScalingActive=False, reason AmbiguousSelector); which
        # of their conditions to believe is unknown, so neither is.
        return Refusal(
            "ambiguous_hpas",
            f"AmbiguousSelector: {_where(target)} is at 0 replicas and is scaled by more than one "
            f"HorizontalPodAutoscaler ({', '.join(map(hpa_name, scaling))}); the HPA controller acts on none of them, "
            "and this proxy does not wake it. Delete all but one of them",
            needs_fix=True,
        )
    (only,) = scaling
    if scaled_to_zero(only):
        return None
    return Refusal(
        "stopped_by_hand",
        f"{_where(target)} was stopped by hand: it is at 0 replicas, but its HorizontalPodAutoscaler {hpa_name(only)} "
        f"did not scale it there (ScaledToZero is not True), so neither the HPA nor this proxy starts it. "
        f"Start it again with: {start}",
    )


def _where(target: ScaleTarget) -> str:
    return f"{target.kind} {target.namespace}/{target.name}"
