"""Traces of the adapter's answers from Redis: the HPA's list call and KEDA's GetMetrics, down to the pipeline that
read the value (adapter/telemetry/reads.py), through `zeroscale serve` in-process and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.rpc.generated import externalscaler_pb2 as pb
from adapter.telemetry import tracing
from tests.fixtures.adapter_inprocess import Serving, start_serving
from tests.fixtures.grpc_servers import adapter_config, ref, scaler_stub
from tests.fixtures.httpclient import fetch
from tests.fixtures.netutil import refused_port
from tests.fixtures.redis_servers import RedisProcess
from tests.fixtures.traces import (
    CALLER_SPAN,
    CALLER_TRACE,
    TRACEPARENT,
    Traces,
    attributes,
    is_child,
    linked,
    named,
    one,
    parent_id,
)
from tests.sources.redis.fixtures import Make, redis_metric

PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/redis-jobs?labelSelector=key%3Djobs"
METRIC = {
    "name": "redis-jobs",
    "type": "redis",
    "source": "q",
    "query": "length",
    "labels": {"key": {"pattern": "[a-z]+", "required": True}},
}

Serve = Callable[[str], Awaitable[Serving]]


@pytest.fixture
def traces() -> Iterator[Traces]:
    with Traces() as traces:
        yield traces


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """`zeroscale serve` (metrics API and KEDA scaler) reading Redis at a URL."""
    running: list[Serving] = []

    async def start(url: str) -> Serving:
        config = adapter_config([{"name": "q", "type": "redis", "url": url, "connect_timeout": 1}], [METRIC])
        running.append(await start_serving(config))
        return running[-1]

    yield start
    for serving in running:
        serving.stop.set()
        assert await asyncio.wait_for(serving.task, 10) == 0


def chain(spans: list[ReadableSpan], top: str) -> tuple[ReadableSpan, ReadableSpan, ReadableSpan]:
    """The request span `top`, the refresh it caused and the pipeline that refresh waited for: one line of descent."""
    request = one(spans, top)
    refresh = one(spans, tracing.CACHE_REFRESH)
    pipeline = one(spans, tracing.REDIS_PIPELINE)
    assert is_child(refresh, request)
    assert is_child(pipeline, refresh)
    assert (request.kind, refresh.kind, pipeline.kind) == (SpanKind.SERVER, SpanKind.INTERNAL, SpanKind.CLIENT)
    assert attributes(pipeline)[tracing.DB_SYSTEM] == "redis"
    assert attributes(pipeline)[tracing.DB_BATCH_SIZE] == 1
    assert attributes(refresh)[tracing.SOURCE] == "q"
    return request, refresh, pipeline


async def test_an_hpa_read_is_traced_down_to_the_redis_pipeline(
    server: RedisProcess, serve: Serve, traces: Traces
) -> None:
    server.client().rpush("jobs", 1, 2, 3)
    serving = await serve(f"redis://{server.address}")
    answer = await fetch(serving.ports["api"], PATH)
    assert answer.status == 200, answer.body
    assert (await fetch(serving.ports["api"], "/healthz")).status == 200  # probes are not traced

    request, _, _ = chain(traces.ended(), tracing.ADAPTER_REQUEST)
    assert request.parent is None  # no traceparent: a trace of its own
    assert request.attributes == {
        tracing.METHOD: "GET",
        tracing.HTTP_ROUTE: "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
        tracing.STATUS_CODE: 200,
        tracing.METRIC: "redis-jobs",
        tracing.NAMESPACE: "default",
        tracing.SELECTOR: "key=jobs",
        tracing.CACHE_OUTCOME: "refreshed",
        tracing.SERIES: 1,
        tracing.VALUE_AGE: pytest.approx(0, abs=1),
    }


async def test_a_hit_continues_the_callers_trace_and_links_the_read_it_was_served(
    server: RedisProcess, serve: Serve, traces: Traces
) -> None:
    serving = await serve(f"redis://{server.address}")
    assert (await fetch(serving.ports["api"], PATH)).status == 200  # the cold read
    answer = await fetch(serving.ports["api"], PATH, [("traceparent", TRACEPARENT)])
    assert answer.status == 200

    spans = traces.ended()
    hit = one(spans, tracing.ADAPTER_REQUEST, CALLER_TRACE)
    assert parent_id(hit) == CALLER_SPAN
    assert attributes(hit)[tracing.CACHE_OUTCOME] == "hit"
    assert named(spans, tracing.CACHE_REFRESH, CALLER_TRACE) == []  # no source read in the caller's trace
    assert named(spans, tracing.REDIS_PIPELINE, CALLER_TRACE) == []
    assert linked(hit, "served") == [one(spans, tracing.CACHE_REFRESH).context.span_id]


async def test_a_keda_call_is_traced_down_to_the_redis_pipeline(
    server: RedisProcess, serve: Serve, traces: Traces
) -> None:
    server.client().rpush("jobs", 1)
    serving = await serve(f"redis://{server.address}")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{serving.ports['scaler']}") as channel:
        request = pb.GetMetricsRequest(scaledObjectRef=ref("redis-jobs", "key=jobs"), metricName="redis-jobs")
        answer = await scaler_stub(channel).GetMetrics(request, metadata=[("traceparent", TRACEPARENT)])
    assert answer.metricValues[0].metricValueFloat == 1

    call, _, pipeline = chain(traces.ended(), tracing.KEDA_CALLS["GetMetrics"])
    assert (call.context.trace_id, parent_id(call)) == (CALLER_TRACE, CALLER_SPAN)
    assert pipeline.context.trace_id == CALLER_TRACE
    assert attributes(call) == {
        tracing.RPC_SYSTEM: "grpc",
        tracing.RPC_SERVICE: "externalscaler.ExternalScaler",
        tracing.RPC_METHOD: "GetMetrics",
        tracing.RPC_STATUS: 0,
        tracing.METRIC: "redis-jobs",
        tracing.NAMESPACE: "default",
        tracing.SELECTOR: "key=jobs",
        tracing.CACHE_OUTCOME: "refreshed",
        tracing.SERIES: 1,
        tracing.VALUE_AGE: pytest.approx(0, abs=1),
    }


async def test_redis_down_marks_every_span_of_the_read_as_an_error_with_its_cause(serve: Serve, traces: Traces) -> None:
    port = refused_port()
    serving = await serve(f"redis://127.0.0.1:{port}")
    answer = await fetch(serving.ports["api"], PATH)
    assert answer.status == 503
    async with grpc.aio.insecure_channel(f"127.0.0.1:{serving.ports['scaler']}") as channel:
        request = pb.GetMetricsRequest(scaledObjectRef=ref("redis-jobs", "key=other"), metricName="redis-jobs")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await scaler_stub(channel).GetMetrics(request)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

    spans = traces.ended()
    cause = f"cannot reach redis 127.0.0.1:{port}"
    for name in (tracing.ADAPTER_REQUEST, tracing.KEDA_CALLS["GetMetrics"]):
        top = one(spans, name)
        assert top.status.status_code is StatusCode.ERROR
        assert cause in (top.status.description or "")
        assert attributes(top)[tracing.CACHE_OUTCOME] == "unavailable"
    assert attributes(one(spans, tracing.ADAPTER_REQUEST))[tracing.STATUS_CODE] == 503
    assert attributes(one(spans, tracing.KEDA_CALLS["GetMetrics"]))[tracing.RPC_STATUS] == 14
    for name in (tracing.CACHE_REFRESH, tracing.REDIS_PIPELINE):
        found = named(spans, name)
        assert len(found) == 2
        for span in found:
            assert span.status.status_code is StatusCode.ERROR
            assert cause in (span.status.description or "")


async def test_one_pipeline_for_two_series_is_in_the_first_callers_trace_and_linked_from_the_other(
    server: RedisProcess, make_source: Make, traces: Traces
) -> None:
    metric = redis_metric("length")
    cache = MetricCache(Catalogue([metric]), {"q": make_source(url=f"redis://{server.address}")}, CacheConfig())
    first, second = traces.span("first"), traces.span("second")
    try:
        await asyncio.gather(
            cache.read(metric.name, "default", "key=a", first), cache.read(metric.name, "default", "key=b", second)
        )
    finally:
        first.end()
        second.end()
        await cache.close()

    spans = traces.ended()
    pipeline = one(spans, tracing.REDIS_PIPELINE)
    assert attributes(pipeline)[tracing.CALLERS] == 2
    mine = one(spans, tracing.CACHE_REFRESH, first.get_span_context().trace_id)
    other = one(spans, tracing.CACHE_REFRESH, second.get_span_context().trace_id)
    assert is_child(mine, first)
    assert is_child(other, second)
    assert is_child(pipeline, mine)
    assert linked(other, "joined") == [pipeline.context.span_id]


async def test_a_refresh_nobody_waits_for_is_a_trace_of_its_own_linked_from_the_answers_it_serves(
    server: RedisProcess, make_source: Make, traces: Traces
) -> None:
    metric = redis_metric("length")
    catalogue = Catalogue([metric])
    cache = MetricCache(catalogue, {"q": make_source(url=f"redis://{server.address}")}, CacheConfig(interval=0.2))
    refreshed = asyncio.Event()
    first, later = traces.span("first"), traces.span("later")
    try:
        await cache.read(metric.name, "default", "key=a", first)
        # Subscribed: refreshed every interval by the cache itself, whoever asks.
        unsubscribe = cache.subscribe(catalogue.resolve(metric.name, "default", "key=a")[0], lambda _: refreshed.set())
        await asyncio.wait_for(refreshed.wait(), 5)
        unsubscribe()
        await cache.read(metric.name, "default", "key=a", later)
    finally:
        first.end()
        later.end()
        await cache.close()

    spans = traces.ended()
    background = [s for s in named(spans, tracing.CACHE_REFRESH) if s.parent is None]
    assert background, "the cache's own refresh was not traced"
    assert one(spans, tracing.REDIS_PIPELINE, background[0].context.trace_id).parent is not None
    answered = one(spans, "later")
    assert attributes(answered)[tracing.CACHE_OUTCOME] in ("hit", "stale")
    assert linked(answered, "served") == [background[-1].context.span_id]
