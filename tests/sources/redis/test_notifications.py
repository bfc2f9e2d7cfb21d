"""Keyspace notifications refresh a series at once; without them on the server, the source polls and says so once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from adapter.config.redis import RedisMetric
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from tests.fixtures.redis_servers import RedisProcess
from tests.sources.redis.fixtures import Make, redis_metric

CacheFor = Callable[[RedisMetric, RedisProcess], MetricCache]


@pytest.fixture
async def cache_for(make_source: Make) -> AsyncIterator[CacheFor]:
    caches: list[MetricCache] = []

    def build(metric: RedisMetric, server: RedisProcess) -> MetricCache:
        source = make_source(url=f"redis://{server.address}", notifications=True)
        cache = MetricCache(Catalogue([metric]), {"q": source}, CacheConfig())
        caches.append(cache)
        return cache

    yield build
    for cache in caches:
        await cache.close()


async def subscribed(server: RedisProcess, key: str) -> None:
    channel = f"__keyspace@0__:{key}"
    deadline = time.monotonic() + 10
    while server.client().pubsub_numsub(channel)[0][1] < 1:
        assert time.monotonic() < deadline, f"nobody subscribed to {channel}"
        await asyncio.sleep(0.01)


async def test_push_onto_an_empty_list_is_visible_within_100ms(server: RedisProcess, cache_for: CacheFor) -> None:
    server.client().config_set("notify-keyspace-events", "Kl")
    metric = redis_metric("length", interval=600)  # polling alone would take ten minutes
    cache = cache_for(metric, server)
    assert (await cache.read(metric.name, "default", "key=jobs")).value == 0
    await subscribed(server, "jobs")

    pushed = time.monotonic()
    server.client().lpush("jobs", "job-1")
    while (await cache.read(metric.name, "default", "key=jobs")).value != 1:
        assert time.monotonic() - pushed < 5, "the push never reached the cache"
        await asyncio.sleep(0.002)
    assert time.monotonic() - pushed < 0.1


async def test_notifications_off_on_the_server_means_polling_said_once(
    server: RedisProcess, cache_for: CacheFor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="adapter.sources.redis.notify")
    metric = redis_metric("length", interval=0.3)
    cache = cache_for(metric, server)
    for key in ("a", "b", "c"):
        assert (await cache.read(metric.name, "default", f"key={key}")).value == 0
    server.client().rpush("a", 1, 2)
    deadline = time.monotonic() + 5
    while (await cache.read(metric.name, "default", "key=a")).value != 2:  # the interval refresh still works
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    warnings = [r for r in caplog.records if "does not publish keyspace events" in r.getMessage()]
    assert len(warnings) == 1
    assert server.client().pubsub_numsub("__keyspace@0__:a")[0][1] == 0
