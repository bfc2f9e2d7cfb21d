"""Fixtures of the kafka tests: one real broker per session, clients to drive it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition
from cryptography.hazmat.primitives import serialization

from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.metrics.catalogue import Catalogue
from adapter.sources.kafka import KafkaLag
from tests.kafka.broker import KafkaBroker

_names = itertools.count(1)


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, the broker's certificate (server.pem, PKCS#8 as Kafka wants) and a client's (client.pem/.key)."""
    directory = tmp_path_factory.mktemp("kafka-tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    encoding, key_format = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    pkcs8 = key.private_bytes(encoding, key_format, serialization.NoEncryption())
    (directory / "server.pem").write_bytes(pkcs8 + b"".join(blob.bytes() for blob in server.cert_chain_pems))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    client = ca.issue_cert("zeroscale-client")
    client.private_key_pem.write_to_path(str(directory / "client.key"))
    client.cert_chain_pems[0].write_to_path(str(directory / "client.pem"))
    return directory


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory, tls_dir: Path) -> Iterator[KafkaBroker]:
    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka"), tls_dir)
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A topic or group name unique in the session (the broker is shared)."""
    return f"{request.node.name.replace('[', '-').replace(']', '')[:40]}-{next(_names)}"


class KafkaDriver:
    """Produces, commits and administers the way applications do, through aiokafka."""

    def __init__(self, bootstrap: str, admin: AIOKafkaAdminClient, producer: AIOKafkaProducer) -> None:
        self.bootstrap = bootstrap
        self.admin = admin
        self.producer = producer

    async def topic(self, topic: str, partitions: int) -> None:
        await self.admin.create_topics([NewTopic(topic, partitions, 1)])

    async def produce(self, topic: str, counts: dict[int, int]) -> None:
        """`counts[p]` messages into partition p."""
        known = self.producer.client.cluster.partitions_for_topic(topic) or set()
        if not set(counts) <= known:  # partitions just added: the producer learns of them first
            await self.producer.client.force_metadata_update()
        for partition, count in counts.items():
            for _ in range(count):
                await self.producer.send(topic, b"m", partition=partition)
        await self.producer.flush()

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


@pytest.fixture
async def kafka(broker: KafkaBroker) -> AsyncIterator[KafkaDriver]:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    await admin.start()
    await producer.start()
    try:
        yield KafkaDriver(broker.bootstrap, admin, producer)
    finally:
        await producer.stop()
        await admin.close()


def source_config(bootstrap: str, **settings: object) -> KafkaSource:
    """A source that reads afresh on every query unless a test asks otherwise."""
    fields: dict[str, object] = {"metadata_max_age": 0, "offsets_max_age": 0, "request_timeout": 5}
    return KafkaSource(type="kafka", name=f"kafka-{next(_names)}", bootstrap_servers=[bootstrap], **fields | settings)


def lag_metric(source: str, **params: object) -> KafkaMetric:
    labels = {"group": {"required": True}, "topic": {}, "partition": {}}
    return KafkaMetric(type="kafka", name=f"lag-{next(_names)}", source=source, labels=labels, **params)


async def read_lag(source: KafkaLag, metric: KafkaMetric, selector: str) -> int:
    """The value the cache would serve for one read of `selector`."""
    _key, query = Catalogue([metric]).resolve(metric.name, "default", selector)
    samples = await source.query(query)
    return int(sum(sample.value for sample in samples))


@pytest.fixture
async def lag_source(broker: KafkaBroker) -> AsyncIterator[KafkaLag]:
    source = KafkaLag(source_config(broker.bootstrap))
    yield source
    await source.close()
