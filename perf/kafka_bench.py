"""Kafka lag refresh: time and broker requests per refresh, beside Kafka's own consumer-groups tool.

Starts a real broker (scripts/kafka/run.sh) on loopback ports outside the ephemeral range and measures
  (a) one group on a topic with 1,000 partitions,
  (b) 200 groups of 10 partitions each (20 topics, 10 groups per topic), refreshed together,
each as a full refresh (metadata, OffsetFetch, ListOffsets: nothing reused from the previous one),
and the wall time of `kafka-consumer-groups --describe` on the same groups in the same run (a JVM
command: its time includes the JVM's start, as it does for anyone running it);
  (c) freshness with default settings (source, metric and cache): a series kept warm by the cache,
60 rounds of: commit to the log end (lag 0, inactive), wait a random part of a second,
produce one record and, from its acknowledgement, time until the cache's value reads 1 (what the
external metrics API serves: the API answers from the cache) and until the cache's refresh hook
delivers it (what sends a StreamIsActive message: the flip to active). In process: no HTTP or gRPC
hop (those are measured by perf/api_bench.py and perf/activation_bench.py).
Run: python perf/kafka_bench.py   (last line: refresh_ms_1000_partitions=<x> requests_per_refresh=<n>
requests_per_refresh_200_groups=<m> produce_to_api_p99_ms=<p>)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaClient, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import REGISTRY

from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache, Reading
from adapter.metrics.catalogue import Catalogue
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker, commit, describe_groups

ROUNDS = 30
FRESH_ROUNDS = 60  # the docstring says it too; --fresh-rounds changes it
STEP_TIMEOUT = 300.0  # seconds
T = TypeVar("T")
BIG_PARTITIONS = 1000
GROUPS, GROUP_PARTITIONS, GROUPS_PER_TOPIC = 200, 10, 10


async def prepare(bootstrap: str) -> tuple[str, list[str]]:
    """The topics, some messages in every partition, and commits part way through."""
    topics = {"big": BIG_PARTITIONS} | {f"small-{i}": GROUP_PARTITIONS for i in range(GROUPS // GROUPS_PER_TOPIC)}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(name, count, 1) for name, count in topics.items()])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    for name, count in topics.items():
        for partition in range(count):
            for _ in range(1 + partition % 3):
                await producer.send(name, b"m", partition=partition)
    await producer.flush()
    await producer.stop()
    groups = {"big-group": "big"} | {f"group-{i}": f"small-{i // GROUPS_PER_TOPIC}" for i in range(GROUPS)}
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    for group, topic in groups.items():
        commits = [(p, p % 2, "") for p in range(topics[topic])]
        await commit(client, group, topic, commits)
    await client.close()
    return "big-group", [g for g in groups if g != "big-group"]


def requests(source: str) -> float:
    return sum(
        REGISTRY.get_sample_value("zeroscale_kafka_requests_total", {"source": source, "api": api}) or 0
        for api in ("Metadata", "FindCoordinator", "OffsetFetch", "ListOffsets")
    )


async def measure(bootstrap: str, groups: list[str], metadata_max_age: float = 0) -> tuple[float, float]:
    """Median ms of a refresh of `groups` read together, and broker requests per refresh: a full one
    by default, or with the metadata reused as the source's poll rounds do."""
    name = f"bench-{len(groups)}-{metadata_max_age:g}"
    config = KafkaSource(
        type="kafka", name=name, bootstrap_servers=[bootstrap], metadata_max_age=metadata_max_age, offsets_max_age=0
    )
    source = KafkaLag(config)
    metric = KafkaMetric(type="kafka", name="lag", source=name, labels={"group": {"required": True}})
    catalogue = Catalogue([metric])
    queries = [catalogue.resolve("lag", "default", f"group={group}")[1] for group in groups]
    try:
        await asyncio.gather(*(source.query(q) for q in queries))  # connect, find coordinators
        before = requests(name)
        times = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            await asyncio.gather(*(source.query(q) for q in queries))
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times), (requests(name) - before) / ROUNDS
    finally:
        await source.close()


async def freshness(bootstrap: str, rounds: int) -> tuple[list[float], list[float], float]:
    """(c): ms from each acknowledged produce to the cache's value and to its refresh hook, and the
    broker requests per second the warm group cost meanwhile."""
    topic, group = "fresh", "fresh-group"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    committer = AIOKafkaClient(bootstrap_servers=bootstrap)
    await committer.bootstrap()
    end = 0
    await commit(committer, group, topic, [(0, 0, "")])
    config = KafkaSource(type="kafka", name="fresh", bootstrap_servers=[bootstrap])  # defaults otherwise
    source = KafkaLag(config)
    labels = {"group": {"required": True}, "topic": {}}
    metric = KafkaMetric(type="kafka", name="lag", source="fresh", labels=labels)  # defaults otherwise
    catalogue = Catalogue([metric])
    cache = MetricCache(catalogue, {"fresh": source}, CacheConfig())
    selector = f"group={group},topic={topic}"
    key, _query = catalogue.resolve("lag", "default", selector)
    pushed: asyncio.Queue[tuple[Reading, float]] = asyncio.Queue()
    unsubscribe = cache.subscribe(key, lambda reading: pushed.put_nowait((reading, time.perf_counter())))

    async def until(expected: int, pause: float) -> None:
        """Poll the value as an API client does (it answers from the cache: no broker request)."""
        for _ in range(int(STEP_TIMEOUT / pause)):
            if (await cache.read("lag", "default", selector)).value == expected:
                return
            await asyncio.sleep(pause)
        raise TimeoutError(f"the value never read {expected}")

    to_api, to_hook = [], []
    try:
        await until(0, 0.01)
        started, before = time.perf_counter(), requests("fresh")
        for _ in range(rounds):
            await commit(committer, group, topic, [(0, end, "")])
            await until(0, 0.01)
            await asyncio.sleep(random.uniform(0, 1))  # any phase of the source's poll
            while not pushed.empty():
                pushed.get_nowait()
            await producer.send_and_wait(topic, b"m", partition=0)
            acknowledged = time.perf_counter()
            end += 1
            await until(1, 0.001)
            to_api.append((time.perf_counter() - acknowledged) * 1000)
            while True:
                reading, at = await pushed.get()
                if reading.value == 1:
                    to_hook.append((at - acknowledged) * 1000)
                    break
        per_second = (requests("fresh") - before) / (time.perf_counter() - started)
    finally:
        unsubscribe()
        await cache.close()
        await source.close()
        await producer.stop()
        await committer.close()
    return to_api, to_hook, per_second


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


async def bounded(step: Awaitable[T]) -> T:
    """A step that cannot hang the benchmark if the broker dies under it (clients retry forever)."""
    return await asyncio.wait_for(step, STEP_TIMEOUT)


def tool_ms(bootstrap: str, groups: list[str]) -> float:
    started = time.perf_counter()
    described = describe_groups(bootstrap, groups)
    assert described, "kafka-consumer-groups described nothing"
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fresh-rounds", type=int, default=FRESH_ROUNDS, help="produces timed in (c)")
    fresh_rounds = parser.parse_args().fresh_rounds
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # producer retries while new leaders settle
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as state:
        broker = KafkaBroker(Path(state))
        broker.start()
        try:
            big, small = asyncio.run(bounded(prepare(broker.bootstrap)))
            big_ms, big_requests = asyncio.run(bounded(measure(broker.bootstrap, [big])))
            one_small_ms, one_small_requests = asyncio.run(bounded(measure(broker.bootstrap, small[:1])))
            many_ms, many_requests = asyncio.run(bounded(measure(broker.bootstrap, small)))
            poll_ms, poll_requests = asyncio.run(bounded(measure(broker.bootstrap, small, metadata_max_age=60)))
            to_api, to_hook, per_second = asyncio.run(bounded(freshness(broker.bootstrap, fresh_rounds)))
            big_tool = tool_ms(broker.bootstrap, [big])
            many_tool = tool_ms(broker.bootstrap, small)
        finally:
            broker.stop()
    print(f"broker: Apache Kafka (KRaft) on loopback; {ROUNDS} full refreshes each, median")
    print(
        f"(a) 1 group x {BIG_PARTITIONS} partitions: {big_ms:.1f} ms, {big_requests:g} requests/refresh; "
        f"kafka-consumer-groups --describe {big_tool:.0f} ms; ratio ours/tool {big_ms / big_tool:.4f}"
    )
    print(
        f"    same with 1 group x {GROUP_PARTITIONS} partitions: {one_small_ms:.1f} ms, "
        f"{one_small_requests:g} requests/refresh (count independent of partitions)"
    )
    print(
        f"(b) {GROUPS} groups x {GROUP_PARTITIONS} partitions: {many_ms:.1f} ms, {many_requests:g} requests/refresh; "
        f"kafka-consumer-groups --describe {many_tool:.0f} ms; ratio ours/tool {many_ms / many_tool:.4f}"
    )
    print(f"    same, metadata reused (the source's poll rounds): {poll_ms:.1f} ms, {poll_requests:g} requests/refresh")
    print(
        f"(c) produce -> value, default settings, {len(to_api)} produces: API value p50 "
        f"{statistics.median(to_api):.0f} ms p99 {p99(to_api):.0f} ms max {max(to_api):.0f} ms; "
        f"refresh hook (StreamIsActive) p50 {statistics.median(to_hook):.0f} ms p99 {p99(to_hook):.0f} ms; "
        f"{per_second:.1f} broker requests/s for the one warm group"
    )
    print(
        f"refresh_ms_1000_partitions={big_ms:.1f} requests_per_refresh={big_requests:g} "
        f"requests_per_refresh_200_groups={many_requests:g} produce_to_api_p99_ms={p99(to_api):.0f}"
    )


if __name__ == "__main__":
    main()
