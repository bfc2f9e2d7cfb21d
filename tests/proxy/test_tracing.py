"""The proxy's spans (adapter/proxy/trace.py): one `zeroscale.proxy.request` per request, its events in order, its one
ending, and the W3C context it carries to the upstream; with tracing off, nothing of it.

A real proxy, real upstreams (HTTP/1.1 and h2c), the Kubernetes API stand-in for wakes; the SDK's in-memory exporter
stands where the OTLP endpoint would be."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import REGISTRY

from adapter.config.tracing import TracingConfig
from adapter.kube.client import KubeClient
from adapter.telemetry import tracing
from tests.fixtures.h2_peers import H2Upstream, h2_request
from tests.fixtures.kube_routes import ColdWeb, hpa, hpas_collection, wake_route, wake_standin
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import get, request, route, running_proxy, until
from tests.fixtures.upstream_app import Seen, Upstream

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
SAMPLED = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
UNSAMPLED = f"00-{TRACE_ID}-{CLIENT_SPAN}-00"


class Traces:
    """Tracing on for one test, exporting to memory; `spans()` flushes and turns it off."""

    def __init__(self, ratio: float) -> None:
        self.exporter = InMemorySpanExporter()
        self._stop = tracing.start(TracingConfig(enabled=True, sample_ratio=ratio), "t", self.exporter)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def spans(self, name: str = "zeroscale.proxy.request") -> list[ReadableSpan]:
        self.stop()
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@contextmanager
def traces(ratio: float = 1.0) -> Iterator[Traces]:
    on = Traces(ratio)
    try:
        yield on
    finally:
        on.stop()
    assert tracing.TRACER is None


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def event(span: ReadableSpan, name: str) -> dict[str, Any]:
    (found,) = [event for event in span.events if event.name == name]
    return dict(found.attributes or {})


def traceparents(seen: Seen) -> list[str]:
    return [value.decode() for name, value in seen.raw_headers if name.lower() == b"traceparent"]


def ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def exemplar_trace(metric: str, route_key: str) -> set[str]:
    """The trace ids of the exemplars of histogram `metric`'s buckets for `route_key`."""
    return {
        sample.exemplar.labels["trace_id"]
        for family in REGISTRY.collect()
        if family.name == metric
        for sample in family.samples
        if sample.labels.get("route") == route_key and sample.exemplar is not None
    }


async def test_a_cold_start_is_one_span_with_its_events_in_order_and_the_upstream_continues_it(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    with traces() as on:
        async with running_proxy([wake_route("traced")], kube=kube_client) as server:
            pending = asyncio.create_task(
                request(server.port, get("/echo?token=secret", extra=f"traceparent: {SAMPLED}\r\ntracestate: v=1\r\n"))
            )
            await until(lambda: web.scale.replicas == 1)
            upstream = await Upstream(web.port).start()
            try:
                web.ready()
                response = await pending
            finally:
                await upstream.stop()
        (span,) = on.spans()
        (wake,) = on.spans("zeroscale.proxy.wake")
    assert response.status == 200
    assert events(span) == [
        "zeroscale.held",
        "zeroscale.wake.sent",
        "zeroscale.endpoint.ready",
        "zeroscale.forwarded",
        "zeroscale.first_byte",
    ]
    assert event(span, "zeroscale.held") == {"zeroscale.cold": True}
    assert event(span, "zeroscale.forwarded") == {"zeroscale.endpoint": f"127.0.0.1:{web.port}", "zeroscale.attempt": 1}
    assert span.kind is SpanKind.SERVER
    attributes = dict(span.attributes or {})
    hold = attributes.pop("zeroscale.hold.seconds")
    assert isinstance(hold, float)
    assert hold > 0
    assert attributes == {
        "http.request.method": "GET",
        "url.path": "/echo",  # the query may carry secrets: never in a span
        "server.address": "app.example",
        "network.protocol.version": "1.1",
        "zeroscale.route": "default/traced",
        "zeroscale.mode": "proxy",
        "zeroscale.outcome": "forwarded",
        "http.response.status_code": 200,
        "zeroscale.cold": True,
        "zeroscale.attempts": 1,
    }
    assert span.status.status_code is StatusCode.UNSET
    # The client's trace, continued; the upstream's parent is the proxy's span, and the tracestate goes on.
    trace_id, span_id = ids(span)
    assert trace_id == TRACE_ID
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == CLIENT_SPAN
    (seen,) = upstream.requests
    assert traceparents(seen) == [f"00-{TRACE_ID}-{span_id}-01"]
    assert seen.headers["tracestate"] == "v=1"
    # The PATCH's span: a child of the held request's.
    assert wake.kind is SpanKind.CLIENT
    assert wake.parent is not None
    assert wake.parent.span_id == span.context.span_id
    assert dict(wake.attributes or {}) == {
        "zeroscale.route": "default/traced",
        "zeroscale.target": "Deployment default/web",
        "zeroscale.wake.replicas": 1,
        "zeroscale.wake.result": "patched",
    }
    # The cold start's histograms link to this trace.
    for metric in (
        "zeroscale_proxy_hold_duration_seconds",
        "zeroscale_proxy_cold_start_wake_to_ready_seconds",
        "zeroscale_proxy_cold_start_ready_to_first_byte_seconds",
    ):
        assert TRACE_ID in exemplar_trace(metric, "default/traced"), metric


async def test_a_request_held_after_the_wake_went_is_told_when_it_went(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    with traces() as on:
        async with running_proxy([wake_route("later")], kube=kube_client) as server:
            first = asyncio.create_task(request(server.port, get("/echo?n=1")))
            await until(lambda: web.scale.replicas == 1)
            second = asyncio.create_task(request(server.port, get("/echo?n=2")))
            await until(lambda: server.routes["default/later"].counts.held == 2)
            upstream = await Upstream(web.port).start()
            try:
                web.ready()
                await asyncio.gather(first, second)
            finally:
                await upstream.stop()
        spans = on.spans()
    earlier, later = sorted(spans, key=lambda span: span.start_time or 0)
    assert event(earlier, "zeroscale.wake.sent") == {}
    assert events(later)[:2] == ["zeroscale.held", "zeroscale.wake.sent"]
    assert event(later, "zeroscale.wake.sent")["zeroscale.wake.sent_seconds_ago"] > 0


async def test_a_wake_refused_as_stopped_by_hand_is_an_event_with_its_reason(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    web = ColdWeb(kube)
    kube.put(hpas_collection("default"), hpa("web", "web", "False"))  # the HPA did not put it at zero
    with traces() as on:
        async with running_proxy([wake_route("stopped")], kube=kube_client) as server:
            response = await request(server.port, get())
        (span,) = on.spans()
    assert response.status == 503
    assert web.scale.patches == []
    assert events(span) == ["zeroscale.held", "zeroscale.wake.not_sent"]
    not_sent = event(span, "zeroscale.wake.not_sent")
    assert not_sent["zeroscale.wake.reason"] == "stopped_by_hand"
    assert "was stopped by hand" in not_sent["zeroscale.wake.message"]
    assert span.attributes is not None
    assert (span.attributes["zeroscale.outcome"], span.attributes["http.response.status_code"]) == ("error", 503)
    assert span.status.status_code is StatusCode.ERROR
    assert on.spans("zeroscale.proxy.wake") == []


async def test_an_unsampled_caller_is_not_recorded_and_its_decision_goes_on(upstream: Upstream) -> None:
    with traces(1.0) as on:
        async with running_proxy([route("app", upstream.address)]) as server:
            response = await request(server.port, get(extra=f"traceparent: {UNSAMPLED}\r\n"))
        assert on.spans() == []
    assert response.status == 200
    (forwarded,) = traceparents(upstream.requests[0])
    version, trace_id, parent, flags = forwarded.split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "00")
    assert parent != CLIENT_SPAN  # the proxy's own (unrecorded) span


async def test_ratio_0_records_nothing_and_still_forwards_an_unsampled_traceparent(upstream: Upstream) -> None:
    """Our choice, as OpenTelemetry's propagators do: the hops after the proxy learn the trace is not sampled."""
    with traces(0.0) as on:
        async with running_proxy([route("app", upstream.address)]) as server:
            response = await request(server.port, get())
        assert on.spans() == []
    assert response.status == 200
    (forwarded,) = traceparents(upstream.requests[0])
    version, _, _, flags = forwarded.split("-")
    assert version == "00"
    assert not int(flags, 16) & 1  # not sampled


@pytest.mark.parametrize(
    "extra",
    [
        f"traceparent: {SAMPLED}\r\ntraceparent: 00-{'1' * 32}-{'2' * 16}-01\r\n",  # sent twice: none
        f"traceparent: {SAMPLED}\r\nTraceparent: {SAMPLED}\r\n",  # the same one twice: still none
        "traceparent: 00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01\r\n",  # no parent span
        "traceparent: ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n",  # a forbidden version
        f"traceparent: {SAMPLED[:-1]}\r\n",  # cut short
    ],
)
async def test_a_malformed_or_repeated_traceparent_starts_a_trace_and_is_not_forwarded(
    upstream: Upstream, extra: str
) -> None:
    with traces() as on:
        async with running_proxy([route("app", upstream.address)]) as server:
            response = await request(server.port, get(extra=extra))
        (span,) = on.spans()
    assert response.status == 200
    assert span.parent is None
    trace_id, span_id = ids(span)
    assert trace_id != TRACE_ID
    (forwarded,) = traceparents(upstream.requests[0])
    assert forwarded.startswith(f"00-{trace_id}-{span_id}-")


async def test_an_http2_client_and_an_h2c_upstream_carry_the_context() -> None:
    h2_upstream = await H2Upstream().start()
    try:
        upstream = {"address": h2_upstream.address, "protocol": "h2c"}
        with traces() as on:
            async with running_proxy([route("h2", h2_upstream.address, upstream=upstream)]) as server:
                head = [
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":authority", "app.example:8080"),
                    (":path", "/echo?x=1"),
                    ("traceparent", SAMPLED),
                    ("tracestate", "v=1"),
                ]
                response = await h2_request(server.port, head)
            (span,) = on.spans()
    finally:
        await h2_upstream.stop()
    assert response.header(":status") == "200"
    (seen,) = h2_upstream.requests
    trace_id, span_id = ids(span)
    assert trace_id == TRACE_ID
    assert [value for name, value in seen.headers if name == "traceparent"] == [f"00-{TRACE_ID}-{span_id}-01"]
    assert seen.header("tracestate") == "v=1"
    assert span.attributes is not None
    assert span.attributes["network.protocol.version"] == "2"
    assert span.attributes["server.address"] == "app.example"
    assert span.attributes["url.path"] == "/echo"
    assert events(span) == ["zeroscale.forwarded", "zeroscale.first_byte"]


async def test_a_hold_timeout_ends_the_span_once_as_a_504_error() -> None:
    routes = [route("late", f"127.0.0.1:{refused_port()}", limits={"hold_timeout": 0.3})]
    with traces() as on:
        async with running_proxy(routes) as server:
            response = await request(server.port, get())
        (span,) = on.spans()
    assert response.status == 504
    assert span.attributes is not None
    assert (span.attributes["zeroscale.outcome"], span.attributes["http.response.status_code"]) == ("error", 504)
    assert span.attributes["zeroscale.cold"] is True
    assert span.attributes["zeroscale.hold.seconds"] >= 0.25  # type: ignore[operator]
    assert span.status.status_code is StatusCode.ERROR
    assert "limits.hold_timeout" in (span.status.description or "")
    # Its probe route learns it is cold from the refused connect: retried, then held, told no wake comes from here.
    assert events(span) == ["zeroscale.retried", "zeroscale.held", "zeroscale.wake.not_sent"]
    assert event(span, "zeroscale.wake.not_sent")["zeroscale.wake.reason"] == "wake_none"


async def test_a_client_gone_while_held_ends_the_span_as_499() -> None:
    routes = [route("gone", f"127.0.0.1:{refused_port()}")]
    with traces() as on:
        async with running_proxy(routes) as server:
            counts = server.routes["default/gone"].counts
            pending = asyncio.create_task(request(server.port, get()))
            await until(lambda: counts.held == 1)
            pending.cancel()
            await until(lambda: counts.held == 0)
        (span,) = on.spans()
    assert span.attributes is not None
    assert (span.attributes["zeroscale.outcome"], span.attributes["http.response.status_code"]) == ("client_gone", 499)
    assert span.status.status_code is StatusCode.UNSET


async def test_a_never_wake_rule_answers_and_ends_the_span_there() -> None:
    rule = {"path": "/healthz", "when": "always", "response": {"status": 200, "body": "ok"}}
    routes = [route("ruled", f"127.0.0.1:{refused_port()}", never_wake=[rule])]
    with traces() as on:
        async with running_proxy(routes) as server:
            response = await request(server.port, get("/healthz"))
        (span,) = on.spans()
    assert (response.status, response.body) == (200, b"ok")
    assert span.attributes is not None
    assert (span.attributes["zeroscale.outcome"], span.attributes["http.response.status_code"]) == (
        "answered_here",
        200,
    )
    assert event(span, "zeroscale.cold_choice") == {"zeroscale.choice": "never_wake"}


async def test_tracing_off_forwards_the_clients_traceparent_as_before(upstream: Upstream) -> None:
    """Off, the proxy passes a client's trace headers on as any other (both of a repeated one); that it makes no span
    and enters no code of tracing's is tests/proxy/test_walk.py's budget (trace.py has none)."""
    assert tracing.TRACER is None
    twice = f"traceparent: {SAMPLED}\r\ntraceparent: {UNSAMPLED}\r\ntracestate: v=1\r\n"
    async with running_proxy([route("app", upstream.address)]) as server:
        response = await request(server.port, get(extra=twice))
    assert response.status == 200
    seen = upstream.requests[0]
    assert traceparents(seen) == [SAMPLED, UNSAMPLED]
    assert seen.headers["tracestate"] == "v=1"
