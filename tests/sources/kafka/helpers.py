"""Helpers of the kafka tests: drive the broker as applications do, and read lag as the cache does."""

from __future__ import annotations

import asyncio
import itertools

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.protocol.admin import DeleteGroupsRequest
from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY

from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.metrics.catalogue import Catalogue
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import topic_gone, topic_served

# Names unique in the session: the broker is shared by every test.
names = itertools.count(1)
_METADATA_TRIES = 200  # 50 ms apart
_GROUP_COORDINATOR = 0  # FindCoordinator key type


class KafkaDriver:
    """Produces, commits and administers the way applications do, through aiokafka."""

    def __init__(self, bootstrap: str, admin: AIOKafkaAdminClient, producer: AIOKafkaProducer) -> None:
        self.bootstrap = bootstrap
        self.admin = admin
        self.producer = producer

    async def topic(self, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
        """Create the topic; back once the broker serves it, as a read made at once expects."""
        await self.admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=config or {})])
        await topic_served(self.producer.client, topic, partitions)

    async def partitions(self, topic: str, total: int) -> None:
        """Add partitions up to `total`; back once the broker serves them."""
        await self.admin.create_partitions({topic: NewPartitions(total_count=total)})
        await topic_served(self.producer.client, topic, total)

    async def delete_topic(self, topic: str) -> None:
        """Delete the topic; back once no broker answers for it, as a read made at once expects."""
        [described] = await self.admin.describe_topics([topic])
        await self.admin.delete_topics([topic])
        await topic_gone(self.producer.client, topic, len(described["partitions"]))

    async def produce(self, topic: str, counts: dict[int, int]) -> None:
        """`counts[p]` messages into partition p."""
        await self.known_to_producer(topic, set(counts))
        for partition, count in counts.items():
            for _ in range(count):
                await self.producer.send(topic, b"m", partition=partition)
        await self.producer.flush()

    async def known_to_producer(self, topic: str, partitions: set[int]) -> None:
        """Wait until the producer's metadata lists the partitions (just added ones included). The broker
        applies a CreatePartitions to its metadata after answering it, so one refresh may not show them
        yet: producing then failed with aiokafka's "Unrecognized partition" (the flaky tests under load)."""
        client = self.producer.client
        for _ in range(_METADATA_TRIES):
            if partitions <= (client.cluster.partitions_for_topic(topic) or set()):
                return
            await client.force_metadata_update()
            await asyncio.sleep(0.05)
        raise AssertionError(f"partitions {sorted(partitions)} of {topic} not in the broker's metadata after 10s")

    async def delete_group(self, group: str) -> None:
        """Delete the group (it has no members) as `kafka-consumer-groups --delete` does."""
        client = self.admin._client
        node = await client.coordinator_lookup(_GROUP_COORDINATOR, group)
        response = await client.send(node, DeleteGroupsRequest([group]))
        assert [error for _, error in response.results] == [0], response

    async def commit(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit offsets for the group as a consumer with manually assigned partitions does."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
            consumer.assign(list(tps))
            await consumer.commit(tps)
        finally:
            await consumer.stop()


def source_config(bootstrap: str, **settings: object) -> KafkaSource:
    """A source that reads afresh on every query unless a test asks otherwise."""
    ages: dict[str, object] = {"metadata_max_age": 0, "offsets_max_age": 0, "persistent_lag_window": 0}
    fields = ages | {"request_timeout": 5}
    return KafkaSource(type="kafka", name=f"kafka-{next(names)}", bootstrap_servers=[bootstrap], **fields | settings)


def lag_metric(source: str, **params: object) -> KafkaMetric:
    labels = {"group": {"required": True}, "topic": {}, "partition": {}}
    return KafkaMetric(type="kafka", name=f"lag-{next(names)}", source=source, labels=labels, **params)


async def read_lag(source: KafkaLag, metric: KafkaMetric, selector: str) -> int:
    """The value the cache would serve for one read of `selector`."""
    _key, query = Catalogue([metric]).resolve(metric.name, "default", selector)
    samples = await source.query(query)
    return int(sum(sample.value for sample in samples))


def exported(source: KafkaLag, topic: str) -> set[str]:
    """Which per-partition series of `topic` the source has on /metrics."""
    families = {
        "zeroscale_kafka_committed_offset": "committed",
        "zeroscale_kafka_log_start_offset": "start",
        "zeroscale_kafka_log_end_offset": "end",
        "zeroscale_kafka_partition_lag_messages": "lag",
    }
    return {
        families[sample.name]
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name in families and sample.labels["source"] == source.name and sample.labels["topic"] == topic
    }


def exported_count(source: str) -> int:
    """How many per-partition series the source has on /metrics."""
    families = ("committed_offset", "log_start_offset", "log_end_offset", "invalid_offset_partitions")
    names = {f"zeroscale_kafka_{family}" for family in families} | {"zeroscale_kafka_partition_lag_messages"}
    return sum(
        1
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name in names and sample.labels.get("source") == source
    )
