"""The scale subresource (docs/protocols.md#scale-subresource): read a workload's replicas and wake it from zero without
fighting the HPA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConnectionError
from adapter.kube.watching import field

# Kinds with a scale subresource under apps/v1, by the plural the API path uses.
_PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}
# Their API group: an HPA's scaleTargetRef must name it to scale them (adapter/kube/hpas.py, targets).
GROUP = "apps"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Scale:
    # spec.replicas: Go omits it at 0 (`"spec":{}`), so a missing value reads as 0.
    replicas: int
    status_replicas: int
    selector: str
    resource_version: str


def _plural(kind: str) -> str:
    try:
        return _PLURALS[kind]
    except KeyError:
        raise ValueError(f"{kind} has no apps/v1 scale subresource Zeroscale knows") from None


def scale_path(namespace: str, kind: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/{_plural(kind)}/{name}/scale"


def workload_collection_path(namespace: str, kind: str, name: str) -> str:
    """The collection holding just this workload, to list and watch it (fieldSelector on its name)."""
    return f"/apis/apps/v1/namespaces/{namespace}/{_plural(kind)}?fieldSelector=metadata.name%3D{name}"


def spec_replicas(workload: dict[str, Any] | None) -> int:
    """A workload object's spec.replicas; 0 when it is gone or the field is missing or not a number, the reading
    that keeps the proxy in the path (docs/architecture.md#activator)."""
    replicas = field(workload, "spec").get("replicas")
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 0


def parse_scale(obj: dict[str, Any]) -> Scale:
    try:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return Scale(
            replicas=int(spec.get("replicas", 0)),
            status_replicas=int(status.get("replicas", 0)),
            selector=str(status.get("selector", "")),
            resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")),
        )
    except (TypeError, ValueError, AttributeError) as err:
        raise KubeConnectionError(f"the Kubernetes API sent a Scale that does not parse: {err}") from None


async def get_scale(client: KubeClient, namespace: str, kind: str, name: str) -> Scale:
    _, obj = await client.request("GET", scale_path(namespace, kind, name))
    return parse_scale(obj)


async def set_replicas(
    client: KubeClient, namespace: str, kind: str, name: str, replicas: int, resource_version: str
) -> Scale:
    """Merge-patch spec.replicas with the read resourceVersion as a precondition.

    The precondition makes "only while it is 0" hold: if the HPA (or anyone) changed the
    Scale since it was read, the API answers 409 Conflict (KubeAPIError) and nothing changes.
    Only `patch` on `<kind>/scale` is needed, not `update`.
    """
    body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
    _, obj = await client.request("PATCH", scale_path(namespace, kind, name), body, content_type=MERGE_PATCH)
    return parse_scale(obj)
