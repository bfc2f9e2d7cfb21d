"""A cluster as the Kubernetes API stand-in shows it, holding a healthy Zeroscale installation the tests break.

The objects are the ones deploy/overlays/certs renders (APIService, Service, the generated Secret), plus
what the cluster adds: the aggregator's Available condition, EndpointSlices, discovery through the aggregator.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adapter.config.kube import KubeAPIConfig
from adapter.doctor.checks import Installation
from adapter.doctor.findings import Finding
from adapter.doctor.run import diagnose
from tests.fixtures.kube_standin import KubeStandIn, Reply, status_body

ROOT = Path(__file__).resolve().parents[2]
NS = "zeroscale"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
SERVICES = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
APISERVICE_NAME = "v1beta1.external.metrics.k8s.io"
ADAPTER_SA = f"system:serviceaccount:{NS}:zeroscale-adapter"


@functools.cache
def _rendered_base_text() -> str:
    done = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy" / "base")], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def rendered_base() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_rendered_base_text()) if doc]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name)


@dataclass
class Cluster:
    kube: KubeStandIn
    kubeconfig: Path
    discovery: Reply = field(default_factory=lambda: Reply(200, {}))
    denied: set[tuple[str, str]] = field(default_factory=set)  # (user, resource)
    minor: int = 37  # the Kubernetes release /version reports; before 37 minReplicas: 0 is refused...
    gate_on: bool = False  # ...unless HPAScaleToZero was turned on
    hpa_dry_runs: list[str] = field(default_factory=list)  # the dryRun parameter of each HPA create

    def apiservice(self) -> dict[str, Any]:
        found = self.kube.get(APISERVICES, APISERVICE_NAME)
        assert found is not None
        return found

    def update(self, collection: str, name: str, change: Any) -> None:
        obj = self.kube.get(collection, name)
        assert obj is not None
        change(obj)
        self.kube.put(collection, obj)


def write_kubeconfig(kube: KubeStandIn, path: Path) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "standin",
                "clusters": [
                    {"name": "standin", "cluster": {"server": kube.url, "certificate-authority": str(kube.ca_file)}}
                ],
                "users": [{"name": "admin", "user": {"tokenFile": str(kube.token_file)}}],
                "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "admin"}}],
            }
        )
    )


def unavailable(reason: str, message: str) -> Reply:
    return Reply(503, status_body(503, "ServiceUnavailable", f"{reason}: {message}"))


async def run_doctor(cluster: Cluster) -> list[Finding]:
    """`zeroscale doctor`'s checks against the stand-in, with the default installation's names."""
    return await diagnose(KubeAPIConfig(kubeconfig=cluster.kubeconfig), Installation())
