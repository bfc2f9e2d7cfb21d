"""Fixtures of the hpa tests: a STAND-IN external metrics API (not Zeroscale's adapter) on loopback HTTPS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.kube_standin import KubeStandIn
from tests.hpa.fixtures import EXTERNAL_METRICS, MetricsStandIn


@pytest.fixture
def metrics_standin() -> Iterator[MetricsStandIn]:
    with KubeStandIn() as kube:
        standin = MetricsStandIn(kube)
        kube.add_route("GET", EXTERNAL_METRICS, standin.handle)
        yield standin
