"""The proxy's routes on the Kubernetes API stand-in: the scale subresource and EndpointSlices, in the shapes of
docs/protocols.md#wake-path."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from tests.kube_standin import KubeStandIn, Reply, StandInRequest, status_body

SLICES_V1 = r"/apis/discovery\.k8s\.io/v1/namespaces/[^/]+/endpointslices"
SLICES_V1BETA1 = r"/apis/discovery\.k8s\.io/v1beta1/namespaces/[^/]+/endpointslices"
# A wake: scale route reads its namespace's HPAs; one it cannot read wakes nothing (adapter/proxy/intent.py).
HPAS = r"/apis/autoscaling/v2/namespaces/[^/]+/horizontalpodautoscalers"


def slices_collection(namespace: str, version: str = "v1") -> str:
    return f"/apis/discovery.k8s.io/{version}/namespaces/{namespace}/endpointslices"


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[tuple[str, dict[str, bool]]],
    port: int,
    port_name: str = "http",
    version: str = "v1",
) -> dict[str, Any]:
    """An EndpointSlice as docs/protocols.md#endpointslices describes it: `conditions` keys are omitted when nil."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": f"discovery.k8s.io/{version}",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [address], "conditions": conditions, "targetRef": {"kind": "Pod", "name": f"pod-{address}"}}
            for address, conditions in endpoints
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


class ScaleStandIn:
    """One Deployment's scale subresource (docs/protocols.md#scale-subresource): GET, and merge PATCH with a
    resourceVersion precondition."""

    def __init__(self, standin: KubeStandIn, namespace: str, name: str, replicas: int = 0) -> None:
        self.replicas = replicas
        self.version = 100
        self.patches: list[dict[str, Any]] = []
        self.conflicts = 0
        # Runs before a PATCH is applied: a test can change the Scale there, as the HPA might.
        self.before_patch: Callable[[ScaleStandIn], None] = lambda _scale: None
        self.forbidden = False
        self._lock = threading.Lock()
        path = rf"/apis/apps/v1/namespaces/{re.escape(namespace)}/deployments/{re.escape(name)}/scale"
        self._namespace, self._name = namespace, name
        standin.add_route("GET", path, self._get)
        standin.add_route("PATCH", path, self._patch)

    def set(self, replicas: int) -> None:
        with self._lock:
            self.replicas = replicas
            self.version += 1

    def _body(self) -> dict[str, Any]:
        # Go omits spec.replicas at 0: `"spec":{}`.
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": self._name, "namespace": self._namespace, "resourceVersion": str(self.version)},
            "spec": {"replicas": self.replicas} if self.replicas else {},
            "status": {"replicas": self.replicas, "selector": f"app={self._name}"},
        }

    def _get(self, _request: StandInRequest, _match: re.Match[str]) -> Reply:
        if self.forbidden:
            return Reply(403, status_body(403, "Forbidden", "deployments.apps/scale is forbidden"))
        with self._lock:
            return Reply(200, self._body())

    def _patch(self, request: StandInRequest, _match: re.Match[str]) -> Reply:
        if request.headers.get("content-type") != "application/merge-patch+json":
            return Reply(415, status_body(415, "UnsupportedMediaType", "merge patch expected"))
        patch = request.json()
        self.before_patch(self)
        with self._lock:
            self.patches.append(patch)
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != str(self.version):
                self.conflicts += 1
                message = "the object has been modified; please apply your changes to the latest version"
                return Reply(409, status_body(409, "Conflict", message))
            self.replicas = int(patch["spec"]["replicas"])
            self.version += 1
            return Reply(200, self._body())
