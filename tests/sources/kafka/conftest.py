"""Fixtures of the kafka tests: one real broker per session, clients to drive it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from cryptography.hazmat.primitives import serialization

from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, names, source_config


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
    return f"{request.node.name.replace('[', '-').replace(']', '')[:40]}-{next(names)}"


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


@pytest.fixture
async def lag_source(broker: KafkaBroker) -> AsyncIterator[KafkaLag]:
    source = KafkaLag(source_config(broker.bootstrap))
    yield source
    await source.close()
