"""Series of one group share a read, never each other's errors; every error names its group and topic;
a commit the log no longer holds is an invalid offset."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.admin import RecordsToDelete
from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.sources.base import SourceError
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, exported, lag_metric, read_lag, source_config

pytestmark = pytest.mark.kafka


@pytest.fixture
async def shared_source(broker: KafkaBroker) -> KafkaLag:
    """A source whose reads serve every series of a group for a minute, as in a cluster with many HPAs."""
    return KafkaLag(source_config(broker.bootstrap, metadata_max_age=60, offsets_max_age=60))


async def test_a_bad_selector_does_not_fail_a_good_one_of_the_same_group(
    kafka: KafkaDriver, shared_source: KafkaLag, name: str
) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 4, 1: 4})
    await kafka.commit(name, {(name, 0): 1, (name, 1): 2})
    metric = lag_metric(shared_source.name, allow_idle_consumers=True)
    try:
        # Asked together: one shared read for both series.
        bad, good = await asyncio.gather(
            read_lag(shared_source, metric, f"group={name},topic in ({name},nosuch-{name})"),
            read_lag(shared_source, metric, f"group={name},topic={name}"),
            return_exceptions=True,
        )
        assert good == 3 + 2
        assert isinstance(bad, SourceError)
        assert f"nosuch-{name}" in str(bad)
        # And again from the read both now share.
        assert await read_lag(shared_source, metric, f"group={name},topic={name}") == 5
        assert await read_lag(shared_source, metric, f"group={name}") == 5
    finally:
        await shared_source.close()


async def test_a_group_without_commits_is_named_after_a_read_that_named_a_topic(
    kafka: KafkaDriver, shared_source: KafkaLag, name: str
) -> None:
    await kafka.topic(name, 1)
    group = f"g7-{name}"
    metric = lag_metric(shared_source.name)
    try:
        assert await read_lag(shared_source, metric, f"group={group},topic={name}") == 1  # latest: one to start
        expected = f"group '{group}', every committed topic: the group has no committed offsets"
        with pytest.raises(SourceError, match=expected):
            await read_lag(shared_source, metric, f"group={group}")
    finally:
        await shared_source.close()


async def test_every_error_names_its_group_and_topic(kafka: KafkaDriver, lag_source: KafkaLag, name: str) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 1, 1: 1})
    await kafka.commit(name, {(name, 0): 1})
    metric = lag_metric(lag_source.name)
    with pytest.raises(SourceError) as no_partition:
        await read_lag(lag_source, metric, f"group={name},topic={name},partition=7")
    with pytest.raises(SourceError) as no_topic:
        await read_lag(lag_source, metric, f"group={name},topic=nosuch-{name}")
    for error in (no_partition.value, no_topic.value):
        assert f"group '{name}'" in str(error)
    assert f"topic '{name}'" in str(no_partition.value)
    assert f"topic 'nosuch-{name}'" in str(no_topic.value)


def invalid_offsets(source: KafkaLag, group: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value(
        "zeroscale_kafka_invalid_offset_partitions", {"source": source.name, "group": group, "reason": reason}
    )


@pytest.mark.parametrize(("policy", "expected"), [("earliest", 10), ("latest", 1)])
async def test_a_commit_below_the_log_start_is_an_invalid_offset(
    kafka: KafkaDriver, lag_source: KafkaLag, name: str, policy: str, expected: int
) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 210})
    await kafka.commit(name, {(name, 0): 50})
    # DeleteRecords moves the log start exactly as retention does: 160 records below the log start are gone.
    await kafka.admin.delete_records({TopicPartition(name, 0): RecordsToDelete(before_offset=200)})
    metric = lag_metric(lag_source.name, offset_reset_policy=policy, allow_idle_consumers=True)
    assert await read_lag(lag_source, metric, f"group={name},topic={name}") == expected
    assert invalid_offsets(lag_source, name, "below_log_start") == 1
    zero = lag_metric(lag_source.name, offset_reset_policy=policy, scale_to_zero_on_invalid_offset=True)
    assert await read_lag(lag_source, zero, f"group={name},topic={name}") == 0


async def test_a_value_is_stamped_with_the_time_of_its_read(kafka: KafkaDriver, broker: KafkaBroker, name: str) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 0})
    source = KafkaLag(source_config(broker.bootstrap, offsets_max_age=60))
    metric = lag_metric(source.name)
    cache = MetricCache(Catalogue([metric]), {source.name: source}, CacheConfig(interval=0.05))
    selector = f"group={name},topic={name}"
    try:
        first = await cache.read(metric.name, "default", selector)
        await kafka.produce(name, {0: 5})
        produced = time.time()
        await asyncio.sleep(0.3)  # several refreshes, all answered from the shared read
        later = await cache.read(metric.name, "default", selector)
        assert later.value == first.value == 2  # the produce is not in the value...
        assert later.timestamp <= produced  # ...so its timestamp is before the produce
    finally:
        await cache.close()
        await source.close()


async def test_a_topic_whose_offsets_cannot_be_read_fails_only_its_own_series(
    kafka: KafkaDriver, broker: KafkaBroker, name: str
) -> None:
    kept, dropped = f"{name}-kept", f"{name}-dropped"
    await kafka.topic(kept, 2)
    await kafka.topic(dropped, 1)
    await kafka.produce(kept, {0: 3, 1: 3})
    await kafka.produce(dropped, {0: 3})
    await kafka.commit(name, {(kept, 0): 1, (kept, 1): 1, (dropped, 0): 1})
    # The metadata is kept a minute: after the deletion the round still asks the broker for the dropped
    # topic's log offsets, and the broker refuses those partitions alone (UNKNOWN_TOPIC_OR_PARTITION).
    source = KafkaLag(source_config(broker.bootstrap, metadata_max_age=60))
    metric = lag_metric(source.name, allow_idle_consumers=True)
    try:
        assert await read_lag(source, metric, f"group={name}") == 2 + 2 + 2
        await kafka.delete_topic(dropped)
        good, bad = await asyncio.gather(
            read_lag(source, metric, f"group={name},topic={kept}"),
            read_lag(source, metric, f"group={name},topic={dropped}"),
            return_exceptions=True,
        )
        assert good == 4
        assert isinstance(bad, SourceError)
        assert f"group '{name}'" in str(bad)
        assert f"topic '{dropped}'" in str(bad)
        assert await read_lag(source, metric, f"group={name},topic={kept},partition=1") == 2
    finally:
        await source.close()


async def test_a_group_deleted_while_series_read_it(kafka: KafkaDriver, lag_source: KafkaLag, name: str) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 3, 1: 3})
    await kafka.commit(name, {(name, 0): 1, (name, 1): 3})
    latest = lag_metric(lag_source.name, allow_idle_consumers=True)
    earliest = lag_metric(lag_source.name, offset_reset_policy="earliest", allow_idle_consumers=True)
    assert await read_lag(lag_source, latest, f"group={name},topic={name}") == 2
    assert exported(lag_source, name) == {"committed", "start", "end", "lag"}
    await kafka.delete_group(name)
    # No commit any more: the consumers would reset, so each policy's invalid-offset value, never the old lag
    # and never a zero; a series without a topic has nothing to read and says so, naming the group.
    assert await read_lag(lag_source, latest, f"group={name},topic={name}") == 1 + 1
    assert await read_lag(lag_source, earliest, f"group={name},topic={name}") == 3 + 3
    with pytest.raises(SourceError, match=f"group '{name}', every committed topic: the group has no committed"):
        await read_lag(lag_source, latest, f"group={name}")
    assert "committed" not in exported(lag_source, name)  # the deleted commits leave /metrics
