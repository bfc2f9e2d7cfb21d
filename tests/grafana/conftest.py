"""Fixtures of the dashboard tests: the Kubernetes API stand-in, its scale subresources, and the stack of
tests/fixtures/prometheus.py (`zeroscale serve` and its delegate, `zeroscale proxy`, an activator proxy and Debian's
Prometheus) once per module.

What the stand-in holds: no HPA for `web` (it wakes: wake_without_hpa) and one for `stopped` that did not scale it
to zero (a person did: its wake is refused); for the activator proxy's route shop/web (tests/fixtures/replicas.py),
its Deployment at 1 replica with no pod ready yet, its selector-less Service, the proxy's own pods, and writable
EndpointSlices and Leases.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.kube_routes import (
    HPAS,
    SLICES_V1,
    ScaleStandIn,
    endpoint_slice,
    hpa,
    hpas_collection,
    slices_collection,
)
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.prometheus import ACTIVATOR_PROXY_ADDRESS, Stack

DEPLOYMENTS = r"/apis/apps/v1/namespaces/[^/]+/deployments"
SERVICES = r"/api/v1/namespaces/[^/]+/services"
LEASES = r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList", writable=True)
        standin.serve_collection(HPAS, "HorizontalPodAutoscalerList")
        standin.put(hpas_collection("default"), hpa("stopped", "stopped", scaled_to_zero="False"))
        for pattern, kind in ((DEPLOYMENTS, "DeploymentList"), (SERVICES, "ServiceList"), (LEASES, "LeaseList")):
            standin.serve_collection(pattern, kind, writable=True)
        metadata = {"name": "web", "namespace": "shop"}
        deployment = {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": metadata, "spec": {"replicas": 1}}
        standin.put("/apis/apps/v1/namespaces/shop/deployments", deployment)
        ports = [{"name": "http", "port": 80, "protocol": "TCP"}]
        service = {"kind": "Service", "apiVersion": "v1", "metadata": metadata, "spec": {"ports": ports}}
        standin.put("/api/v1/namespaces/shop/services", service)
        ready = [(ACTIVATOR_PROXY_ADDRESS, {"ready": True})]
        proxies = endpoint_slice("zeroscale-proxy-a", "zeroscale-proxy", ready, 8080)
        proxies["metadata"]["namespace"] = "zeroscale"
        standin.put(slices_collection("zeroscale"), proxies)
        yield standin


@pytest.fixture(scope="module")
def scale(kube: KubeStandIn) -> ScaleStandIn:
    return ScaleStandIn(kube, "default", "web", replicas=0)


@pytest.fixture(scope="module")
def stopped(kube: KubeStandIn) -> ScaleStandIn:
    """Stopped by hand: its HPA says it did not scale it to zero."""
    return ScaleStandIn(kube, "default", "stopped", replicas=0)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, kube: KubeStandIn, scale: ScaleStandIn, stopped: ScaleStandIn
) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("dashboards"))
    try:
        running.start(kube)
        yield running
    finally:
        running.stop()
