"""Thousands of series on a real Redis, asked as HPAs ask: reads follow the asks and go out in batches,
an idle series costs nothing, and a keyspace notification refreshes the one series it names."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from tests.fixtures.redis_servers import RedisProcess
from tests.metrics.test_cache import Clock
from tests.sources.redis.fixtures import Make, redis_metric
from tests.sources.redis.test_notifications import subscribed

SERIES = 2000
PERIOD = 15.0  # the HPA's default sync


def counter(name: str, source: str) -> float:
    return REGISTRY.get_sample_value(name, {"source": source}) or 0.0


def reads() -> float:
    return counter("zeroscale_source_query_duration_seconds_count", "q")


def round_trips() -> float:
    return counter("zeroscale_redis_round_trips_total", "q")


async def reaches(count: float) -> None:
    """Wait until the cache made `count` reads in all (the machine may be slow: up to 30 s)."""
    for _ in range(300):
        if reads() >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{reads():g} reads, {count:g} expected")


async def test_reads_follow_the_asks_in_batches_and_stop_with_them(server: RedisProcess, make_source: Make) -> None:
    client = server.client()
    pipe = client.pipeline(transaction=False)
    for i in range(SERIES):
        pipe.rpush(f"q{i}", *range(i % 5 + 1))
    pipe.execute()
    clock = Clock()
    # The series' interval is 2 s: a value's age counts real time since its read, which the fake clock
    # does not stop. The cache's default interval (0.05 s) makes the schedule re-read the fake clock often.
    metric = redis_metric("length", interval=2)
    config = CacheConfig(interval=0.05, max_series=SERIES, max_series_per_namespace=SERIES)
    cache = MetricCache(Catalogue([metric]), {"q": make_source(url=f"redis://{server.address}")}, config, clock=clock)
    selectors = [f"key=q{i}" for i in range(SERIES)]

    async def ask_all() -> None:
        readings = await asyncio.gather(*(cache.read(metric.name, "default", s) for s in selectors))
        assert [r.value for r in readings] == [i % 5 + 1 for i in range(SERIES)]

    try:
        start_reads, start_trips = reads(), round_trips()
        await ask_all()  # cold: every series read once, the reads batched
        assert reads() - start_reads == SERIES
        assert round_trips() - start_trips <= SERIES / 20
        asks, expected = 1, start_reads + SERIES
        for _ in range(4):
            clock.now += PERIOD - 0.01
            trips = round_trips()
            if asks >= 2:  # the asks have a period: the refresh for the next ask is made before it
                expected += SERIES
                await reaches(expected)
            await asyncio.sleep(0.3)
            assert reads() == expected
            await ask_all()
            asks += 1
            if asks == 2:  # the second asks find values older than interval: a refresh follows them
                expected += SERIES
                await reaches(expected)
            await asyncio.sleep(0.3)
            assert reads() == expected  # one read per ask
            assert round_trips() - trips <= SERIES / 20
        # The asks stop: the refreshes planned for the next asks happen once, then nothing.
        clock.now += PERIOD
        await reaches(expected + SERIES)
        for _ in range(3):
            clock.now += PERIOD
            await asyncio.sleep(0.3)
        assert reads() == expected + SERIES
    finally:
        await cache.close()


async def test_a_notification_refreshes_only_the_series_of_its_key(server: RedisProcess, make_source: Make) -> None:
    server.client().config_set("notify-keyspace-events", "Kl")
    metric = redis_metric("length", interval=600)  # only a push can refresh within the test
    config = CacheConfig(max_series=SERIES, max_series_per_namespace=SERIES)
    source = make_source(url=f"redis://{server.address}", notifications=True)
    cache = MetricCache(Catalogue([metric]), {"q": source}, config)
    try:
        await asyncio.gather(*(cache.read(metric.name, "default", f"key=n{i}") for i in range(SERIES)))
        await subscribed(server, f"n{SERIES - 1}")
        before = reads()
        server.client().lpush("n7", "job")
        for _ in range(500):
            if (await cache.read(metric.name, "default", "key=n7")).value == 1:
                break
            await asyncio.sleep(0.01)
        assert (await cache.read(metric.name, "default", "key=n7")).value == 1
        await asyncio.sleep(0.2)
        assert reads() - before == 1  # the other series, watched too, were not read
    finally:
        await cache.close()
