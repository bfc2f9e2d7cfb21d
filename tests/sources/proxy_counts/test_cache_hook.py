"""MetricCache.subscribe: the hook StreamIsActive hangs on, called after each successful refresh and only then."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from adapter.metrics.cache import Reading
from adapter.metrics.errors import MetricUnavailable
from tests.fixtures.grpc_servers import MakeCache, Routes, StartCounts, eventually
from tests.fixtures.netutil import refused_port

METRIC = "http-requests-pending"


async def test_listener_sees_each_refresh_until_unsubscribed(make_cache: MakeCache, start_counts: StartCounts) -> None:
    routes = Routes("web")
    server = await start_counts(routes)
    cache = await make_cache("hook", proxies=[f"127.0.0.1:{server.port}"])
    key, _ = cache.catalogue.resolve(METRIC, "default", "route=web")
    other, _ = cache.catalogue.resolve(METRIC, "default", "route=api")
    seen: list[Decimal] = []
    elsewhere: list[Reading] = []
    unsubscribe = cache.subscribe(key, lambda reading: seen.append(reading.value))
    cache.subscribe(other, elsewhere.append)
    await eventually(cache, 0)
    assert set(seen) == {0}  # the first read (and at most a pushed refresh racing it)
    routes.add("web", held=2)
    await eventually(cache, 2)  # pushed: the interval is 60 s
    assert seen[-1] == 2
    unsubscribe()
    told = len(seen)
    routes.add("web", held=1)
    await eventually(cache, 3)
    assert len(seen) == told
    assert elsewhere == []  # another series' subscriber is not told


async def test_failed_refresh_tells_no_one(make_cache: MakeCache) -> None:
    cache = await make_cache("hook-failing", proxies=[f"127.0.0.1:{refused_port()}"])
    key, _ = cache.catalogue.resolve(METRIC, "default", "route=web")
    seen: list[Reading] = []
    cache.subscribe(key, seen.append)
    with pytest.raises(MetricUnavailable):
        await cache.read(METRIC, "default", "route=web")
    await asyncio.sleep(0.1)
    assert seen == []
