"""Fixtures of the dashboard tests: the Kubernetes API stand-in, its scale subresource, and the stack of
tests/fixtures/prometheus.py (`zeroscale serve`, `zeroscale proxy` and Debian's Prometheus) once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.kube_routes import HPAS, SLICES_V1, ScaleStandIn
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.prometheus import Stack


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList")
        standin.serve_collection(HPAS, "HorizontalPodAutoscalerList")  # none: the route wakes (wake_without_hpa)
        yield standin


@pytest.fixture(scope="module")
def scale(kube: KubeStandIn) -> ScaleStandIn:
    return ScaleStandIn(kube, "default", "web", replicas=0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, kube: KubeStandIn, scale: ScaleStandIn) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("dashboards"))
    try:
        running.start(kube)
        yield running
    finally:
        running.stop()
