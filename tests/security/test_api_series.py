"""Issue 12 items 3 and 13, issue 20 item 3 (Quantity part): no caller can fill the series table or make
another caller's read fail; namespaces and selectors are validated and normalised; a value the HPA would
misread is an error, never a number."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import grpc
import pytest

from adapter.api.http import Request
from adapter.api.routes import ExternalMetricsAPI
from adapter.config.base import SelectorLabel
from adapter.config.server import CacheConfig
from adapter.config.static import StaticMetric
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import BadSelector, MetricUnavailable
from adapter.rpc.generated import externalscaler_pb2 as pb
from adapter.sources.base import Source
from adapter.telemetry import cache as telemetry
from tests.fixtures.adapter_inprocess import DEMO_METRICS, DEMO_SOURCES, start_serving
from tests.fixtures.grpc_servers import adapter_config, ref, scaler_stub
from tests.metrics.test_cache import Clock, ScriptedSource
from tests.security.api_serving import connect, read_all, run, serving

LIST = "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/demo-queue-depth"


def _cache(source: Source, clock: Clock | None = None, pattern: str = ".+", **config: object) -> MetricCache:
    metric = StaticMetric.model_validate(
        {"name": "Jobs", "type": "static", "source": "q", "labels": {"queue": SelectorLabel(pattern=pattern)}}
    )
    settings = CacheConfig.model_validate({"interval": 3600, "max_staleness": 60, **config})
    return MetricCache(Catalogue([metric]), {"q": source}, settings, clock=clock or Clock())


async def _ask_until(cache: MetricCache, clock: Clock, condition: Callable[[], bool]) -> None:
    """Ask for the series as an HPA would (a refresh follows each ask once `interval` passed) until `condition`."""
    for _ in range(1000):
        if condition():
            return
        clock.now += 0.02
        with contextlib.suppress(MetricUnavailable):
            await cache.read("jobs", "default", "queue=a")
        await asyncio.sleep(0.005)
    raise AssertionError("the condition did not become true within 1,000 asks")


async def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await connect(port, tls=True)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = await read_all(reader)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    "namespace",
    [
        "..",
        "",
        "default%00",
        "kube-system%2F..%2Fdefault",
        "Default",
        "a" * 64,
        "-default",
        "default-",
        "a_b",
        "%2E%2E",
    ],
)
def test_a_namespace_kubernetes_could_not_have_is_a_400(namespace: str) -> None:
    async def scenario() -> None:
        async with serving({}) as ports:
            code, status = await _get(ports.api, LIST.format(namespace=namespace))
            assert (code, status["reason"]) == (400, "BadRequest"), status
            assert "DNS-1123 label" in status["message"]
            code, _ = await _get(ports.api, LIST.format(namespace="a" * 63))
            assert code == 200

    run(scenario())


def test_an_unsatisfiable_selector_is_a_400_that_says_so() -> None:
    """Issue 12 item 13: `queue in (orders,emails),queue=c` was served as `queue=c`."""

    async def scenario() -> None:
        async with serving({}) as ports:
            path = LIST.format(namespace="default") + "?labelSelector=queue+in+%28orders%2Cemails%29%2Cqueue%3Dc"
            code, status = await _get(ports.api, path)
            assert code == 400, status
            assert "can never all hold: the selector matches nothing" in status["message"]
            both = LIST.format(namespace="default") + "?labelSelector=queue+in+%28orders%2Cemails%29%2Cqueue%3Demails"
            code, listing = await _get(ports.api, both)
            assert (code, listing["items"][0]["value"]) == (200, "500m")  # the intersection: emails alone

    run(scenario())


async def test_comparison_operands_are_checked_against_the_labels_pattern() -> None:
    cache = _cache(ScriptedSource(), pattern="[a-z]+")
    for bound in range(50):
        with pytest.raises(BadSelector, match="does not match the pattern"):
            await cache.read("jobs", "default", f"queue>{bound}")
    assert cache.series_count() == 0
    await cache.close()


async def test_equivalent_spellings_share_one_series() -> None:
    source = ScriptedSource()
    cache = _cache(source)
    spellings = ["queue in (a,b)", "queue in (b,a)", "queue in ( b , a , a )", "queue in (a,b,c),queue notin (c)"]
    spellings += ["queue in (a,b),queue", "queue in (a,b),queue!=z"]
    for text in spellings:
        await cache.read("jobs", "default", text)
    comparisons = ["queue>5", "queue>05", "queue>+5", "queue>1,queue>5"]
    for text in comparisons:
        await cache.read("jobs", "default", text)
    assert cache.series_count() == 2
    assert source.queries == 2
    await cache.close()


async def test_a_flood_of_selectors_in_one_namespace_leaves_other_namespaces_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reported flood: 10,000 `queue>N` selectors filled cache.max_series and a new HPA got 503."""
    source = ScriptedSource()
    cache = _cache(source, max_series=1000, max_series_per_namespace=100)
    live = await cache.read("jobs", "prod", "queue=orders")
    refused = telemetry.SERIES_REFUSED.labels("max_series_per_namespace")._value.get()
    answered, refusals = 0, set()
    caplog.set_level(logging.WARNING, logger="adapter.metrics.cache")
    for bound in range(10_000):
        try:
            await cache.read("jobs", "attacker", f"queue>{bound}")
            answered += 1
        except MetricUnavailable as err:
            refusals.add(err.message)
    assert answered == 100
    assert refusals == {
        "namespace attacker already has 100 series in the cache (cache.max_series_per_namespace); "
        "raise it or narrow the selectors used in this namespace"
    }
    assert telemetry.SERIES_REFUSED.labels("max_series_per_namespace")._value.get() == refused + 9_900
    # Logged once (the clock stands still here), not 9,900 times.
    assert [r.getMessage() for r in caplog.records] == [f"new series refused: {next(iter(refusals))}"]
    # The live series was not evicted, and a new HPA in another namespace is served.
    assert (await cache.read("jobs", "prod", "queue=orders")) is live
    assert (await cache.read("jobs", "staging", "queue=orders")).value == Decimal(7)
    await cache.close()


async def test_a_full_table_refuses_new_series_and_keeps_the_live_ones() -> None:
    cache = _cache(ScriptedSource(), max_series=3, max_series_per_namespace=3)
    live = [await cache.read("jobs", namespace, "queue=a") for namespace in ("a", "b", "c")]
    with pytest.raises(MetricUnavailable, match=r"\(cache.max_series\)"):
        await cache.read("jobs", "d", "queue=a")
    assert [await cache.read("jobs", namespace, "queue=a") for namespace in ("a", "b", "c")] == live
    await cache.close()


async def test_a_series_that_never_answered_is_not_refreshed_after_its_failure() -> None:
    source = ScriptedSource()
    source.failure = "no such queue"
    clock = Clock()
    cache = _cache(source, clock, interval=0.02)
    for bound in range(20):
        with pytest.raises(MetricUnavailable, match="no such queue"):
            await cache.read("jobs", "default", f"queue>{bound}")
    await asyncio.sleep(0.3)  # fifteen intervals: the old cache refreshed each of the 20 series every one of them
    assert source.queries == 20
    assert cache.series_count() == 0
    await cache.close()


async def test_a_failing_series_logs_one_line_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    source = ScriptedSource()
    clock = Clock()
    cache = _cache(source, clock, interval=0.01)
    await cache.read("jobs", "default", "queue=a")  # answered once: its refreshes go on while it fails
    source.failure = "connection refused"
    with caplog.at_level(logging.WARNING, logger="adapter.metrics.cache"):
        await _ask_until(cache, clock, lambda: source.queries >= 30)
        assert len(caplog.records) == 1
        clock.now += 61
        queries = source.queries
        await _ask_until(cache, clock, lambda: source.queries > queries)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "connection refused" in lines[0]
    assert "similar lines suppressed)" in lines[1]
    await cache.close()


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (Decimal("9223372036854775.808"), "too large for a Kubernetes Quantity"),
        (Decimal("-9223372036854775.809"), "too large for a Kubernetes Quantity"),
        (Decimal(2**64 + 3), "too large for a Kubernetes Quantity"),
        (Decimal("NaN"), "not a finite number"),
        (Decimal("Infinity"), "not a finite number"),
        (Decimal("sNaN"), "not a finite number"),
    ],
)
async def test_a_value_the_hpa_would_misread_is_an_error_not_a_number(value: Decimal, cause: str) -> None:
    source = ScriptedSource()
    source.value = Decimal(5)
    clock = Clock()
    cache = _cache(source, clock, interval=0.01)
    assert (await cache.read("jobs", "default", "queue=a")).value == 5
    refused = telemetry.VALUES_REFUSED.labels("jobs")._value.get()
    source.value = value
    await _ask_until(cache, clock, lambda: source.queries >= 3)
    # Not the number, and not the last good one either: the source says something else now.
    with pytest.raises(MetricUnavailable, match=cause):
        await cache.read("jobs", "default", "queue=a")
    assert telemetry.VALUES_REFUSED.labels("jobs")._value.get() > refused
    await cache.close()


async def test_the_largest_servable_values_are_served() -> None:
    for value in (Decimal("9223372036854775.807"), Decimal("-9223372036854775.808")):
        source = ScriptedSource()
        source.value = value
        cache = _cache(source)
        assert (await cache.read("jobs", "default", "queue=a")).value == value
        await cache.close()


def test_an_overflowing_static_value_is_a_503_with_its_cause_on_the_api() -> None:
    metrics = [{"name": "Demo-Queue-Depth", "type": "static", "source": "huge"}]

    async def scenario() -> None:
        async with serving({}, metrics=metrics, sources=[_huge_source()]) as ports:
            code, status = await _get(ports.api, LIST.format(namespace="default"))
            assert (code, status["reason"]) == (503, "ServiceUnavailable"), status
            assert "too large for a Kubernetes Quantity" in status["message"]

    run(scenario())


def _huge_source() -> dict[str, Any]:
    return {"name": "huge", "type": "static", "series": [{"value": "9223372036854775807"}]}


async def _grpc_failure(sources: list[dict[str, Any]], metrics: list[dict[str, Any]], scaled: Any) -> Any:
    """Start `serve()` with KEDA's scaler, call GetMetrics for `scaled` and return the error it answers."""
    serving = await start_serving(adapter_config(sources, metrics), "the scaler")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serving.ports['scaler']}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await scaler_stub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=scaled))
            return failed.value
    finally:
        serving.stop.set()
        assert await asyncio.wait_for(serving.task, 10) == 0


def test_an_overflowing_value_is_an_error_on_the_grpc_scaler_too() -> None:
    """The scaler reads the same cache: KEDA gets UNAVAILABLE with the cause, never the wrapped number."""

    async def scenario() -> None:
        metrics = [{"name": "Demo-Queue-Depth", "type": "static", "source": "huge"}]
        failure = await _grpc_failure([_huge_source()], metrics, ref(selector=""))
        assert failure.code() == grpc.StatusCode.UNAVAILABLE
        assert "too large for a Kubernetes Quantity" in (failure.details() or "")

    run(scenario())


@pytest.mark.parametrize("namespace", ["..", "", "default\x00", "kube-system/../default", "Default", "a" * 64])
async def test_every_reader_of_the_cache_gets_namespaces_checked(namespace: str) -> None:
    """The gRPC scaler reads the cache without the HTTP route's check: junk namespaces were series of their own."""
    cache = _cache(ScriptedSource())
    with pytest.raises(BadSelector, match="DNS-1123 label"):
        await cache.read("jobs", namespace, "queue=a")
    assert cache.series_count() == 0
    await cache.close()


def test_the_grpc_scaler_refuses_a_namespace_kubernetes_could_not_have() -> None:
    async def scenario() -> None:
        failure = await _grpc_failure(DEMO_SOURCES, DEMO_METRICS, ref(namespace="kube-system/../default"))
        assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "DNS-1123 label" in (failure.details() or "")

    run(scenario())


def test_a_selector_of_thousands_of_requirements_is_refused_before_parsing() -> None:
    """Before: a 16 KB selector of 4,000 requirements was parsed whole (~40 ms of event loop per request)
    before its first unknown label was reported; now its size in parts is checked first."""

    async def scenario() -> None:
        async with serving({}) as ports:
            selector = ",".join(f"!q{n}" for n in range(2000))  # 12 KB: within the head limit
            code, status = await _get(ports.api, LIST.format(namespace="default") + f"?labelSelector={selector}")
            assert code == 400
            assert "more than 256 requirements and set values" in status["message"]
            code, _ = await _get(ports.api, LIST.format(namespace="default") + "?labelSelector=queue%20in%20(a,b)")
            assert code != 400

    run(scenario())


async def test_spellings_of_one_series_share_one_rendered_answer() -> None:
    """Before: each spelling of a selector kept its own rendered answer, keyed by its text (up to 16 KB each,
    4,096 of them): one reader could park 64 MB there with padded spellings of one series."""
    cache = _cache(ScriptedSource())
    api = ExternalMetricsAPI(cache, None, None)
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/jobs?labelSelector="
    bodies = set()
    for padding in range(50):
        target = path + "queue" + "%20" * padding + "=a"
        response = await api(Request(None, "GET", target, []))  # type: ignore[arg-type]
        assert response.status == 200
        bodies.add(response.body)
    assert len(bodies) == 1
    assert len(api._rendered) == 1
    await cache.close()
