"""The cold-start histograms link to the trace of a request that waited: a real Prometheus, its exemplar storage on,
scrapes the proxy's admin port (OpenMetrics) and its exemplar API returns the trace id of the proxy's span for a
request held through a cold start (wake: scale against the Kubernetes API stand-in, an EndpointSlice turning ready,
a real upstream), also for the queries of the dashboard panels that draw exemplars. The spans go to the SDK's
in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapter.config.tracing import TracingConfig
from adapter.kube.client import KubeClient
from adapter.telemetry import tracing
from grafana import generate
from tests.fixtures.kube_routes import ScaleStandIn, endpoint_slice, slices_collection, wake_route, wake_standin
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.prometheus import Prometheus, scrape_config
from tests.fixtures.proxy import get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.grafana.test_dashboards import fill

HISTOGRAMS = (
    "zeroscale_proxy_hold_duration_seconds",
    "zeroscale_proxy_cold_start_wake_to_ready_seconds",
    "zeroscale_proxy_cold_start_ready_to_first_byte_seconds",
)


def dashboard_exemplar_queries() -> list[str]:
    """What Grafana sends Prometheus' exemplar API for the panels that draw exemplars (grafana/generate.py)."""
    dashboard = json.loads((generate.OUT / "zeroscale-scale-from-zero.json").read_text())
    targets = [target for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return [fill(target["expr"], {"route": "default/web"}) for target in targets if target.get("exemplar")]


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # milliseconds: ended spans reach the exporter at once
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True, sample_ratio=1.0), "t", exporter)
    assert stop is not None
    try:
        yield exporter
    finally:
        stop()


@pytest.fixture
async def prometheus_of(tmp_path: Path) -> AsyncIterator[list[Prometheus]]:
    """Started by the test once it knows the port to scrape (on a thread: the proxy's loop must keep answering)."""
    if shutil.which("prometheus") is None:
        pytest.fail("Debian's prometheus is not installed (scripts/setup-system.sh installs it)")
    started: list[Prometheus] = []
    yield started
    for running in started:
        await asyncio.to_thread(running.stop)


def proxy_spans(exported: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exported.get_finished_spans() if span.name == "zeroscale.proxy.request"]


async def exemplar_trace_ids(prometheus: Prometheus, query: str, since: float) -> set[str]:
    data = await asyncio.to_thread(
        prometheus.get,
        "/api/v1/query_exemplars",
        query=query,
        start=f"{since - 60:.3f}",
        end=f"{time.time() + 60:.3f}",
    )
    return {exemplar["labels"].get("trace_id", "") for series in data for exemplar in series["exemplars"]}


async def test_each_cold_start_histogram_links_to_the_held_request_trace(
    kube: KubeStandIn,
    kube_client: KubeClient,
    exported: InMemorySpanExporter,
    prometheus_of: list[Prometheus],
    tmp_path: Path,
) -> None:
    began = time.time()
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    upstream = await Upstream().start()
    route = wake_route("web", wake_retry_interval=0.2)
    try:
        async with running_proxy([route], kube=kube_client) as server:
            scrape = tmp_path / "prometheus.yml"
            scrape.write_text(yaml.safe_dump(scrape_config({"zeroscale-proxy": server.admin_port})))
            prometheus = await asyncio.to_thread(Prometheus, scrape, tmp_path, exemplars=True)
            prometheus_of.append(prometheus)

            held = asyncio.create_task(request(server.port, get("/echo")))
            await until(lambda: scale.replicas == 1)
            await asyncio.sleep(0.3)  # the pod takes a while to become ready
            ready = endpoint_slice("web-abc", "web", [("127.0.0.1", {"ready": True})], upstream.port)
            kube.put(slices_collection("default"), ready)
            assert (await asyncio.wait_for(held, 15)).status == 200

            await until(lambda: bool(proxy_spans(exported)))
            (span,) = proxy_spans(exported)
            assert span.context is not None
            trace_id = f"{span.context.trace_id:032x}"

            queries = [f"{name}_bucket" for name in HISTOGRAMS] + dashboard_exemplar_queries()
            assert len(queries) >= len(HISTOGRAMS) + 2  # the hold time panel and the cold-start waits heatmap
            found: dict[str, set[str]] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # Prometheus scrapes every second
                found = {query: await exemplar_trace_ids(prometheus, query, began) for query in queries}
                if all(trace_id in ids for ids in found.values()):
                    break
                await asyncio.sleep(0.5)
            assert all(trace_id in ids for ids in found.values()), (trace_id, found)
    finally:
        await upstream.stop()
