"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): where to list them, and what they say about their
scale targets."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from adapter.kube.client import KubeClient
from adapter.kube.watching import field, items_of, objects_by_name


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


async def list_hpas(kube: KubeClient, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's HPAs by name, read from the API now (a list: never a watch's copy)."""
    _, listing = await kube.request("GET", hpas_path(namespace))
    return objects_by_name(listing)


def targets(hpa: dict[str, Any], group: str, kind: str, name: str) -> bool:
    """The HPA scales this workload: its scaleTargetRef names the same API group (of any version: `apps/v1` and
    `apps/v1beta2` are one group, `v1` is the core group ""), kind and name, as the HPA controller resolves it.
    Another group's kind of the same name (a CRD called Deployment) is another workload."""
    ref = field(field(hpa, "spec"), "scaleTargetRef")
    api_version = ref.get("apiVersion")
    if not isinstance(api_version, str):
        return False
    ref_group = api_version.rpartition("/")[0]
    return bool(ref_group == group and ref.get("kind") == kind and ref.get("name") == name)


def scaled_to_zero(hpa: dict[str, Any]) -> bool:
    """The HPA's ScaledToZero condition is True: the HPA itself took its target to zero (Kubernetes v1.37+)."""
    for condition in items_of(field(hpa, "status"), "conditions"):
        if isinstance(condition, dict) and condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return False
