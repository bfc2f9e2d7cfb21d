"""The `http` source: counts pushed by every proxy replica, summed per route; silent listed replicas fail it."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest
from prometheus_client import REGISTRY

from adapter.children import port_outside_ephemeral
from adapter.config.http import HTTPMetric, HTTPSource
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.sources.proxy_counts.discovery import Discovery
from adapter.sources.proxy_counts.source import ProxyCounts
from tests.fixtures.grpc_servers import MakeCache, Routes, StartCounts, eventually, value
from tests.fixtures.netutil import refused_port


async def test_sums_every_replica_and_follows_pushes(make_cache: MakeCache, start_counts: StartCounts) -> None:
    first, second = Routes("web", "api"), Routes("web", "api")
    a, b = await start_counts(first), await start_counts(second)
    cache = await make_cache("sum", proxies=[f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
    await eventually(cache, 0)
    first.add("web", held=2)
    second.add("web", inflight=1)
    second.add("api", held=5)
    await eventually(cache, 3)  # the cache interval is 60 s: only the pushes can have done this
    await eventually(cache, 5, route="api")
    assert await cache.read("http-requests-pending", "default", "route in (web,api)") is not None
    assert (await cache.read("http-requests-pending", "default", "route in (web,api)")).value == 8
    first.add("web", held=-2)
    await eventually(cache, 1)


async def test_held_and_inflight_metrics(make_cache: MakeCache, start_counts: StartCounts) -> None:
    routes = Routes("web")
    server = await start_counts(routes)
    routes.add("web", held=2, inflight=3)
    held = await make_cache("held", count="held", proxies=[f"127.0.0.1:{server.port}"])
    inflight = await make_cache("inflight", count="inflight", proxies=[f"127.0.0.1:{server.port}"])
    await eventually(held, 2)
    await eventually(inflight, 3)


async def test_a_replica_leaving_discovery_keeps_its_counts_until_stale_after(
    start_counts: StartCounts, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = Routes("web"), Routes("web")
    a, b = await start_counts(first), await start_counts(second)
    first.add("web", held=1)
    second.add("web", held=4)
    listed = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
    # stale_after 3 s: longer than a loaded machine stalls the loop, which a still-listed replica's heartbeats (every
    # 0.2 s) must not seem silent through (with 0.6 s, a stall made `a` stale and the sum refused).
    config = HTTPSource(name="expiry", type="http", proxies=listed, stale_after=3, reconnect_max=0.2)
    metric = HTTPMetric(name="http-requests-pending", type="http", source="expiry")
    _, query = Catalogue([metric]).resolve("http-requests-pending", "default", "route=web")
    source = ProxyCounts(config)
    try:
        assert (await source.query(query))[0].value == 5
        dropped_before = REGISTRY.get_sample_value("zeroscale_proxy_replicas_dropped_total", {"source": "expiry"}) or 0
        stopped = time.monotonic()
        await b.stop()
        source._follow(listed[:1])  # what a new DNS answer without b does (a fixed list never changes)
        assert (await source.query(query))[0].value == 5  # a blip does not make 4 requests vanish
        while (await source.query(query))[0].value != 1:
            assert time.monotonic() - stopped < 15
            await asyncio.sleep(0.05)
        # Not at once: stale_after (3 s) after b's last message, sent up to a heartbeat (or a stall) before it stopped.
        assert time.monotonic() - stopped >= 1.5

        def dropped() -> float | None:
            return REGISTRY.get_sample_value("zeroscale_proxy_replicas_dropped_total", {"source": "expiry"})

        async with asyncio.timeout(10):  # the expiry pass runs every stale_after / 4 at most
            while dropped() != dropped_before + 1:  # noqa: ASYNC110 - a metric
                await asyncio.sleep(0.05)
        said = [record.getMessage() for record in caplog.records if f":{b.port}" in record.getMessage()]
        assert [line for line in said if "dropping" in line]
    finally:
        await source.close()


async def test_replica_coming_back_is_counted_again(make_cache: MakeCache, start_counts: StartCounts) -> None:
    routes = Routes("web")
    port = port_outside_ephemeral()  # restarted on it below: no outgoing connection may take it meanwhile
    a = await start_counts(routes, port=port)
    cache = await make_cache("comeback", proxies=[f"127.0.0.1:{port}"])
    routes.add("web", held=3)
    await eventually(cache, 3)
    await a.stop()
    await asyncio.sleep(0.8)  # dropped out: the source fails, and the cache serves its last good value (its rule)
    assert await value(cache) == 3
    routes.add("web", held=1)
    await start_counts(routes, port=port)
    await eventually(cache, 4, within=5)


async def test_an_unreachable_listed_replica_fails_the_metric(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """Its counts are unknown while it is listed: an error, never the partial 2 of the other replica."""
    routes = Routes("web")
    server = await start_counts(routes)
    routes.add("web", held=2)
    closed = refused_port()  # nothing listens there
    cache = await make_cache("partial", proxies=[f"127.0.0.1:{closed}", f"127.0.0.1:{server.port}"])
    with pytest.raises(MetricUnavailable, match=rf"127\.0\.0\.1:{closed} is listed but silent"):
        await value(cache)


async def test_no_replica_at_all_is_an_error_not_a_zero(make_cache: MakeCache) -> None:
    cache = await make_cache("none", proxies=[f"127.0.0.1:{refused_port()}"])
    with pytest.raises(MetricUnavailable, match=r"waiting for the first counts|listed but silent"):
        await value(cache)


async def test_a_route_no_replica_lists_reads_zero(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """A replica lists only the routes holding or forwarding something (adapter/proxy/counts_stream.py): an idle
    route, or one that does not exist, is in no snapshot, and reads 0 once every listed replica has spoken (each
    holds nothing for it), not an error."""
    routes = Routes("web")
    server = await start_counts(routes)
    cache = await make_cache("idle", proxies=[f"127.0.0.1:{server.port}"])
    routes.add("web", held=2)
    await eventually(cache, 2)
    routes.add("web", held=-2)  # back to 0: gone from the snapshot
    await eventually(cache, 0)
    assert await value(cache, "shop") == 0


async def test_each_namespace_reads_only_its_own_routes(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """Counts are keyed `<namespace>/<name>`: route=web read from team-a sums team-a/web over every replica, from
    team-b team-b/web; neither reads the other's, and a push to one moves only its own series."""
    first, second = Routes("team-a/web", "team-b/web"), Routes("team-a/web", "default/web")
    a, b = await start_counts(first), await start_counts(second)
    first.add("team-a/web", held=2)
    second.add("team-a/web", inflight=1)
    first.add("team-b/web", held=5)
    cache = await make_cache("tenancy", proxies=[f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
    await eventually(cache, 3, namespace="team-a")
    await eventually(cache, 5, namespace="team-b")
    await eventually(cache, 0)  # default/web holds nothing
    first.add("team-b/web", held=-5)
    second.add("default/web", held=4)
    await eventually(cache, 0, namespace="team-b")  # the cache interval is 60 s: pushed
    await eventually(cache, 4)
    assert await value(cache, namespace="team-a") == 3


async def test_many_idle_routes_fit_under_max_routes(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """A proxy of 2,000 routes sends the few holding something: under the source's max_routes (100 here)."""
    routes = Routes(*(f"r{index}" for index in range(2000)))
    server = await start_counts(routes)
    routes.add("r7", held=3)
    cache = await make_cache("many", proxies=[f"127.0.0.1:{server.port}"], max_routes=100)
    await eventually(cache, 3, route="r7")


async def test_replicas_found_by_dns(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """`localhost` stands for a headless Service: each address it resolves to is one replica."""
    routes = Routes("web")
    server = await start_counts(routes)
    routes.add("web", inflight=7)
    cache = await make_cache("dns", dns=f"localhost:{server.port}", resolve_interval=0.2)
    await eventually(cache, 7)


async def test_replicas_found_under_several_names(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """The cluster proxies' headless Service and the sidecars' each list replicas: the sum covers every address
    of every name. `localhost` and `127.0.0.1` stand for two Services; a name with no address (NXDOMAIN, what
    Kubernetes DNS answers for a headless Service without a ready pod: an app at zero) lists nothing, and does
    not fail the read."""
    proxies, sidecars = Routes("web"), Routes("web")
    a, b = await start_counts(proxies), await start_counts(sidecars)
    proxies.add("web", held=3)
    sidecars.add("web", inflight=4)
    names = [f"localhost:{a.port}", f"127.0.0.1:{b.port}", f"no-ready-pod.invalid:{refused_port()}"]
    cache = await make_cache("names", dns=names, resolve_interval=0.2)
    await eventually(cache, 7)
    # The same address under two names is one replica: counted once.
    doubled = await make_cache("doubled", dns=[f"localhost:{a.port}", f"127.0.0.1:{a.port}"], resolve_interval=0.2)
    await eventually(doubled, 3)


def test_each_name_answers_for_its_own_replicas() -> None:
    """A pod that went away leaves with its name's next answer; a failed lookup of one name keeps that name's
    replicas (they may well be there) and changes nothing of the others; a name that never answered is unknown."""
    config = HTTPSource(name="rule", type="http", dns=["proxies:9091", "sidecars:9091"])
    discovery = Discovery(config)
    assert discovery.unresolved == ["proxies:9091", "sidecars:9091"]
    discovery.record("proxies:9091", ["10.0.0.1:9091"])
    assert discovery.unresolved == ["sidecars:9091"]
    discovery.record("sidecars:9091", ["10.1.0.1:9091", "10.1.0.2:9091"])
    assert discovery.addresses() == ["10.0.0.1:9091", "10.1.0.1:9091", "10.1.0.2:9091"]
    discovery.record("sidecars:9091", ["10.1.0.2:9091", "10.1.0.3:9091"])  # a pod went, a new one came
    assert discovery.addresses() == ["10.0.0.1:9091", "10.1.0.2:9091", "10.1.0.3:9091"]
    discovery.record("proxies:9091", socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"))
    assert discovery.addresses() == ["10.0.0.1:9091", "10.1.0.2:9091", "10.1.0.3:9091"]
    discovery.record("sidecars:9091", socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert discovery.addresses() == ["10.0.0.1:9091"]  # scaled to zero: no sidecar left
    assert discovery.unresolved == []
    never = Discovery(config)
    never.record("proxies:9091", ["10.0.0.1:9091"])
    never.record("sidecars:9091", socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"))
    assert never.unresolved == ["sidecars:9091"]


def test_a_name_that_never_listed_a_replica_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    """NXDOMAIN reads as "no replica" (a headless Service with no ready pod), and a mistyped name reads the same:
    while it has never listed one, the log says which name to check; once it has, going empty is ordinary."""
    config = HTTPSource(name="typo", type="http", dns=["proxies:9091", "sidecras:9091"])
    discovery = Discovery(config)
    nxdomain = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    with caplog.at_level(logging.INFO, logger="adapter.sources.proxy_counts.discovery"):
        discovery.record("sidecras:9091", nxdomain)
        discovery.record("proxies:9091", ["10.0.0.1:9091"])
        discovery.record("proxies:9091", nxdomain)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "sidecras:9091 has listed no replica since start" in warned[0]
    assert "check the name" in warned[0]


async def test_lag_histogram_is_observed(make_cache: MakeCache, start_counts: StartCounts) -> None:
    routes = Routes("web")
    server = await start_counts(routes)
    cache = await make_cache("lag", proxies=[f"127.0.0.1:{server.port}"])
    await eventually(cache, 0)
    routes.add("web", held=1)
    await eventually(cache, 1)
    count = REGISTRY.get_sample_value("zeroscale_proxy_counts_message_lag_seconds_count", {"source": "lag"})
    assert count is not None
    assert count >= 2
    assert REGISTRY.get_sample_value("zeroscale_proxy_subscriptions", {"source": "lag"}) == 1
