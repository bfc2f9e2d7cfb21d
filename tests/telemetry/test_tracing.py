"""Turning tracing on and off, its bounded queue, and W3C context in and out (adapter/telemetry/tracing.py).

The SDK's own in-memory exporter stands where the OTLP endpoint would be (tests/telemetry/test_jaeger*.py send to a
real Jaeger)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from adapter.config.tracing import TracingConfig
from adapter.telemetry import tracing


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("zeroscale_tracing_spans_total", {"outcome": outcome}) or 0.0


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True, sample_ratio=1.0), "zeroscale-test", exporter)
    assert stop is not None
    try:
        yield exporter
    finally:
        stop()
    assert tracing.TRACER is None


def test_off_unless_enabled() -> None:
    assert tracing.start(TracingConfig(), "zeroscale-test") is None
    assert tracing.TRACER is None


def test_otel_sdk_disabled_keeps_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.start(TracingConfig(enabled=True), "zeroscale-test") is None


def test_spans_are_exported_with_the_service_name_and_counted() -> None:
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True), "zeroscale-test", exporter)
    assert stop is not None
    assert tracing.TRACER is not None
    before = _count("exported")
    with tracing.TRACER.start_as_current_span("one"):
        pass
    tracing.TRACER.start_span("two").end()
    stop()  # flushes what is queued
    spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["one", "two"]
    assert spans[0].resource.attributes["service.name"] == "zeroscale-test"
    assert _count("exported") - before == 2


def test_service_name_from_config_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True, service_name="from-config"), "default", exporter)
    assert stop is not None
    assert tracing.TRACER is not None
    tracing.TRACER.start_span("s").end()
    stop()
    assert exporter.get_finished_spans()[0].resource.attributes["service.name"] == "from-config"
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True), "default", exporter)
    assert stop is not None
    assert tracing.TRACER is not None
    tracing.TRACER.start_span("s").end()
    stop()
    assert exporter.get_finished_spans()[0].resource.attributes["service.name"] == "from-env"


class _Stuck(SpanExporter):
    """An endpoint that does not answer until released: spans pile up in the queue."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_a_full_queue_drops_and_counts_instead_of_growing() -> None:
    stuck = _Stuck()
    stop = tracing.start(TracingConfig(enabled=True, sample_ratio=1.0, max_queued_spans=3), "t", stuck)
    assert stop is not None
    assert tracing.TRACER is not None
    dropped, failed = _count("dropped"), _count("failed")
    for index in range(10):
        tracing.TRACER.start_span(f"s{index}").end()
    assert _count("dropped") - dropped == 7
    stuck.release.set()
    stop()
    assert _count("failed") - failed == 3


def test_sample_ratio_zero_samples_no_new_trace_but_follows_a_sampled_caller() -> None:
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True, sample_ratio=0.0), "t", exporter)
    assert stop is not None
    assert tracing.TRACER is not None
    tracing.TRACER.start_span("new").end()
    sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    unsampled = "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203331-00"
    tracing.TRACER.start_span("child", context=tracing.parent_of(sampled)).end()
    tracing.TRACER.start_span("not", context=tracing.parent_of(unsampled)).end()
    stop()
    [child] = exporter.get_finished_spans()
    assert child.name == "child"
    assert child.context is not None
    assert child.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert child.parent is not None
    assert child.parent.span_id == 0xB7AD6B7169203331


def test_context_goes_on_with_the_spans_own_id_and_the_callers_state(exported: InMemorySpanExporter) -> None:
    assert tracing.TRACER is not None
    parent = tracing.parent_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "vendor=opaque")
    span = tracing.TRACER.start_span("hop", context=parent)
    headers = tracing.headers_of(span)
    span.end()
    context = span.get_span_context()
    assert headers["traceparent"] == f"00-0af7651916cd43dd8448eb211c80319c-{context.span_id:016x}-01"
    assert headers["tracestate"] == "vendor=opaque"
    assert tracing.exemplar_of(span) == {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": f"{context.span_id:016x}",
    }


@pytest.mark.parametrize(
    "traceparent",
    [None, "", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-abc-def-01"],
)
def test_a_missing_or_malformed_traceparent_starts_a_trace_of_its_own(traceparent: str | None) -> None:
    assert tracing.parent_of(traceparent) is None


def test_an_unsampled_span_gives_no_exemplar() -> None:
    exporter = InMemorySpanExporter()
    stop = tracing.start(TracingConfig(enabled=True, sample_ratio=0.0), "t", exporter)
    assert stop is not None
    assert tracing.TRACER is not None
    span = tracing.TRACER.start_span("new")
    assert tracing.exemplar_of(span) is None
    assert tracing.exemplar_of(None) is None
    span.end()
    stop()
