"""Our per-partition lag equals the LAG column of Kafka's own consumer-groups tool."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from adapter.sources.kafka import KafkaLag
from tests.kafka.broker import KafkaBroker, describe_groups
from tests.kafka.helpers import KafkaDriver, lag_metric, read_lag

pytestmark = pytest.mark.kafka


async def test_partition_lag_matches_kafka_consumer_groups(
    kafka: KafkaDriver, broker: KafkaBroker, lag_source: KafkaLag, name: str
) -> None:
    topics = {f"{name}-a": 3, f"{name}-b": 4}
    commits: dict[tuple[str, int], int] = {}
    for index, (topic, partitions) in enumerate(topics.items()):
        await kafka.topic(topic, partitions)
        await kafka.produce(topic, {p: 2 + 3 * p + index for p in range(partitions)})
        commits |= {(topic, p): p % 3 for p in range(partitions)}
    await kafka.commit(name, commits)

    metric = lag_metric(lag_source.name, allow_idle_consumers=True)
    total = await read_lag(lag_source, metric, f"group={name}")
    theirs = await asyncio.to_thread(describe_groups, broker.bootstrap, [name])

    assert set(theirs) == {(name, topic, p) for topic, count in topics.items() for p in range(count)}
    ours = {
        key: REGISTRY.get_sample_value(
            "zeroscale_kafka_partition_lag_messages",
            {
                "source": lag_source.name,
                "metric": metric.name,
                "group": name,
                "topic": key[1],
                "partition": str(key[2]),
            },
        )
        for key in theirs
    }
    assert ours == theirs
    assert total == sum(lag for lag in theirs.values() if lag is not None)
