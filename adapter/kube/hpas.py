"""HorizontalPodAutoscalers of one namespace (autoscaling/v2): list and watch them, and read what they say
about their scale targets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from adapter.kube.client import KubeClient

# The API server ends a watch after this long; the caller watches again from the last resourceVersion.
WATCH_TIMEOUT_SECONDS = 290


def hpas_path(namespace: str) -> str:
    return f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/horizontalpodautoscalers"


async def list_hpas(client: KubeClient, namespace: str) -> tuple[str, dict[str, dict[str, Any]], str]:
    """(collection path, HPAs by name, the list's resourceVersion)."""
    path = hpas_path(namespace)
    _, listing = await client.request("GET", path)
    items = {item["metadata"]["name"]: item for item in listing.get("items") or []}
    return path, items, str((listing.get("metadata") or {}).get("resourceVersion", ""))


async def watch_hpas(client: KubeClient, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
    """The events after `resource_version`, until the server ends the watch; 410 Gone raises KubeAPIError."""
    async for event in client.watch(f"{path}?timeoutSeconds={WATCH_TIMEOUT_SECONDS}", resource_version or None):
        yield event


def targets(hpa: dict[str, Any], kind: str, name: str) -> bool:
    """The HPA scales this workload (its scaleTargetRef names the kind and name)."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    return bool(ref.get("kind") == kind and ref.get("name") == name)


def scaled_to_zero(hpa: dict[str, Any]) -> bool:
    """The HPA's ScaledToZero condition is True: the HPA itself took its target to zero (Kubernetes v1.37+)."""
    for condition in (hpa.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return False
