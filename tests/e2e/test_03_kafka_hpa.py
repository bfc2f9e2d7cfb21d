"""The real HPA controller scales a Deployment on Kafka consumer-group lag, with a real consumer committing."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from tests.e2e.cluster import (
    Kube,
    external_hpa,
    start_at_zero,
    wait_hpa_total,
    wait_replicas,
    wait_scaled_to_zero,
)
from tests.e2e.fixtures import Adapter, Timeline
from tests.fixtures.kafka_broker import KafkaBroker

NAMESPACE, NAME = "e2e-kafka", "consumer"
TOPIC, GROUP, PARTITIONS = "e2e-orders", "e2e-order-workers", 3


async def _create_topic(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, per_partition: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            for _ in range(per_partition):
                await producer.send(TOPIC, b"order", partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


async def _consume_all(bootstrap: str) -> int:
    """A group member reads every message there is and commits, as a worker does; returns how many."""
    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        read = 0
        while True:
            batches = await consumer.getmany(timeout_ms=1000)
            read += sum(len(records) for records in batches.values())
            await consumer.commit()
            if not batches:
                ends = await consumer.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
                committed = [await consumer.committed(tp) or 0 for tp in ends]
                if committed == list(ends.values()):
                    return read
    finally:
        await consumer.stop()


def test_lag_scales_up_consuming_scales_to_zero_and_lag_wakes_from_zero(
    adapter: Adapter, kube: Kube, kafka_broker: KafkaBroker, timeline: Timeline
) -> None:
    bootstrap = kafka_broker.bootstrap
    asyncio.run(_create_topic(bootstrap))
    assert asyncio.run(_consume_all(bootstrap)) == 0  # the group exists and has committed every partition
    kube.namespace(NAMESPACE)
    selector = {"group": GROUP, "topic": TOPIC}
    # 10 messages of lag per replica (AverageValue), minReplicas 0.
    start_at_zero(kube, external_hpa(NAMESPACE, NAME, "kafka-lag", selector, 10, 5), "the HPA reads no lag")

    asyncio.run(_produce(bootstrap, 10))  # lag 30
    up = wait_replicas(kube, NAMESPACE, NAME, 3)
    woke = wait_scaled_to_zero(kube, NAMESPACE, NAME, "False")
    # The status is written just after the scale: the HPA read exactly the lag Kafka has.
    wait_hpa_total(kube, NAMESPACE, NAME, 30, 10, "the HPA's status shows lag 30")

    assert asyncio.run(_consume_all(bootstrap)) == 30
    down = wait_replicas(kube, NAMESPACE, NAME, 0)
    slept = wait_scaled_to_zero(kube, NAMESPACE, NAME, "True")

    asyncio.run(_produce(bootstrap, 2))  # lag 6
    again = wait_replicas(kube, NAMESPACE, NAME, 1)
    timeline.record(
        f"kafka: 0->3 in {up:.1f} s (ScaledToZero=False/{woke}), 3->0 in {down:.1f} s (ScaledToZero=True/{slept}), "
        f"0->1 in {again:.1f} s (consumer committing)"
    )
