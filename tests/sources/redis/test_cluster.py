"""Cluster mode: three masters, keys over every node, one round trip per node, MOVED and ASK during a slot migration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from adapter.children import port_outside_ephemeral
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.sources.redis.source import RedisQueues
from adapter.telemetry import redis as telemetry
from tests.fixtures.redis_servers import RedisProcess, create_cluster
from tests.sources.redis.fixtures import Make, query_for, redis_metric


@pytest.fixture(scope="module")
def cluster(redis_dir: Path) -> Iterator[list[RedisProcess]]:
    workdir = redis_dir / "cluster"  # a directory per port below it
    nodes = [
        RedisProcess(
            workdir,
            [
                "cluster-enabled yes",
                "cluster-config-file nodes.conf",
                "cluster-node-timeout 2000",
                f"cluster-port {port_outside_ephemeral()}",  # else port + 10000, which may not exist
            ],
        )
        for _ in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        create_cluster(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def cluster_client(nodes: list[RedisProcess]) -> Any:
    return redis.RedisCluster(host="127.0.0.1", port=nodes[0].port, decode_responses=True)


def owner(nodes: list[RedisProcess], key: str) -> RedisProcess:
    slot = key_slot(key.encode())
    for node in nodes:
        client: Any = node.client()
        for start, end, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end and int(_[0][1]) == node.port:
                return node
    raise AssertionError(f"no node owns slot {slot}")


@pytest.fixture
def source(cluster: list[RedisProcess], make_source: Make) -> RedisQueues:
    return make_source(cluster_nodes=[cluster[0].address])


async def test_keys_on_every_node_in_one_round_trip_per_node(cluster: list[RedisProcess], source: RedisQueues) -> None:
    writer = cluster_client(cluster)
    keys = [f"job{i}" for i in range(30)]
    for i, key in enumerate(keys):
        writer.delete(key)
        writer.rpush(key, *range(i + 1))
    assert {owner(cluster, key).port for key in keys} == {node.port for node in cluster}
    metric = redis_metric("length")
    await source.query(query_for(metric, "key=job0"))  # loads the slot map
    trips = telemetry.ROUND_TRIPS.labels("q")
    before = trips._value.get()
    results = await asyncio.gather(*(source.query(query_for(metric, f"key={key}")) for key in keys))
    assert [int(samples[0].value) for samples in results] == [i + 1 for i in range(30)]
    assert trips._value.get() == before + 3
    total = await source.query(query_for(metric, f"key in ({','.join(keys)})"))
    assert sum(s.value for s in total) == sum(range(1, 31))


async def test_streams_on_a_cluster(cluster: list[RedisProcess], source: RedisQueues) -> None:
    writer = cluster_client(cluster)
    writer.delete("events")
    for i in range(5):
        writer.xadd("events", {"n": i})
    writer.xgroup_create("events", "workers", id="0")
    writer.xreadgroup("workers", "c1", {"events": ">"}, count=2)
    samples = await source.query(query_for(redis_metric("stream_backlog"), "key=events,group=workers"))
    assert samples[0].value == 5  # lag 3 + pending 2


def node_id(node: RedisProcess) -> str:
    client: Any = node.client()
    return str(client.execute_command("CLUSTER", "MYID"))


async def test_reads_follow_ask_and_moved_during_a_slot_migration(
    cluster: list[RedisProcess], source: RedisQueues
) -> None:
    writer = cluster_client(cluster)
    key = "migrating-queue"
    writer.delete(key)
    writer.rpush(key, *range(4))
    metric = redis_metric("length")
    assert (await source.query(query_for(metric, f"key={key}")))[0].value == 4  # the source now caches the slot map

    origin = owner(cluster, key)
    target = next(node for node in cluster if node is not origin)
    slot = str(key_slot(key.encode()))
    origin_client: Any = origin.client()
    target_client: Any = target.client()
    target_client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(origin))
    origin_client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
    origin_client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
    # Mid-migration the origin answers ASK for the moved key.
    assert (await source.query(query_for(metric, f"key={key}")))[0].value == 4
    for node in cluster:
        client: Any = node.client()
        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
    # Now the origin answers MOVED; the source follows and updates its map.
    assert (await source.query(query_for(metric, f"key={key}")))[0].value == 4
    target_client.rpush(key, 4)
    assert (await source.query(query_for(metric, f"key={key}")))[0].value == 5


async def test_keyspace_notifications_on_every_primary(cluster: list[RedisProcess], make_source: Make) -> None:
    for node in cluster:
        node.client().config_set("notify-keyspace-events", "Kl")
    source = make_source(cluster_nodes=[cluster[0].address], notifications=True)
    metric = redis_metric("length", interval=600)  # only a notification can refresh within the test
    cache = MetricCache(Catalogue([metric]), {"q": source}, CacheConfig())
    keys = ["note-a", "note-b", "note-c", "note-d"]
    writer = cluster_client(cluster)
    for key in keys:
        writer.delete(key)  # one key per call: they live on different nodes
    try:
        for key in keys:
            assert (await cache.read(metric.name, "default", f"key={key}")).value == 0
        for key in keys:
            await subscribed_on(owner(cluster, key), key)
            writer.rpush(key, "job")
        deadline = time.monotonic() + 10
        for key in keys:
            while (await cache.read(metric.name, "default", f"key={key}")).value != 1:
                assert time.monotonic() < deadline, f"no refresh for {key}"
                await asyncio.sleep(0.01)
    finally:
        await cache.close()
        for node in cluster:
            node.client().config_set("notify-keyspace-events", "")


async def subscribed_on(node: RedisProcess, key: str) -> None:
    deadline = time.monotonic() + 10
    while node.client().pubsub_numsub(f"__keyspace@0__:{key}")[0][1] < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
