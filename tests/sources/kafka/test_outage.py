"""The broker stops and comes back: the last good value while fresh, then 503 naming the cause,
then fresh values again without restarting the adapter. Uses its own broker (it stops it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, lag_metric, source_config

pytestmark = pytest.mark.kafka

STALENESS = 2.0


@pytest.fixture
async def own_broker(tmp_path: Path) -> AsyncIterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path / "kafka")
    await asyncio.to_thread(broker.start)
    yield broker
    await asyncio.to_thread(broker.stop)


async def driver(broker: KafkaBroker) -> KafkaDriver:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await admin.start()
    await producer.start()
    return KafkaDriver(broker.bootstrap, admin, producer)


async def test_stale_then_503_then_recovery(own_broker: KafkaBroker) -> None:
    kafka = await driver(own_broker)
    try:
        await kafka.topic("orders", 2)
        await kafka.produce("orders", {0: 5, 1: 5})
        await kafka.commit("workers", {("orders", 0): 3, ("orders", 1): 2})
    finally:
        await kafka.producer.stop()
        await kafka.admin.close()
    source = KafkaLag(source_config(own_broker.bootstrap, request_timeout=2))
    metric = lag_metric(source.name)
    cache = MetricCache(
        Catalogue([metric]),
        {source.name: source},
        CacheConfig(interval=0.2, max_staleness=STALENESS, query_timeout=5),
    )
    selector = "group=workers,topic=orders"
    try:
        assert (await cache.read(metric.name, "default", selector)).value == 5
        await asyncio.to_thread(own_broker.stop)

        # While the broker is away every read answers the last good value, never 0, until
        # max_staleness has passed; then 503 with the cause.
        deadline = time.monotonic() + 30
        while True:
            try:
                reading = await cache.read(metric.name, "default", selector)
            except MetricUnavailable as err:
                unavailable = err
                break
            assert reading.value == 5
            assert time.monotonic() < deadline, "no 503 within 30s of the broker stopping"
            await asyncio.sleep(0.1)
        assert unavailable.code == 503
        assert f"max_staleness {STALENESS:g}s" in unavailable.message
        assert f"cannot connect to 127.0.0.1:{own_broker.port}" in unavailable.message

        await asyncio.to_thread(own_broker.start)
        kafka = await driver(own_broker)
        try:
            await kafka.produce("orders", {1: 4})
        finally:
            await kafka.producer.stop()
            await kafka.admin.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                if (await cache.read(metric.name, "default", selector)).value == 9:
                    break
            except MetricUnavailable:
                pass
            assert time.monotonic() < deadline, "no fresh value within 30s of the broker's return"
            await asyncio.sleep(0.2)
    finally:
        await cache.close()
        await source.close()
