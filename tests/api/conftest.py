"""Fixtures of the API server tests: the Kubernetes stand-in and certificate authorities."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trustme

from tests.kube_standin import KubeStandIn


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    """The stand-in for the Kubernetes API (tests/kube_standin.py), on a free loopback port."""
    with KubeStandIn() as standin:
        yield standin


@pytest.fixture(scope="session")
def front_proxy_ca() -> trustme.CA:
    """Signs the aggregator's front-proxy client certificate (requestheader-client-ca-file)."""
    return trustme.CA(organization_name="front-proxy-ca")


@pytest.fixture(scope="session")
def client_ca() -> trustme.CA:
    """Signs ordinary client certificates (client-ca-file)."""
    return trustme.CA(organization_name="client-ca")
