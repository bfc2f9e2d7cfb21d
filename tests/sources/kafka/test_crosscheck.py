"""Our view of every partition against Kafka's own consumer-groups tool, on a scenario with partial
commits, a commit retention deleted the records of, a commit past the log end and an added partition.

The tool reports, per committed partition, the commit, the log end and LAG = end - commit. Where the
commit is valid our committed offset, log end and lag equal those columns. Where it is not (below the
log start, beyond the log end, or absent: the tool lists only committed partitions) the consumer will
reset, and our lag follows the metric's policy (docs/how-to/kafka.md: where Zeroscale differs from KEDA), not
the tool's LAG.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import RecordsToDelete
from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY

from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker, describe_groups
from tests.sources.kafka.helpers import KafkaDriver, lag_metric, read_lag

pytestmark = pytest.mark.kafka


def ours(family: str, labels: dict[str, str]) -> int | None:
    value = REGISTRY.get_sample_value(f"zeroscale_kafka_{family}", labels)
    return None if value is None else int(value)


async def test_every_partition_matches_kafka_consumer_groups(
    kafka: KafkaDriver, broker: KafkaBroker, lag_source: KafkaLag, name: str
) -> None:
    uneven, retained, past = f"{name}-Uneven.A", f"{name}-retained", f"{name}-past"
    await kafka.topic(uneven, 3)
    await kafka.topic(retained, 1)
    await kafka.topic(past, 2)
    await kafka.produce(uneven, {0: 5, 1: 6, 2: 7})
    await kafka.produce(retained, {0: 20})
    await kafka.produce(past, {0: 3, 1: 3})
    # Partial: partition 1 of `uneven` never committed. `past` 0: beyond its log end (a recreated topic).
    await kafka.commit(name, {(uneven, 0): 2, (uneven, 2): 7, (retained, 0): 5, (past, 0): 10, (past, 1): 1})
    # Retention (DeleteRecords moves the log start the same way) removes the records the commit points at.
    await kafka.admin.delete_records({TopicPartition(retained, 0): RecordsToDelete(before_offset=15)})
    await kafka.partitions(uneven, 5)
    await kafka.produce(uneven, {3: 4, 4: 2})
    await kafka.commit(name, {(uneven, 3): 1})

    earliest = lag_metric(lag_source.name, offset_reset_policy="earliest", allow_idle_consumers=True)
    latest = lag_metric(lag_source.name, allow_idle_consumers=True)
    totals = {metric.name: await read_lag(lag_source, metric, f"group={name}") for metric in (earliest, latest)}
    theirs = await asyncio.to_thread(describe_groups, broker.bootstrap, [name])

    partitions = {uneven: 5, retained: 1, past: 2}
    every = {(name, topic, p) for topic, count in partitions.items() for p in range(count)}
    uncommitted = {(name, uneven, 1), (name, uneven, 4)}
    assert set(theirs) == every - uncommitted
    expected = {metric.name: 0 for metric in (earliest, latest)}
    for key in sorted(every):
        _, topic, partition = key
        where = {"source": lag_source.name, "topic": topic, "partition": str(partition)}
        committed = ours("committed_offset", where | {"group": name})
        start, end = ours("log_start_offset", where), ours("log_end_offset", where)
        assert start is not None
        assert end is not None
        lags = {
            m.name: ours("partition_lag_messages", where | {"group": name, "metric": m.name})
            for m in (earliest, latest)
        }
        tool = theirs.get(key)
        if tool is None:
            assert committed is None
        else:
            assert (committed, end) == (tool.current_offset, tool.log_end_offset), key
        if committed is not None and start <= committed <= end:
            assert tool is not None, key
            assert lags == dict.fromkeys(lags, tool.lag), key
        else:  # the consumer resets: earliest to the log start, latest to the end (1: one consumer starts)
            assert lags == {earliest.name: end - start, latest.name: 1}, key
        for metric, lag in lags.items():
            assert lag is not None
            expected[metric] += lag
    assert totals == expected
    # The documented differences, seen on the broker: the tool counts records retention removed (15 - 5)
    # and a negative lag past the end.
    assert theirs[(name, retained, 0)].lag == 20 - 5
    assert theirs[(name, past, 0)].lag == 3 - 10
    invalid = {
        reason: ours("invalid_offset_partitions", {"source": lag_source.name, "group": name, "reason": reason})
        for reason in ("no_commit", "below_log_start", "beyond_log_end")
    }
    assert invalid == {"no_commit": 2, "below_log_start": 1, "beyond_log_end": 1}
