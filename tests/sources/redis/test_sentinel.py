"""Sentinel mode: a master, a replica and three Sentinels; the master dies mid-test and the metric keeps answering."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.sources.base import SourceError
from tests.fixtures.redis_servers import RedisProcess, wait_until
from tests.sources.redis.fixtures import Make, query_for, redis_metric

MASTER_NAME = "queues"


class SentinelSet:
    def __init__(self, workdir: Path) -> None:
        self.master = RedisProcess(workdir, []).start()
        self.replica = RedisProcess(workdir, [f"replicaof 127.0.0.1 {self.master.port}"]).start()
        self.sentinels = [
            RedisProcess(
                workdir,
                [
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} 500",
                    f"sentinel failover-timeout {MASTER_NAME} 5000",
                ],
                sentinel=True,
            ).start()
            for _ in range(3)
        ]

    def addresses(self) -> list[str]:
        return [s.address for s in self.sentinels]

    def ready(self) -> bool:
        """Every Sentinel knows the replica and the two other Sentinels, so a failover can be elected."""
        for sentinel in self.sentinels:
            client: Any = sentinel.client()
            if len(client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)) != 1:
                return False
            if len(client.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)) != 2:
                return False
        return bool(self.replica.client().info("replication")["master_link_status"] == "up")

    def current_master_port(self) -> int:
        client: Any = self.sentinels[0].client()
        _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return int(port)

    def stop(self) -> None:
        for process in [*self.sentinels, self.replica, self.master]:
            process.stop()


@pytest.fixture(scope="module")
def sentinel_set(redis_dir: Path) -> Iterator[SentinelSet]:
    deployment = SentinelSet(redis_dir / "sentinel")  # a directory per port below it
    try:
        wait_until(deployment.ready, timeout=30)
        yield deployment
    finally:
        deployment.stop()


async def test_reads_the_master_found_by_sentinel(sentinel_set: SentinelSet, make_source: Make) -> None:
    master = sentinel_set.master.client()
    master.delete("jobs")
    master.rpush("jobs", "a", "b")
    source = make_source(sentinel={"addresses": sentinel_set.addresses(), "master_name": MASTER_NAME})
    samples = await source.query(query_for(redis_metric("length"), "key=jobs"))
    assert samples[0].value == 2


async def test_unknown_master_name_is_named(sentinel_set: SentinelSet, make_source: Make) -> None:
    source = make_source(sentinel={"addresses": sentinel_set.addresses(), "master_name": "nope"})
    with pytest.raises(SourceError, match=r"master 'nope' via Sentinel .*: the Sentinels know no reachable master"):
        await source.query(query_for(redis_metric("length"), "key=jobs"))


async def test_metric_keeps_answering_through_a_failover(sentinel_set: SentinelSet, make_source: Make) -> None:
    sentinel_set.master.client().rpush("failover-jobs", *range(3))
    wait_until(lambda: sentinel_set.replica.client().llen("failover-jobs") == 3)
    source = make_source(
        sentinel={"addresses": sentinel_set.addresses(), "master_name": MASTER_NAME}, connect_timeout=0.5, timeout=1
    )
    metric = redis_metric("length", interval=0.2, max_staleness=60)
    cache = MetricCache(Catalogue([metric]), {"q": source}, CacheConfig(query_timeout=2))
    try:
        assert (await cache.read(metric.name, "default", "key=failover-jobs")).value == 3
        sentinel_set.master.stop()  # the master dies; Sentinels elect the replica
        deadline = time.monotonic() + 30
        while sentinel_set.current_master_port() != sentinel_set.replica.port:
            assert time.monotonic() < deadline, "the Sentinels never failed over"
            # Every read during the failover answers: the last good value, never an error or a zero.
            assert (await cache.read(metric.name, "default", "key=failover-jobs")).value == 3
            await asyncio.sleep(0.1)
        new_master = sentinel_set.replica.client()
        wait_until(lambda: new_master.info("replication")["role"] == "master")
        new_master.rpush("failover-jobs", 3, 4)
        while (await cache.read(metric.name, "default", "key=failover-jobs")).value != 5:
            assert time.monotonic() < deadline, "the source never reconnected to the new master"
            await asyncio.sleep(0.1)
    finally:
        await cache.close()
