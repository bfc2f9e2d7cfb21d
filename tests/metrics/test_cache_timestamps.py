"""A value's timestamp and age count from when its source was read, not from when the answer arrived."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.sources.base import Sample, Source, SourceQuery
from tests.metrics.test_cache import ScriptedSource, metric


class SharedReadSource(Source):
    """A test stand-in for a source answering from a read shared between series, made `age` seconds ago."""

    def __init__(self, age: float) -> None:
        super().__init__()
        self.age = age

    async def query(self, query: SourceQuery) -> list[Sample]:
        return [Sample(Decimal(3), read_at=time.time() - self.age)]


async def test_a_value_from_an_earlier_read_carries_that_reads_time_and_age() -> None:
    source = SharedReadSource(age=30)
    cache = MetricCache(Catalogue([metric()]), {"q": source}, CacheConfig(interval=60, max_staleness=10))
    try:
        with pytest.raises(MetricUnavailable, match="older than max_staleness"):
            await cache.read("jobs", "default", "queue=a")  # read 30 s ago: already stale
        source.age = 2
        reading = await cache.read("jobs", "default", "queue=a")
        assert reading.timestamp == pytest.approx(time.time() - 2, abs=0.5)
    finally:
        await cache.close()


async def test_a_value_read_during_the_query_is_stamped_when_the_query_started() -> None:
    source = ScriptedSource()
    source.delay = 0.3  # the source answers late; what it read was there when it was asked
    cache = MetricCache(Catalogue([metric()]), {"q": source}, CacheConfig(interval=60))
    try:
        asked = time.time()
        reading = await cache.read("jobs", "default", "queue=a")
        assert asked <= reading.timestamp < asked + 0.2
    finally:
        await cache.close()
