"""Watched groups are read every poll_interval and a change reaches the cache's series (the API value
and StreamIsActive, here through the adapter's own gRPC server) at once, not after the series interval;
series no longer read leave /metrics."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache, Reading
from adapter.metrics.catalogue import Catalogue
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.adapter_inprocess import start_serving
from tests.fixtures.grpc_servers import adapter_config, ref, scaler_stub
from tests.fixtures.kafka_broker import KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, exported, lag_metric, source_config

pytestmark = pytest.mark.kafka

# The defaults of offsets_max_age and metadata_max_age (source_config sets 0 for the other tests).
DEFAULT_AGES = {"offsets_max_age": 5.0, "metadata_max_age": 5.0, "persistent_lag_window": 5.0}


@pytest.mark.parametrize("exclude_persistent_lag", [False, True])
async def test_a_produce_reaches_the_value_and_the_subscribers_before_the_series_interval(
    kafka: KafkaDriver, broker: KafkaBroker, name: str, exclude_persistent_lag: bool
) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 2})
    source = KafkaLag(source_config(broker.bootstrap, **DEFAULT_AGES))
    # exclude_persistent_lag too: its series used to keep the interval (it compared commits read to read).
    metric = lag_metric(source.name, allow_idle_consumers=True, exclude_persistent_lag=exclude_persistent_lag)
    config = CacheConfig()  # interval 5s: without the source's push the lag shows after up to 5s + 5s
    cache = MetricCache(Catalogue([metric]), {source.name: source}, config)
    selector = f"group={name},topic={name}"
    key, _query = Catalogue([metric]).resolve(metric.name, "default", selector)
    pushed: asyncio.Queue[Reading] = asyncio.Queue()
    unsubscribe = cache.subscribe(key, pushed.put_nowait)
    try:
        assert (await cache.read(metric.name, "default", selector)).value == 0
        await kafka.produce(name, {0: 3})
        # Well inside the series interval: a value this early can only come from the push.
        async with asyncio.timeout(config.interval / 2):
            while (await pushed.get()).value != 3:
                pass
        assert (await cache.read(metric.name, "default", selector)).value == 3
    finally:
        unsubscribe()
        await cache.close()
        await source.close()


async def test_series_no_longer_read_leave_metrics(kafka: KafkaDriver, broker: KafkaBroker, name: str) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 1})
    source = KafkaLag(source_config(broker.bootstrap, **DEFAULT_AGES))
    metric = lag_metric(source.name)
    # unwatch_after: the cache looks at an idle series again only once it has passed (30 s by default).
    config = CacheConfig(interval=0.1, idle_ttl=0.3, unwatch_after=0.2)
    cache = MetricCache(Catalogue([metric]), {source.name: source}, config)
    try:
        assert (await cache.read(metric.name, "default", f"group={name}")).value == 1
        assert exported(source, name) == {"committed", "start", "end", "lag"}
        # idle_ttl passes, the cache drops the series, the source forgets the group.
        for _ in range(100):
            if not exported(source, name):
                break
            await asyncio.sleep(0.1)
        assert exported(source, name) == set()
    finally:
        await cache.close()
        await source.close()


async def test_a_produce_flips_stream_is_active_without_waiting_for_the_interval(
    kafka: KafkaDriver, broker: KafkaBroker, name: str
) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 2})
    source = {"name": f"events-{name}", "type": "kafka", "bootstrap_servers": [broker.bootstrap]}
    labels = {"group": {"required": True}, "topic": {}}
    metric = {"name": "kafka-lag", "type": "kafka", "source": source["name"], "labels": labels}
    config = adapter_config([source], [metric])  # the cache's interval is 60 s: only a push is quick
    serving = await start_serving(config)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serving.ports['scaler']}") as channel:
            call = scaler_stub(channel).StreamIsActive(ref("kafka-lag", f"group={name},topic={name}"))
            assert (await asyncio.wait_for(call.read(), 10)).result is False
            await kafka.produce(name, {0: 1})
            async with asyncio.timeout(10):  # far below the interval; heartbeats repeat the state meanwhile
                while not (await call.read()).result:
                    pass
            call.cancel()
    finally:
        serving.stop.set()
        assert await asyncio.wait_for(serving.task, 10) == 0


async def test_a_group_dropped_while_it_is_read_leaves_no_series(
    kafka: KafkaDriver, broker: KafkaBroker, name: str
) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 1})
    source = KafkaLag(source_config(broker.bootstrap, **DEFAULT_AGES))
    metric = lag_metric(source.name)
    _key, query = Catalogue([metric]).resolve(metric.name, "default", f"group={name}")
    try:
        await source.check()  # connected: the read below is in flight at once
        source.watch(query)  # as the cache does for a new series, then reads it...
        reading = asyncio.create_task(source.query(query))
        for _ in range(3):  # ...and drops it (idle) while that read is at the broker
            await asyncio.sleep(0)
        source.unwatch(query)
        assert sum(sample.value for sample in await reading) == 1
        assert exported(source, name) == set()
    finally:
        await source.close()


async def test_a_metric_s_partition_series_go_with_the_last_series_that_selects_them(
    kafka: KafkaDriver, broker: KafkaBroker, name: str
) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 3, 1: 3})
    await kafka.commit(name, {(name, 0): 1, (name, 1): 1})
    source = KafkaLag(source_config(broker.bootstrap, **DEFAULT_AGES))
    metric = lag_metric(source.name)
    catalogue = Catalogue([metric])
    _key, every = catalogue.resolve(metric.name, "default", f"group={name}")
    _key, first = catalogue.resolve(metric.name, "default", f"group={name},partition=0")
    try:
        for query in (every, first):  # as the cache does: watched, then read
            source.watch(query)
            await source.query(query)
        assert partition_lags(source, metric.name, name) == {"0": 2, "1": 2}
        # The series of every partition is dropped (idle): partition 1's lag is no longer computed, so its
        # series goes (it used to stay with its last value while any series of the metric read the group).
        source.unwatch(every)
        assert partition_lags(source, metric.name, name) == {"0": 2}
        source.unwatch(first)
        assert partition_lags(source, metric.name, name) == {}
    finally:
        await source.close()


def partition_lags(source: KafkaLag, metric: str, topic: str) -> dict[str, float]:
    return {
        sample.labels["partition"]: sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == "zeroscale_kafka_partition_lag_messages"
        and sample.labels["source"] == source.name
        and sample.labels["metric"] == metric
        and sample.labels["topic"] == topic
    }


def _broker_requests(source: str) -> float:
    return sum(
        REGISTRY.get_sample_value("zeroscale_kafka_requests_total", {"source": source, "api": api}) or 0
        for api in ("Metadata", "FindCoordinator", "OffsetFetch", "ListOffsets")
    )


async def test_a_group_is_polled_only_while_its_asker_is_around(
    kafka: KafkaDriver, broker: KafkaBroker, name: str
) -> None:
    """The source's poll rounds follow the asks: none once the asker has gone, at once when it is back."""
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 2})
    await kafka.commit(name, {(name, 0): 1})
    poll = 0.1
    source = KafkaLag(source_config(broker.bootstrap, poll_interval=poll))
    metric = lag_metric(source.name)
    cache = MetricCache(
        Catalogue([metric]), {source.name: source}, CacheConfig(interval=0.2, idle_ttl=3600, unwatch_after=0.3)
    )
    selector = f"group={name}"
    try:
        assert (await cache.read(metric.name, "default", selector)).value == 1
        await asyncio.sleep(0.6)  # one ask and no period: followed for unwatch_after, then not
        before = _broker_requests(source.name)
        await asyncio.sleep(5 * poll)
        assert _broker_requests(source.name) == before  # five poll rounds without a request
        assert cache.series_count() == 1  # still in the table until idle_ttl
        assert (await cache.read(metric.name, "default", selector)).value == 1
        after_ask = _broker_requests(source.name)
        await asyncio.sleep(0.3)
        assert _broker_requests(source.name) > after_ask  # polled again
    finally:
        await cache.close()
        await source.close()
