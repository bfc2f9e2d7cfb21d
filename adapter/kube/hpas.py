"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): list and watch them, and read what they say
about their scale targets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from adapter.kube.client import KubeClient
from adapter.kube.watching import field, items_of, objects_by_name


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


async def list_hpas(client: KubeClient, namespace: str) -> tuple[str, dict[str, dict[str, Any]], str]:
    """(collection path, HPAs by name, the list's resourceVersion)."""
    path = hpas_path(namespace)
    _, listing = await client.request("GET", path)
    items = objects_by_name(listing)
    return path, items, str((listing.get("metadata") or {}).get("resourceVersion", ""))


async def watch_hpas(client: KubeClient, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
    """The events after `resource_version`, until the server ends the watch; 410 Gone raises KubeAPIError."""
    async for event in client.watch(path, resource_version or None):
        yield event


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
