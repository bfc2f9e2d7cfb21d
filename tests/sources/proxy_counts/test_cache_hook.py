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


async def test_the_edge_from_zero_is_read_at_once_after_the_first_counts(
    make_cache: MakeCache, start_counts: StartCounts
) -> None:
    """The proxy's first counts come while the first read waits for them: a pushed change, read right after.
    A request held right then must not wait for cache.push_interval (30 s here) to be seen."""
    routes = Routes("web")
    server = await start_counts(routes)
    cache = await make_cache("edge", proxies=[f"127.0.0.1:{server.port}"], cache_settings={"push_interval": 30})
    await eventually(cache, 0)
    routes.add("web", held=1)
    await eventually(cache, 1, within=10)  # far less than push_interval, even on a loaded machine


async def test_a_replica_s_edge_from_zero_is_applied_at_once_within_its_coalesce_window(
    make_cache: MakeCache, start_counts: StartCounts
) -> None:
    """The replica's first snapshot was just applied; the next message, within `coalesce` (30 s here) of it,
    lifts the route from 0: applied at once, not at the window's end."""
    routes = Routes("web")
    server = await start_counts(routes)
    source = {"proxies": [f"127.0.0.1:{server.port}"], "coalesce": 30, "stale_after": 60}  # silence: beyond the window
    cache = await make_cache("edge-replica", **source)
    await eventually(cache, 0)
    routes.add("web", held=1)
    await eventually(cache, 1, within=10)  # far less than the window, even on a loaded machine
