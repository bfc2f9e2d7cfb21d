"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): where to list and watch them, and what they say
about their scale targets."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from adapter.kube.watching import field, items_of


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


def targets(hpa: dict[str, Any], kind: str, name: str) -> bool:
    """The HPA scales this workload (its scaleTargetRef names the kind and name)."""
    ref = field(field(hpa, "spec"), "scaleTargetRef")
    return bool(ref.get("kind") == kind and ref.get("name") == name)


def scaled_to_zero(hpa: dict[str, Any]) -> bool:
    """The HPA's ScaledToZero condition is True: the HPA itself took its target to zero (Kubernetes v1.37+)."""
    for condition in items_of(field(hpa, "status"), "conditions"):
        if isinstance(condition, dict) and condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return False
