"""A Kafka read traced: the round that read the group's offsets, its requests, and the callers it served
(adapter/telemetry/reads.py), against the real broker."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import Span, SpanKind

from adapter.config.kafka import KafkaMetric
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.sources.kafka.source import KafkaLag
from adapter.telemetry import reads as spans
from adapter.telemetry import tracing
from tests.fixtures.traces import Traces, attributes, is_child, linked, one
from tests.sources.kafka.helpers import KafkaDriver, lag_metric

pytestmark = pytest.mark.kafka


async def test_one_round_for_two_groups_is_in_the_first_callers_trace_with_its_requests(
    kafka: KafkaDriver, lag_source: KafkaLag, name: str
) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 3, 1: 4})
    await kafka.commit(name, {(name, 0): 1, (name, 1): 1})
    metric = lag_metric(lag_source.name)
    cache = MetricCache(Catalogue([metric]), {lag_source.name: lag_source}, CacheConfig())
    with Traces() as traces:
        first, second = traces.span("first"), traces.span("second")
        try:
            values = await asyncio.gather(
                cache.read(metric.name, "default", f"group={name},topic={name}", first),
                cache.read(metric.name, "default", f"group=new-{name},topic={name}", second),
            )
        finally:
            first.end()
            second.end()
            await cache.close()
        assert [reading.value for reading in values] == [2 + 3, 1 + 1]  # committed; none committed: latest, 1 each
        spans = traces.ended()

    trace = first.get_span_context().trace_id
    mine = one(spans, tracing.CACHE_REFRESH, trace)
    other = one(spans, tracing.CACHE_REFRESH, second.get_span_context().trace_id)
    round_ = one(spans, tracing.KAFKA_ROUND, trace)
    assert is_child(mine, first)
    assert is_child(round_, mine)
    assert linked(other, "joined") == [round_.context.span_id]
    assert round_.kind is SpanKind.CLIENT
    assert {key: attributes(round_)[key] for key in (tracing.MESSAGING_SYSTEM, tracing.KAFKA_GROUPS)} == {
        tracing.MESSAGING_SYSTEM: "kafka",
        tracing.KAFKA_GROUPS: 2,
    }
    assert attributes(round_)[tracing.CALLERS] == 2
    for step in (tracing.KAFKA_OFFSET_FETCH, tracing.KAFKA_METADATA, tracing.KAFKA_LIST_OFFSETS):
        assert is_child(one(spans, step, trace), round_)

    # Above, the poller (started by the first read) opened the round and the refreshes joined it in flight; a
    # round that refreshes open themselves (groups nobody polls) is theirs alike.
    with Traces() as traces:
        callers = traces.span("first"), traces.span("second")
        await asyncio.gather(
            *(read_as(lag_source, metric, caller, f"group={i}-{name},topic={name}") for i, caller in enumerate(callers))
        )
        spans = traces.ended()
    round_ = one(spans, tracing.KAFKA_ROUND)
    assert is_child(round_, callers[0])
    assert attributes(round_)[tracing.CALLERS] == 2
    assert linked(one(spans, "second"), "joined") == [round_.context.span_id]


async def read_as(source: KafkaLag, metric: KafkaMetric, caller: Span, selector: str) -> None:
    """Query the source as the cache's refresh `caller` would (its span current in its own task)."""
    try:
        with spans.current_in_task(caller):
            await source.query(Catalogue([metric]).resolve(metric.name, "default", selector)[1])
    finally:
        caller.end()
