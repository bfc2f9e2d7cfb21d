"""Jaeger v2 for `zeroscale demo --with-jaeger` (and the tests' Jaeger, tests/fixtures/jaeger.py): its config, its
binary, and its traces read back as spans.

The binary is `cmd/jaeger` built by scripts/jaeger/build from its pinned Go module (once; cached in
~/.cache/zeroscale-jaeger). Jaeger v2 is an OpenTelemetry Collector distribution: the config is Jaeger's own
all-in-one (cmd/jaeger/internal/all-in-one.yaml of the module) cut down to the `otlp` receiver (HTTP and gRPC),
the `batch` processor, `jaeger_storage_exporter` into a `memory` backend, and the `jaeger_query` extension (its
HTTP API and its gRPC API, which cannot be turned off), every listener on loopback. Off: Jaeger's own metrics
(they would listen on :8888) and the tracing of its own queries (exported to localhost:4317, and retried for ~10 s
at exit). A build from the Go module has no UI pages (release builds embed them from the separate jaeger-ui
project): its query API is what there is to read.

The query API v3: `GET /api/v3/traces/{trace_id}` (404 until the trace is stored) and `GET /api/v3/traces?
query.service_name=S&query.start_time_min=T&query.start_time_max=T&query.num_traces=N` (all four required; RFC 3339
times; 404 when none is found) answer OTLP JSON (`{"result": {"resourceSpans": [...]}}`, hex ids). The v1 JSON
API (`/api/traces/{trace_id}`, `/api/traces?service=S`) is served too.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BUILD = Path(__file__).resolve().parents[2] / "scripts" / "jaeger" / "build"
HOST = "127.0.0.1"
# Traces kept in memory (Jaeger's own all-in-one default; the oldest go first): a full demo makes a few thousand.
MAX_TRACES = 100_000


@dataclass(frozen=True)
class JaegerPorts:
    otlp_http: int
    otlp_grpc: int
    query_http: int
    query_grpc: int


def jaeger_config(ports: JaegerPorts, max_traces: int = MAX_TRACES) -> dict[str, Any]:
    """Jaeger v2's all-in-one config, every listener on loopback at `ports`, the last `max_traces` kept in memory."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
        },
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": max_traces}}}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "enable_tracing": False,
                "http": {"endpoint": f"{HOST}:{ports.query_http}"},
                "grpc": {"endpoint": f"{HOST}:{ports.query_grpc}"},
            },
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "http": {"endpoint": f"{HOST}:{ports.otlp_http}"},
                    "grpc": {"endpoint": f"{HOST}:{ports.otlp_grpc}"},
                }
            }
        },
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


# The collector logs this once every extension and receiver listens (it exits at once if a bind fails, saying
# "address already in use").
READY_LINE = "Everything is ready"


def otlp_traces_endpoint(ports: JaegerPorts) -> str:
    """Where an OTLP/HTTP exporter sends spans (`tracing.endpoint`, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)."""
    return f"http://{HOST}:{ports.otlp_http}/v1/traces"


def query_url(ports: JaegerPorts) -> str:
    return f"http://{HOST}:{ports.query_http}"


@dataclass(frozen=True)
class Event:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """One span as Jaeger stored it (hex ids; `parent_span_id` is "" for a root; `events` in time order)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[Event, ...]


def _value(any_value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python (its one key names the type; int64s come as strings in OTLP JSON)."""
    for kind, value in any_value.items():
        if kind == "intValue":
            return int(value)
        if kind == "arrayValue":
            return [_value(item) for item in value.get("values", [])]
        if kind == "kvlistValue":
            return _attributes(value.get("values", []))
        return value
    return None  # an empty AnyValue


def _attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {pair["key"]: _value(pair.get("value", {})) for pair in pairs}


def _span(service: str, span: dict[str, Any]) -> Span:
    # In time order: Jaeger (v1.75, both APIs) answers a span's events in the reverse of the order they were sent.
    events = sorted(
        (
            Event(event["name"], int(event["timeUnixNano"]), _attributes(event.get("attributes", [])))
            for event in span.get("events", [])
        ),
        key=lambda event: event.time_ns,
    )
    return Span(
        service=service,
        name=span["name"],
        trace_id=span["traceId"],
        span_id=span["spanId"],
        parent_span_id=span.get("parentSpanId", ""),
        start_ns=int(span["startTimeUnixNano"]),
        end_ns=int(span["endTimeUnixNano"]),
        attributes=_attributes(span.get("attributes", [])),
        events=tuple(events),
    )


def spans_of(otlp_json: dict[str, Any]) -> list[Span]:
    """Every span of an OTLP JSON TracesData, with its resource's `service.name`."""
    spans: list[Span] = []
    for resource_spans in otlp_json.get("resourceSpans", []):
        service = _attributes(resource_spans.get("resource", {}).get("attributes", [])).get("service.name", "")
        for scope_spans in resource_spans.get("scopeSpans", []):
            spans.extend(_span(service, span) for span in scope_spans.get("spans", []))
    return spans


def query(url: str, path: str, **params: str) -> dict[str, Any] | None:
    """One answer of the query API at `url`; None for 404 (no such trace, or none found: not stored yet).
    Blocking: the demo calls it in a thread."""
    search = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{search}", timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
    return answer


def service_traces(url: str, service: str, since_s: float = 3600, limit: int = MAX_TRACES - 1) -> dict[str, Any] | None:
    """The OTLP JSON of the latest `limit` traces (Jaeger takes fewer than it keeps) with a span of `service` started
    in the last `since_s` seconds; by default all it has."""
    now = datetime.now(UTC)
    return query(
        url,
        "/api/v3/traces",
        **{
            "query.service_name": service,
            "query.start_time_min": (now - timedelta(seconds=since_s)).isoformat(),
            "query.start_time_max": (now + timedelta(seconds=60)).isoformat(),
            "query.num_traces": str(limit),  # required: 0 is refused ("search depth must be greater than 0")
        },
    )


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def trace_lines(spans: list[Span]) -> list[str]:
    """One trace as text, a span a line, children indented under their parent, each event at its offset from
    the start of the trace (a terminal's view of what Jaeger's UI would draw)."""
    if not spans:
        return []
    start = min(span.start_ns for span in spans)
    ids = {span.span_id for span in spans}
    children: dict[str, list[Span]] = {}
    for span in spans:  # a parent not in the trace (another process's, not sent here): shown as a root
        children.setdefault(span.parent_span_id if span.parent_span_id in ids else "", []).append(span)
    lines = [f"trace {spans[0].trace_id}: {_ms(max(span.end_ns for span in spans) - start)}"]

    def walk(parent: str, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda span: span.start_ns):
            events = ", ".join(f"{event.name} +{_ms(event.time_ns - start)}" for event in span.events)
            at, took = _ms(span.start_ns - start), _ms(span.end_ns - span.start_ns)
            line = f"{'  ' * depth}{span.service} {span.name}: +{at}, {took}"
            lines.append(f"{line} [{events}]" if events else line)
            walk(span.span_id, depth + 1)

    walk("", 1)
    return lines


def slowest_trace(spans: list[Span]) -> list[Span]:
    """The spans of the longest trace among `spans` (in the demo, a cold start: its requests wait for a replica)."""
    traces: dict[str, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)

    def length(trace: list[Span]) -> int:
        return max(span.end_ns for span in trace) - min(span.start_ns for span in trace)

    return max(traces.values(), key=length, default=[])


# The demo's processes, by their default `tracing.service_name`.
SERVICES = ("zeroscale-proxy", "zeroscale-adapter")


def save_traces(url: str, path: Path) -> list[str]:
    """Every trace of the demo's processes in the Jaeger at `url`, written to `path` (the query API's OTLP JSON
    answers by service; Jaeger stops with the demo), and what to say of them: how many, and the slowest trace of
    the proxy (a cold start) drawn as text. Blocking: the demo calls it in a thread."""
    answers = {service: service_traces(url, service) for service in SERVICES}
    path.write_text(json.dumps(answers, indent=1) + "\n")
    spans = {service: spans_of(answer["result"]) if answer else [] for service, answer in answers.items()}
    counts = ", ".join(f"{service} {len({span.trace_id for span in spans[service]})}" for service in SERVICES)
    lines = [f"traces in Jaeger: {counts} (saved in {path})"]
    slowest = slowest_trace(spans[SERVICES[0]])
    if slowest:
        lines += ["the slowest request's trace (a cold start):", *trace_lines(slowest)]
    return lines
