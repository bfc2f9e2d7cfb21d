"""The `http` source never serves a sum it does not have: late, refusing, lying or flooding replicas (issue 20)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from prometheus_client import REGISTRY

from adapter.children import port_outside_ephemeral
from adapter.config.http import HTTPMetric, HTTPSource
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from adapter.sources.base import SourceError, SourceQuery
from adapter.sources.proxy_counts.source import ProxyCounts
from adapter.sources.proxy_counts.stream import Subscription
from tests.fixtures.grpc_servers import MakeCache, Routes, StartCounts, eventually, make_cache, start_counts, value
from tests.rpc.test_tls import NAME, mutual_tls, write_ca
from tests.security.grpc_standins import Sender, start_garbage_replica, start_scripted_replica

__all__ = ["make_cache", "start_counts"]  # fixtures used here


async def test_a_replica_answering_late_is_waited_for_not_left_out(
    make_cache: MakeCache, start_counts: StartCounts
) -> None:
    """Issue 20 item 2b: the sum waited only for the first replica to speak; the late one's 5 requests read 0."""
    quick = await start_counts(Routes("web"))  # holds nothing, speaks at once

    async def late(sender: Sender) -> None:
        await asyncio.sleep(0.5)
        sender.send(held=5)

    server, port = await start_scripted_replica(late)
    try:
        cache = await make_cache("late", stale_after=3, proxies=[f"127.0.0.1:{quick.port}", f"127.0.0.1:{port}"])
        assert await value(cache) == 5  # the first read: never the partial 0
    finally:
        await server.stop(None)


async def test_a_replica_refusing_the_stream_fails_the_metric(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """A replica that is up but refuses our subscription has counts we do not know: an error, not a smaller sum."""
    fine, full = Routes("web"), Routes("web")
    fine.add("web", held=2)
    full.add("web", held=7)
    open_one = await start_counts(fine)
    refusing = await start_counts(full, max_streams=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{refusing.port}") as squatter:
        stream = pb_grpc.PendingCountsStub(squatter).Watch(pb.WatchRequest())  # type: ignore[no-untyped-call]
        await stream.read()  # the only slot is taken
        cache = await make_cache(
            "refused", stale_after=0.6, proxies=[f"127.0.0.1:{open_one.port}", f"127.0.0.1:{refusing.port}"]
        )
        with pytest.raises(MetricUnavailable, match=r"refused the count stream: RESOURCE_EXHAUSTED"):
            await value(cache)
        await asyncio.sleep(1.0)  # past stale_after: a refusing replica is not "gone", it still fails the read
        with pytest.raises(MetricUnavailable, match="refused"):
            await value(cache)
        refused = REGISTRY.get_sample_value("zeroscale_proxy_subscriptions_refused_total", {"source": "refused"})
        assert refused is not None
        assert refused >= 1
        stream.cancel()
    await eventually(cache, 9, within=5, through_errors=True)  # the slot is free: both replicas count


@pytest.mark.parametrize(
    ("held", "words"),
    [(-5, "held=-5"), (2**63 - 1, f"held={2**63 - 1}"), (10**9 + 1, "held=1000000001")],
)
async def test_impossible_counts_fail_the_metric_and_name_the_replica(
    make_cache: MakeCache, start_counts: StartCounts, held: int, words: str
) -> None:
    """Issue 20 item 3: -5 beside 5 read 0; counts near 2**63 summed into nonsense."""
    honest = Routes("web")
    honest.add("web", held=5)
    good = await start_counts(honest)

    async def lie(sender: Sender) -> None:
        sender.send(held=held)

    server, port = await start_scripted_replica(lie)
    name = f"liar{abs(held) % 1000}"
    try:
        cache = await make_cache(name, proxies=[f"127.0.0.1:{good.port}", f"127.0.0.1:{port}"])
        with pytest.raises(MetricUnavailable, match=rf"127\.0\.0\.1:{port} sent {words}"):
            await value(cache)
        rejected = REGISTRY.get_sample_value("zeroscale_proxy_counts_rejected_total", {"source": name})
        assert rejected is not None
        assert rejected >= 1
    finally:
        await server.stop(None)


async def test_a_replica_that_sends_sane_counts_again_counts_again(
    make_cache: MakeCache, start_counts: StartCounts
) -> None:
    async def lie_then_mend(sender: Sender) -> None:
        sender.send(held=-1)
        await asyncio.sleep(0.5)
        sender.send(held=3)

    server, port = await start_scripted_replica(lie_then_mend)
    try:
        cache = await make_cache("mended", coalesce=0, proxies=[f"127.0.0.1:{port}"])
        await eventually(cache, 3, within=5, through_errors=True)
    finally:
        await server.stop(None)


FLOODS = 3000  # snapshots a flooding replica sends without pause: web held 1, 2, ... (none lifts it from 0)


@contextlib.asynccontextmanager
async def flooding_replica(name: str) -> AsyncIterator[tuple[ProxyCounts, SourceQuery]]:
    """A source (`coalesce` 50 ms) of one replica that floods; the caller watches the query it yields."""

    async def flood(sender: Sender) -> None:
        for held in range(1, FLOODS + 1):
            sender.send(held=held)
            if held % 100 == 0:
                await asyncio.sleep(0)  # let the stream carry them

    server, port = await start_scripted_replica(flood)
    config = HTTPSource(name=name, type="http", proxies=[f"127.0.0.1:{port}"], coalesce=0.05, stale_after=3)
    metric = HTTPMetric(name="http-requests-pending", type="http", source=name)
    _, query = Catalogue([metric]).resolve("http-requests-pending", "default", "route=web")
    source = ProxyCounts(config)
    try:
        yield source, query
    finally:
        await source.close()
        await server.stop(None)


async def the_newest_lands(source: ProxyCounts, query: SourceQuery) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        samples = await source.query(query)
        if samples[0].value == FLOODS:
            break
        await asyncio.sleep(0.01)
    assert samples[0].value == FLOODS  # the newest snapshot always lands


async def test_a_flooding_replica_is_applied_at_most_once_per_coalesce() -> None:
    """Issue 20 item 9: every update of a flooding replica went to the cache (82 % of a core)."""
    loop = asyncio.get_running_loop()
    changes: list[float] = []

    def changed(_: SourceQuery) -> None:
        changes.append(loop.time())

    async with flooding_replica("flood") as (source, query):
        source.set_change_listener(changed)
        source.watch(query)
        await the_newest_lands(source, query)
        spread = changes[-1] - changes[0]
        assert len(changes) <= spread / 0.05 + 3, f"{len(changes)} applications in {spread:.2f}s"
        coalesced = REGISTRY.get_sample_value("zeroscale_proxy_counts_coalesced_total", {"source": "flood"})
        assert coalesced is not None
        assert coalesced >= FLOODS - len(changes) - 1


async def test_a_flooding_replica_is_looked_at_for_an_edge_from_zero_once_per_coalesce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Looking for a route lifted from 0 walks every route of the message (4-5 times the cost of decoding it:
    445 us against 98 us for 1,000 routes); it was done for every message of the window (2,998 walks in
    0.17 s here), so a replica sending without pause cost the adapter that walk per message, not per window."""
    walks: list[float] = []
    rises = Subscription._rises

    def counted(self: Subscription, message: pb.CountsUpdate) -> bool:
        walks.append(asyncio.get_running_loop().time())
        return rises(self, message)

    monkeypatch.setattr(Subscription, "_rises", counted)
    async with flooding_replica("flood-edge") as (source, query):
        source.watch(query)
        await the_newest_lands(source, query)
        spread = walks[-1] - walks[0] if walks else 0.0
        assert len(walks) <= spread / 0.05 + 3, f"{len(walks)} walks in {spread:.2f}s"


async def test_a_replica_refusing_our_certificate_fails_the_metric(
    tmp_path: Path, make_cache: MakeCache, start_counts: StartCounts
) -> None:
    """A replica that turns our client certificate away at the handshake is up: its counts are unknown, not 0."""
    tls = mutual_tls(tmp_path)
    trusting, distrusting = Routes("web"), Routes("web")
    trusting.add("web", held=2)
    distrusting.add("web", held=7)
    good = await start_counts(trusting, tls=tls.server)
    strangers = write_ca(trustme.CA(), tmp_path / "strangers.pem")
    bad = await start_counts(distrusting, tls={**tls.server, "client_ca_file": strangers})
    proxies = [f"127.0.0.1:{good.port}", f"127.0.0.1:{bad.port}"]
    cache = await make_cache("distrusted", proxies=proxies, tls=tls.client, tls_server_name=NAME)
    with pytest.raises(MetricUnavailable, match=rf"127\.0\.0\.1:{bad.port} refused the count stream: UNAVAILABLE"):
        await value(cache)
    await asyncio.sleep(1.0)  # past stale_after: still refused, still an error, never the 2 of the other replica
    with pytest.raises(MetricUnavailable, match="refused the count stream"):
        await value(cache)


async def test_a_replica_answering_garbage_fails_the_metric(make_cache: MakeCache, start_counts: StartCounts) -> None:
    """Bytes that are no counts come from a live replica: an error, not a replica to leave out of the sum."""
    honest = Routes("web")
    honest.add("web", held=4)
    good = await start_counts(honest)
    server, port = await start_garbage_replica()
    try:
        cache = await make_cache("garbled", proxies=[f"127.0.0.1:{good.port}", f"127.0.0.1:{port}"])
        await asyncio.sleep(1.0)  # past stale_after: still no sum without it
        with pytest.raises(MetricUnavailable, match=rf"127\.0\.0\.1:{port} sent a message that is not a CountsUpdate"):
            await value(cache)
    finally:
        await server.stop(None)


def _source(name: str, proxies: list[str], **settings: Any) -> tuple[ProxyCounts, SourceQuery]:
    config = HTTPSource(name=name, type="http", proxies=proxies, stale_after=0.6, reconnect_max=0.2, **settings)
    metric = HTTPMetric(name="http-requests-pending", type="http", source=name)
    _, query = Catalogue([metric]).resolve("http-requests-pending", "default", "route=web")
    return ProxyCounts(config), query


async def _hold_silently(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stand-in for a hung replica: accepts the connection and never says a word."""
    await reader.read()
    writer.close()


@pytest.mark.parametrize("spoke_first", [True, False])
async def test_a_listed_replica_gone_silent_fails_the_sum(start_counts: StartCounts, spoke_first: bool) -> None:
    """Review finding 7: a listed replica holding 5 went silent (TCP accepted, nothing said); the sum read 0.

    Silent past stale_after while discovery still lists it is failing, whether it spoke before or never did.
    """
    quiet = Routes("web")
    quick = await start_counts(quiet)
    port = port_outside_ephemeral()  # listened on below by a server the test picks
    if spoke_first:
        holding = Routes("web")
        holding.add("web", held=5)
        replica = await start_counts(holding, port=port)
    else:
        replica = None
        hung = await asyncio.start_server(_hold_silently, "127.0.0.1", port)
    source, query = _source(f"silent{int(spoke_first)}", [f"127.0.0.1:{quick.port}", f"127.0.0.1:{port}"])
    try:
        if replica is not None:
            assert (await source.query(query))[0].value == 5
            await replica.stop()
            hung = await asyncio.start_server(_hold_silently, "127.0.0.1", port)
        for _ in range(3):  # well past stale_after (0.6 s): still an error, never the 0 of the other replica
            await asyncio.sleep(0.6)
            with pytest.raises(SourceError, match=rf"127\.0\.0\.1:{port} is listed but silent"):
                await source.query(query)
    finally:
        hung.close()
        await source.close()


def _snapshot(sender: Sender, *routes: tuple[str, int]) -> None:
    sender.sent += 1
    sender.last = pb.CountsUpdate(routes=[pb.RouteCounts(route=name, held=held) for name, held in routes])
    sender.queue.put_nowait(sender.last)


@pytest.mark.parametrize(
    ("routes", "words"),
    [
        (
            (("default/web", 5), ("default/web", 0)),
            "route 'default/web' twice in one snapshot",
        ),  # finding 10: it served 0
        (
            (*((f"default/r{n}", 1) for n in range(4)), ("default/web", 1)),
            r"5 routes in one snapshot \(more than max_routes, 4\)",
        ),
    ],
)
async def test_an_impossible_snapshot_fails_the_metric(routes: tuple[tuple[str, int], ...], words: str) -> None:
    """Review findings 10 and 9: a route listed twice, or more routes than max_routes, is no real proxy's snapshot."""

    async def send(sender: Sender) -> None:
        _snapshot(sender, *routes)

    server, port = await start_scripted_replica(send)
    source, query = _source("impossible", [f"127.0.0.1:{port}"], max_routes=4)
    try:
        with pytest.raises(SourceError, match=rf"127\.0\.0\.1:{port} sent {words}"):
            await source.query(query)
    finally:
        await source.close()
        await server.stop(None)


async def test_more_replicas_than_max_replicas_fails_the_metric(start_counts: StartCounts) -> None:
    """Review finding 11: every address discovery listed became a channel and a task, without bound."""
    servers = [await start_counts(Routes("web")) for _ in range(3)]
    source, query = _source("crowd", [f"127.0.0.1:{server.port}" for server in servers], max_replicas=2)
    try:
        with pytest.raises(SourceError, match=r"discovery lists 3 proxy replicas, more than max_replicas \(2\)"):
            await source.query(query)
        assert REGISTRY.get_sample_value("zeroscale_proxy_replicas_listed", {"source": "crowd"}) == 3
        assert REGISTRY.get_sample_value("zeroscale_proxy_subscriptions", {"source": "crowd"}) == 2
    finally:
        await source.close()
