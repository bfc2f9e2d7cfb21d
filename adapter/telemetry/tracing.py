"""OpenTelemetry traces of the proxy's requests and the adapter's answers: off by default (docs/how-to/tracing.md).

`start()` turns them on for the process (`zeroscale proxy` and `zeroscale serve` call it before serving); until then
`TRACER` is None, and every traced place tests that first, so tracing off costs one attribute read per request.
Spans are exported in batches by the SDK's own thread, never on the event loop; the queue is bounded
(`tracing.max_queued_spans`) and what it drops is counted.

Context crosses processes the W3C way only (`traceparent` and `tracestate`, docs/protocols.md#tracing): a caller's
trace is continued, with its sampling decision (parent-based), and every hop the proxy or the adapter makes carries
its own span's context onward.

The span, event and attribute names are an interface (people query by them, dashboards link to them): each is
registered here with what it means, and docs/reference/tracing.md is generated from these tables.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter

from adapter import __version__
from adapter.config.tracing import TracingConfig

log = logging.getLogger(__name__)

SPANS_TOTAL = Counter(
    "zeroscale_tracing_spans_total",
    "Spans ended while tracing is on, by outcome: exported, failed (the endpoint refused them or did not answer in "
    "tracing.export_timeout), dropped (more than tracing.max_queued_spans waited: raise it or lower "
    "tracing.sample_ratio)",
    ["outcome"],
)

# None: tracing is off. Set by start(), cleared by its stop function.
TRACER: Tracer | None = None

SPANS: dict[str, str] = {}
EVENTS: dict[str, str] = {}
ATTRIBUTES: dict[str, str] = {}


def _named(table: dict[str, str], name: str, description: str) -> str:
    if name in table:
        raise ValueError(f"{name} is registered twice")
    table[name] = description
    return name


def span(name: str, description: str) -> str:
    """A span name of the interface, with what the span covers."""
    return _named(SPANS, name, description)


def event(name: str, description: str) -> str:
    """A span event name of the interface, with when it is added."""
    return _named(EVENTS, name, description)


def attribute(name: str, description: str) -> str:
    """An attribute name of the interface (ours under `zeroscale.`, or OpenTelemetry's semantic conventions)."""
    return _named(ATTRIBUTES, name, description)


# --- both ---

METHOD = attribute("http.request.method", "The HTTP request's method")
STATUS_CODE = attribute(
    "http.response.status_code",
    "The HTTP status answered: to the proxy's client (the upstream's, or the proxy's own), or to the adapter's caller",
)

# --- the proxy ---

# Spans.
PROXY_REQUEST = span(
    "zeroscale.proxy.request",
    "One request the proxy accepted (SERVER), from its head read to its one ending: answered by the upstream, by the "
    "proxy's own error, by a cold-start choice, the client gone, or a tunnel opened; continues the client's "
    "traceparent",
)
PROXY_WAKE = span(
    "zeroscale.proxy.wake",
    "The PATCH of the scale subresource that wakes a route's target (CLIENT), a child of the span of the first sampled "
    "request held (or shown the waking page) in that cold start; none while no such request is sampled",
)
# Events of zeroscale.proxy.request, in the order they happen.
HELD = event("zeroscale.held", "The request was first held (queued): no endpoint usable (cold) or every one busy")
WAKE_SENT = event(
    "zeroscale.wake.sent",
    "The route's wake (a PATCH of its target's scale, whose result is its zeroscale.proxy.wake span) was sent while "
    "the request was held, once a PATCH; a request first held after this cold start's wake went has it at its hold, "
    "with zeroscale.wake.sent_seconds_ago",
)
WAKE_NOT_SENT = event(
    "zeroscale.wake.not_sent",
    "A wake attempt while the request was held sent nothing, or the route wakes nothing itself: "
    "zeroscale.wake.reason says why",
)
ENDPOINT_READY = event(
    "zeroscale.endpoint.ready", "The route's first endpoint became usable while the request was held"
)
FORWARDED = event(
    "zeroscale.forwarded",
    "The request was written to an endpoint (zeroscale.endpoint, zeroscale.attempt); again on a retry",
)
FIRST_BYTE = event("zeroscale.first_byte", "The upstream's response head came back (http.response.status_code)")
RETRIED = event(
    "zeroscale.retried",
    "The request goes back to the front of its route's queue, to be sent again: its connect failed, its connection "
    "broke before any response byte and it may be re-sent, or an HTTP/2 upstream refused its stream or had no room",
)
COLD_CHOICE = event(
    "zeroscale.cold_choice",
    "A cold-start choice took the request (zeroscale.choice: never_wake, waking_page, overflow_waking_page, fallback, "
    "overflow_fallback)",
)
# Attributes (OpenTelemetry's semantic conventions where one exists).
URL_PATH = attribute("url.path", "The request's path, without its query (which may carry secrets)")
SERVER_ADDRESS = attribute("server.address", "The host the client asked for (Host or :authority), without its port")
PROTOCOL_VERSION = attribute("network.protocol.version", "The client's HTTP: 1.1 or 2")
ROUTE = attribute("zeroscale.route", "The route that took the request: <namespace>/<name>")
MODE = attribute("zeroscale.mode", "How the route is served: proxy (in the path), activator or sidecar")
OUTCOME = attribute(
    "zeroscale.outcome",
    "How the request ended: forwarded (the upstream answered), error (the proxy's own error, or a response cut off), "
    "client_gone (499), answered_here (a never-wake rule or the waking page), tunnel (an upgrade opened)",
)
COLD = attribute("zeroscale.cold", "The request was held while no endpoint of its route was usable (a cold start)")
HOLD_SECONDS = attribute("zeroscale.hold.seconds", "How long the request was held before going upstream (or ending)")
ATTEMPTS = attribute("zeroscale.attempts", "How many times the request was written to an endpoint")
ENDPOINT = attribute("zeroscale.endpoint", "The endpoint a request was written to: host:port (on zeroscale.forwarded)")
ATTEMPT = attribute("zeroscale.attempt", "Which attempt this write is, from 1 (on zeroscale.forwarded)")
WAKE_SENT_AGO = attribute(
    "zeroscale.wake.sent_seconds_ago",
    "On zeroscale.wake.sent at a request's hold: how long before it was held the cold start's wake had gone out",
)
WAKE_REASON = attribute(
    "zeroscale.wake.reason",
    "Why no wake was sent (on zeroscale.wake.not_sent): a refusal of the HPA's intent (stopped_by_hand, no_hpa, "
    "ambiguous_hpas, hpas_unreadable, as zeroscale_proxy_wake_refusals_total), a failed attempt (hpas_unread, "
    "conflict: the Scale changed at each of 3 tries, api_error), or the route patching nothing itself (wake_hpa, "
    "wake_none, no_api_access: a route that would wake, in a proxy without Kubernetes API access)",
)
WAKE_MESSAGE = attribute(
    "zeroscale.wake.message", "What the proxy says of a wake not sent (on zeroscale.wake.not_sent)"
)
CHOICE = attribute("zeroscale.choice", "The cold-start choice taken (on zeroscale.cold_choice)")
TARGET = attribute(
    "zeroscale.target", "The workload a wake patches: <kind> <namespace>/<name> (on zeroscale.proxy.wake)"
)
WAKE_REPLICAS = attribute("zeroscale.wake.replicas", "The replicas the wake sets (on zeroscale.proxy.wake)")
WAKE_RESULT = attribute(
    "zeroscale.wake.result", "The PATCH's result: patched, conflict or error (on zeroscale.proxy.wake)"
)

# --- the adapter ---
# A request's span has the refresh it caused as a child and the source read that refresh made as a grandchild;
# a read shared with other callers (a Redis pipeline, a Kafka round) is the child of its first traced caller,
# and every other caller links to it. adapter/telemetry/reads.py holds the why.

ADAPTER_REQUEST = span(
    "zeroscale.adapter.external_metrics",
    "SERVER: one request to the external metrics API (the HPA's list call through the kube-apiserver, discovery); "
    "continues the caller's traceparent",
)
KEDA_METHODS = ("GetMetricSpec", "GetMetrics", "IsActive", "StreamIsActive", "StreamMetricSpec")
KEDA_CALLS = {
    method: span(f"zeroscale.adapter.keda.{method}", f"SERVER: one {method} call of KEDA's external scaler protocol")
    for method in KEDA_METHODS
}
CACHE_REFRESH = span(
    "zeroscale.cache.refresh",
    "One source query for one series: the child of the request that found no fresh value, else (the cache keeping "
    "the series warm) a trace of its own, sampled by tracing.sample_ratio; requests served its value link to it",
)
REDIS_PIPELINE = span(
    "zeroscale.redis.pipeline",
    "One batch of Redis commands (one pipeline per node) for every series read in the same batch_window, from the "
    "window's end (the wait for a free connection included)",
)
KAFKA_ROUND = span(
    "zeroscale.kafka.round",
    "One round of consumer-group offset reads for every group asked in the same event-loop turn, or polled",
)
KAFKA_OFFSET_FETCH = span("zeroscale.kafka.offset_fetch", "The round's OffsetFetch requests: committed offsets")
KAFKA_METADATA = span(
    "zeroscale.kafka.metadata", "The round's partition leaders (a Metadata request unless those kept are young enough)"
)
KAFKA_LIST_OFFSETS = span(
    "zeroscale.kafka.list_offsets", "The round's ListOffsets requests (log end and log start, per leader broker)"
)

KEDA_ACTIVITY_SENT = event(
    "zeroscale.keda.activity_sent", "StreamIsActive sent a changed activity (zeroscale.keda.active); heartbeats are not"
)

HTTP_ROUTE = attribute("http.route", "The route template answered, e.g. /apis/external.metrics.k8s.io/v1beta1/...")
RPC_SYSTEM = attribute("rpc.system", "grpc")
RPC_SERVICE = attribute("rpc.service", "The gRPC service called: externalscaler.ExternalScaler")
RPC_METHOD = attribute("rpc.method", "The gRPC method called")
RPC_STATUS = attribute("rpc.grpc.status_code", "The gRPC status code answered (0: OK)")
DB_SYSTEM = attribute("db.system.name", "redis, on a Redis pipeline")
DB_BATCH_SIZE = attribute("db.operation.batch.size", "Distinct commands in a Redis pipeline (duplicates merged)")
MESSAGING_SYSTEM = attribute("messaging.system", "kafka, on a Kafka round")
MESSAGING_GROUP = attribute("messaging.consumer.group.name", "The consumer group a round read, when it read one")
METRIC = attribute("zeroscale.metric.name", "The metric asked for, as asked (lower case from the kube-apiserver)")
NAMESPACE = attribute("zeroscale.metric.namespace", "The namespace the series is read for")
SELECTOR = attribute("zeroscale.metric.selector", "The label selector asked with, cut to 256 characters")
SERIES = attribute("zeroscale.metric.series", "Source series summed into the value answered")
CACHE_OUTCOME = attribute(
    "zeroscale.cache.outcome",
    "How the cache answered: hit (fresh value), stale (served, refreshed next tick), refreshed (waited for the "
    "refresh it started), joined (waited for one in flight), unavailable (503), delegated (another adapter's metric)",
)
VALUE_AGE = attribute("zeroscale.value.age_seconds", "Seconds since the source read the value answered")
SOURCE = attribute("zeroscale.source.name", "The source (an entry under sources:) read")
CALLERS = attribute(
    "zeroscale.read.callers", "Refreshes served by one shared source read (a pipeline, a round; 0: the Kafka poller's)"
)
KAFKA_GROUPS = attribute("zeroscale.kafka.groups", "Consumer groups read by a round")
KEDA_ACTIVE = attribute("zeroscale.keda.active", "The activity StreamIsActive sent")
LINK_REASON = attribute(
    "zeroscale.link.reason",
    "On a link: served (the refresh whose value a request was answered), joined (a refresh or source read in "
    "flight that this one waited for instead of reading itself)",
)


# --- turning tracing on ---


class _Bounded(SpanProcessor):
    """Hands ended sampled spans to the batch exporter while fewer than `limit` wait, and counts what it drops:
    the SDK's own queue would drop silently (a warning per span, no count)."""

    def __init__(self, batch: BatchSpanProcessor, limit: int) -> None:
        self._batch = batch
        self._limit = limit
        self._waiting = 0
        self._lock = threading.Lock()

    def exported(self, count: int) -> None:
        with self._lock:
            self._waiting -= count

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            full = self._waiting >= self._limit
            if not full:
                self._waiting += 1
        if full:
            SPANS_TOTAL.labels("dropped").inc()
            return
        self._batch.on_end(span)

    def shutdown(self) -> None:
        self._batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


class _Counted(SpanExporter):
    """The OTLP exporter, counting each batch's outcome (and giving its places back to `_Bounded`)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self.bounded: _Bounded | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:  # the SDK's worker thread would log and lose the count
            log.exception("exporting %d spans failed", len(spans))
            result = SpanExportResult.FAILURE
        outcome = "exported" if result is SpanExportResult.SUCCESS else "failed"
        SPANS_TOTAL.labels(outcome).inc(len(spans))
        if self.bounded is not None:
            self.bounded.exported(len(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def _disabled_by_environment() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def start(config: TracingConfig, service: str, exporter: SpanExporter | None = None) -> Callable[[], None] | None:
    """Turn tracing on for this process if `config` says so; returns the function that flushes what is queued and
    turns it off again (None: it stays off). `service`: the default `service.name`. `exporter` replaces the OTLP
    one (the SDK's in-memory exporter, in tests)."""
    global TRACER
    if not config.enabled or _disabled_by_environment():
        return None
    name = config.service_name or os.environ.get("OTEL_SERVICE_NAME") or service
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES; the service name and version given here win over it.
    resource = Resource.create({"service.name": name, "service.version": __version__})
    sampler = None if config.sample_ratio is None else ParentBased(TraceIdRatioBased(config.sample_ratio))
    # sampler=None: the SDK reads OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
    counted = _Counted(exporter or OTLPSpanExporter(endpoint=config.endpoint or None, timeout=config.export_timeout))
    # The SDK's queue is as large as ours, so it never drops: _Bounded decides, and counts.
    limit = config.max_queued_spans
    batch = BatchSpanProcessor(counted, max_queue_size=limit + 1, max_export_batch_size=min(512, limit))
    counted.bounded = bounded = _Bounded(batch, limit)
    provider.add_span_processor(bounded)
    TRACER = provider.get_tracer("zeroscale", __version__)
    log.info("tracing on: service %s, endpoint %s", name, config.endpoint or "from OTEL_EXPORTER_OTLP_*")

    def stop() -> None:
        global TRACER
        TRACER = None
        provider.shutdown()  # exports what is queued, within the exporter's deadline

    return stop


# --- context across processes (W3C Trace Context) ---

_PROPAGATOR = TraceContextTextMapPropagator()


def parent_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The caller's context from its `traceparent` (and `tracestate`); None when there is none or it is malformed
    (then the span starts a trace of its own)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _PROPAGATOR.extract(carrier)
    return context if context else None


def headers_of(span: Span) -> Mapping[str, str]:
    """The `traceparent` (and `tracestate`) that carry `span`'s context to the next hop."""
    context = span.get_span_context()
    headers = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"}
    state = context.trace_state.to_header()
    if state:
        headers["tracestate"] = state
    return headers


def exemplar_of(span: Span | None) -> dict[str, str] | None:
    """The OpenMetrics exemplar labels linking an observation to `span`'s trace, if that trace is sampled (a trace
    no backend has would be a dead link)."""
    if span is None:
        return None
    context = span.get_span_context()
    if not context.trace_flags.sampled:
        return None
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
