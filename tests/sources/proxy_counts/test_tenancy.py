"""Tenancy of the `http` metric through both doors, the metrics API (an HPA) and KEDA's external scaler: a team
reads the counts of its own namespace's routes only. The proxy replicas are stand-ins serving the real pending-count
stream (CountsHub, over RouteCounts keyed `<namespace>/<name>` as a proxy keys its routes); the adapter is `serve()`
in-process, the HPA and KEDA its real clients over TLS and gRPC."""

from __future__ import annotations

from urllib.parse import quote

import grpc
import pytest

from adapter.rpc.generated import externalscaler_pb2 as pb
from tests.fixtures.grpc_servers import Adapter, Routes, StartAdapter, StartCounts, ref, scaler_stub
from tests.fixtures.httpclient import fetch

METRIC = "http-requests-pending"


def path(namespace: str, selector: str) -> str:
    return f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{METRIC}?labelSelector={quote(selector)}"


async def hpa_reads(adapter: Adapter, namespace: str, selector: str = "route=web") -> int:
    answer = await fetch(adapter.port, path(namespace, selector))
    assert answer.status == 200, answer.body
    return int(answer.json()["items"][0]["value"])


async def keda_reads(adapter: Adapter, namespace: str) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        scaled = ref(metric=METRIC, selector="route=web", owner=namespace)
        answer = await scaler_stub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=scaled, metricName=METRIC))
        value: float = answer.metricValues[0].metricValueFloat
        return value


@pytest.fixture
async def adapter(start_adapter: StartAdapter, start_counts: StartCounts) -> Adapter:
    """Two proxy replicas holding requests of route `web` in team-a (2 + 1) and team-b (5); `default/web` idle."""
    first, second = Routes("team-a/web", "team-b/web", "default/web"), Routes("team-a/web")
    first.add("team-a/web", held=2)
    second.add("team-a/web", inflight=1)
    first.add("team-b/web", held=5)
    a, b = await start_counts(first), await start_counts(second)
    source = {"name": "proxies", "type": "http", "proxies": [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]}
    return await start_adapter([source], [{"name": METRIC, "type": "http", "source": "proxies"}])


async def test_an_hpa_reads_the_routes_of_its_own_namespace(adapter: Adapter) -> None:
    assert await hpa_reads(adapter, "team-a") == 3
    assert await hpa_reads(adapter, "team-b") == 5
    assert await hpa_reads(adapter, "default") == 0
    assert await hpa_reads(adapter, "team-a", "route in (web,api)") == 3  # api: no such route in team-a, 0


async def test_keda_reads_the_routes_of_the_scaled_objects_namespace(adapter: Adapter) -> None:
    assert await keda_reads(adapter, "team-a") == 3
    assert await keda_reads(adapter, "team-b") == 5
    assert await keda_reads(adapter, "default") == 0


async def test_no_selector_names_another_namespaces_route(adapter: Adapter) -> None:
    """A label value cannot hold `/`: `route=team-b/web` from team-a is a 400, not team-b's 5."""
    answer = await fetch(adapter.port, path("team-a", "route=team-b/web"))
    assert answer.status == 400
    assert "'team-b/web' is not a valid label value" in answer.json()["message"]
