"""The proxy's spans (docs/how-to/tracing.md): a `zeroscale.proxy.request` per accepted request, its events as it is
held, woken for, forwarded and answered, the context it carries to the upstream, and the `zeroscale.proxy.wake`
around a Scale PATCH. The names are adapter/telemetry/tracing.py's (`the proxy`).

Nothing here runs while tracing is off: the client ends read `tracing.TRACER` once per request and keep the span on
the exchange (None: off), and every caller tests that first (docs/architecture.md#hot-skipped-calls).

Propagation (docs/protocols.md#tracing): the client's `traceparent` is continued only when it sent exactly one that
parses; one sent twice, or malformed, is none (the span starts a trace of its own). Either way the upstream gets the
proxy's span's `traceparent` (and `tracestate`), never the client's: also when the span is not sampled (ratio 0, or a
caller that did not sample), as OpenTelemetry's propagators do, so the hops after the proxy follow the same decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from time import monotonic
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from adapter.proxy.headers import without_named
from adapter.telemetry import tracing
from adapter.telemetry.tracing import (
    ATTEMPT,
    ATTEMPTS,
    CHOICE,
    COLD,
    COLD_CHOICE,
    ENDPOINT,
    ENDPOINT_READY,
    FIRST_BYTE,
    FORWARDED,
    HELD,
    HOLD_SECONDS,
    METHOD,
    MODE,
    OUTCOME,
    PROTOCOL_VERSION,
    PROXY_REQUEST,
    PROXY_WAKE,
    RETRIED,
    ROUTE,
    SERVER_ADDRESS,
    STATUS_CODE,
    TARGET,
    URL_PATH,
    WAKE_MESSAGE,
    WAKE_NOT_SENT,
    WAKE_REASON,
    WAKE_REPLICAS,
    WAKE_RESULT,
    WAKE_SENT,
    WAKE_SENT_AGO,
)

if TYPE_CHECKING:
    from adapter.proxy.h2wire import Fields
    from adapter.proxy.route import Route

# zeroscale.outcome's values.
FORWARDED_OUTCOME, ERROR, CLIENT_GONE, ANSWERED_HERE, TUNNEL = (
    "forwarded",
    "error",
    "client_gone",
    "answered_here",
    "tunnel",
)
_TRACE_FIELDS = frozenset({b"traceparent", b"tracestate"})


def parent(headers: Iterable[tuple[bytes, bytes]]) -> Context | None:
    """The client's context: its one `traceparent` (a second one makes it none) and its `tracestate` fields, combined
    as one list (RFC 9110 5.3)."""
    traceparent: bytes | None = None
    count = 0
    states: list[bytes] = []
    for name, value in headers:
        if len(name) in (10, 11):  # len("tracestate"), len("traceparent"): the others skip the lower()
            lower = name.lower()
            if lower == b"traceparent":
                count += 1
                traceparent = value
            elif lower == b"tracestate":
                states.append(value)
    if count != 1 or traceparent is None:
        return None
    state = b",".join(states).decode("latin-1") if states else None
    return tracing.parent_of(traceparent.decode("latin-1"), state)


def request_span(
    tracer: Tracer,
    method: bytes,
    target: bytes,
    host: bytes | None,
    version: str,
    route: Route,
    headers: Iterable[tuple[bytes, bytes]],
) -> Span:
    """The span of a request whose head was just read (`target`: its path and query; `host`: Host or :authority)."""
    attributes: dict[str, str | bool | int | float] = {
        METHOD: method.decode("latin-1"),
        URL_PATH: target.partition(b"?")[0].decode("utf-8", "replace"),
        PROTOCOL_VERSION: version,
        ROUTE: route.name,
        MODE: route.mode,
    }
    if host:
        attributes[SERVER_ADDRESS] = _without_port(host).decode("latin-1")
    return tracer.start_span(PROXY_REQUEST, context=parent(headers), kind=SpanKind.SERVER, attributes=attributes)


def _without_port(host: bytes) -> bytes:
    if host.startswith(b"["):  # an IPv6 literal: [::1]:8080
        return host[: host.find(b"]") + 1]
    return host.partition(b":")[0]


def h1_parts(parts: list[bytes], span: Span) -> None:
    """A request head's pieces (headers.read_request_head's, four per header line from the fifth) carry `span`'s
    context instead of the client's."""
    without_named(parts, 4, _TRACE_FIELDS)
    for name, value in tracing.headers_of(span).items():
        parts += (name.encode(), b": ", value.encode(), b"\r\n")


def h2_fields(head: Fields, span: Span) -> Fields:
    """An HTTP/2 request's forwarded fields carrying `span`'s context instead of the client's."""
    fields = [field for field in head if field[0] not in _TRACE_FIELDS]
    fields += [(name.encode(), value.encode()) for name, value in tracing.headers_of(span).items()]
    return fields


# --- events ---


def held(span: Span, cold: bool) -> None:
    span.add_event(HELD, {COLD: cold})


def wake_sent(span: Span, ago: float | None = None) -> None:
    """The wake went out now (`ago` None), or `ago` seconds before this request was held."""
    span.add_event(WAKE_SENT, None if ago is None else {WAKE_SENT_AGO: ago})


def wake_not_sent(span: Span, reason: str, message: str) -> None:
    span.add_event(WAKE_NOT_SENT, {WAKE_REASON: reason, WAKE_MESSAGE: message})


def endpoint_ready(span: Span) -> None:
    span.add_event(ENDPOINT_READY)


def forwarded(span: Span, endpoint: str, attempt: int) -> None:
    span.add_event(FORWARDED, {ENDPOINT: endpoint, ATTEMPT: attempt})


def first_byte(span: Span, status: int) -> None:
    span.set_attribute(STATUS_CODE, status)
    span.add_event(FIRST_BYTE, {STATUS_CODE: status})


def retried(span: Span) -> None:
    span.add_event(RETRIED)


def cold_choice(span: Span, choice: str) -> None:
    span.add_event(COLD_CHOICE, {CHOICE: choice})


def end(span: Span, outcome: str, code: int, message: str, cold: bool, hold: float, attempts: int) -> None:
    """The request's one ending: `code` the status the proxy answered (0: the upstream's, set at its first byte),
    `message` its error (""), `hold` the seconds it was held (0: never)."""
    attributes: dict[str, str | bool | int | float] = {OUTCOME: outcome, COLD: cold, ATTEMPTS: attempts}
    if code:
        attributes[STATUS_CODE] = code
    if hold:
        attributes[HOLD_SECONDS] = hold
    span.set_attributes(attributes)
    if outcome == ERROR:
        span.set_status(Status(StatusCode.ERROR, message))
    span.end()


def held_for(held_at: float, waited: float, queued: bool) -> float:
    """The seconds a request ending now was held: until now if it still is, else until it went upstream."""
    if not held_at:
        return 0.0
    return monotonic() - held_at if queued else waited


# --- the wake ---


def wake_span(parent_span: Span | None, route: str, target: str, replicas: int) -> Span | None:
    """The span of a Scale PATCH about to be sent (None: tracing is off), a child of `parent_span`."""
    tracer = tracing.TRACER
    if tracer is None:
        return None
    context = set_span_in_context(parent_span) if parent_span is not None else None
    attributes: dict[str, str | int] = {ROUTE: route, TARGET: target, WAKE_REPLICAS: replicas}
    return tracer.start_span(PROXY_WAKE, context=context, kind=SpanKind.CLIENT, attributes=attributes)


def wake_done(span: Span, result: str, failure: str = "") -> None:
    span.set_attribute(WAKE_RESULT, result)
    if failure:
        span.set_status(Status(StatusCode.ERROR, failure))
    span.end()
