"""Spans of the adapter's reads, from the request down to the source (names: adapter/telemetry/tracing.py).

How a read that serves many callers is traced (what a person sees: docs/how-to/tracing.md):

- A request (the HPA's list call, a KEDA call) that finds no fresh value starts the series' refresh: the refresh
  span is the request span's child. A request that waits for a refresh already in flight links to it (reason
  `joined`), and one served a cached value links to the refresh that read it (reason `served`), so a slow or an
  old answer leads to the read behind it either way.
- A refresh nobody waits for (the cache keeping a series warm, the Kafka poller) starts a trace of its own, sampled
  by `tracing.sample_ratio`: never the child of whatever context its task happened to inherit.
- A Redis pipeline or a Kafka round serves every refresh that asked in its window: its span is the child of the
  first sampled caller's span, and every other sampled caller links to it (`joined`). One read, one span, in the
  trace of the request that caused it; the others find it through their link.

The refresh's own task makes the refresh span current (`current_in_task`), and a source takes its caller from there
(`caller`): `Source.query` needs no extra argument.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from adapter.telemetry import tracing

SELECTOR_LIMIT = 256  # characters of a selector kept on a span (one may be 16 KB)


def describe_series(span: Span, metric: str, namespace: str, selector: str) -> None:
    span.set_attributes(
        {tracing.METRIC: metric, tracing.NAMESPACE: namespace, tracing.SELECTOR: selector[:SELECTOR_LIMIT]}
    )


def failed(span: Span, message: str) -> None:
    span.set_status(Status(StatusCode.ERROR, message))


def link(span: Span, to: SpanContext | None, reason: str) -> None:
    """Link `span` to a sampled span (a link into a trace no backend keeps would be dead)."""
    if to is not None and to.trace_flags.sampled:
        span.add_link(to, {tracing.LINK_REASON: reason})


def start(name: str, parent: Span | None, kind: SpanKind, attributes: Mapping[str, AttributeValue]) -> Span | None:
    """A span under `parent`, or the root of a trace of its own (sampled by the ratio) without one; None when off."""
    tracer = tracing.TRACER
    if tracer is None:
        return None
    context = trace.set_span_in_context(parent) if parent is not None else Context()
    return tracer.start_span(name, context=context, kind=kind, attributes=attributes)


@contextmanager
def current_in_task(span: Span) -> Iterator[None]:
    """Make `span` current in a task of its own (a refresh, a Kafka round), entered and left in it: a context
    attached in one task cannot be detached in another."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def caller() -> Span | None:
    """The span of the refresh asking a source for a read (see `current_in_task`); None when tracing is off or nothing
    traced asks."""
    if tracing.TRACER is None:
        return None
    span = trace.get_current_span()
    return span if span.get_span_context().is_valid else None


def start_shared(name: str, callers: Sequence[Span | None], attributes: Mapping[str, AttributeValue]) -> Span | None:
    """The span of one source read shared by `callers`: the child of the first sampled one (of the first one when
    none is: it is not recorded then either), a root when none is traced; the other sampled callers link to it."""
    if tracing.TRACER is None:
        return None
    traced = [c for c in callers if c is not None]
    sampled = [c for c in traced if c.get_span_context().trace_flags.sampled]
    parent = sampled[0] if sampled else traced[0] if traced else None
    span = start(name, parent, SpanKind.CLIENT, {**attributes, tracing.CALLERS: len(traced)})
    assert span is not None
    for other in sampled[1:]:
        link(other, span.get_span_context(), "joined")
    return span


def joined(span: Span | None, caller: Span | None) -> None:
    """`caller` waits for the shared read `span` already under way instead of asking for its own."""
    if span is not None and caller is not None:
        link(caller, span.get_span_context(), "joined")


@contextmanager
def step(name: str) -> Iterator[None]:
    """A child span of the current one (a shared read's step: its task made the read's span current)."""
    tracer = tracing.TRACER
    if tracer is None:
        yield
        return
    with tracer.start_as_current_span(name, kind=SpanKind.CLIENT):
        yield
