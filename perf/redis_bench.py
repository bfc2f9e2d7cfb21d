"""Redis refresh: time and round trips per refresh, beside redis-benchmark's pipelined LLEN in the same run.

Starts a real redis-server on a loopback port outside the ephemeral range and measures
  (a) 1,000 list keys read with `length` (TYPE + LLEN each), as the cache refreshes them: 1,000
      separate `query()` calls arriving together, which the source coalesces into one pipeline;
  (b) 100 streams with consumer groups read with `stream_backlog` (XLEN + XINFO GROUPS each);
and, as baselines on the same server, the same 1,000 LLENs as one bare redis-py pipeline (the floor
for a redis-py client) and `redis-benchmark -c 1 -P 1000 LLEN`: the rate one C client gets for LLEN
pipelined 1,000 deep, turned into the time 1,000 such commands take (what (a) sends once key types
are known).
Run: python perf/redis_bench.py   (last line: refresh_ms_1000_keys=<x> round_trips=<n>)
"""

from __future__ import annotations

import asyncio
import csv
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis

from adapter.config.redis import RedisSource
from adapter.metrics.catalogue import Catalogue
from adapter.sources.base import SourceQuery
from adapter.sources.redis.source import RedisQueues
from adapter.telemetry import redis as telemetry
from tests.fixtures.redis_servers import RedisProcess
from tests.sources.redis.fixtures import redis_metric

ROUNDS = 30
KEYS = 1000
STREAMS = 100


def prepare(server: RedisProcess) -> None:
    client: Any = server.client()
    pipe = client.pipeline(transaction=False)
    for i in range(KEYS):
        pipe.rpush(f"q{i}", *range(i % 20 + 1))
    for i in range(STREAMS):
        for n in range(10):
            pipe.xadd(f"s{i}", {"n": n})
        pipe.xgroup_create(f"s{i}", "workers", id="0")
        pipe.xreadgroup("workers", "c1", {f"s{i}": ">"}, count=i % 10 + 1)
    pipe.execute()


def queries(kind: str, selectors: list[str]) -> list[SourceQuery]:
    metric = redis_metric(kind)
    catalogue = Catalogue([metric])
    return [catalogue.resolve(metric.name, "default", selector)[1] for selector in selectors]


async def refresh_ms(source: RedisQueues, batch: list[SourceQuery]) -> tuple[float, float]:
    """Median milliseconds per refresh of the whole batch, and round trips per refresh."""
    await asyncio.gather(*(source.query(q) for q in batch))  # warm: connection, key types
    trips = telemetry.ROUND_TRIPS.labels("bench")
    before = trips._value.get()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        await asyncio.gather(*(source.query(q) for q in batch))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), (trips._value.get() - before) / ROUNDS


async def redis_py_pipeline_ms(server: RedisProcess) -> float:
    """The floor of any redis-py based source: the same 1,000 LLENs as one bare redis-py pipeline."""
    client = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    times = []
    try:
        for _ in range(ROUNDS):
            started = time.perf_counter()
            async with client.pipeline(transaction=False) as pipe:
                for i in range(KEYS):
                    pipe.llen(f"q{i}")
                await pipe.execute()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await client.aclose()
    return statistics.median(times)


def baseline_llen_ms(server: RedisProcess, commands: int) -> float:
    """Milliseconds one pipelined client needs for `commands` LLENs, from redis-benchmark's rate."""
    command = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c", "1", "-P", "1000", "-n", "200000"]
    output = subprocess.run(
        [*command, "--csv", "LLEN", "q1"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = list(csv.DictReader(io.StringIO(output)))
    rate = float(rows[-1]["rps"])
    print(f"redis-benchmark -c 1 -P 1000 LLEN: {rate:,.0f} requests/s")
    return commands / rate * 1000


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="redis-bench-") as workdir:
        server = RedisProcess(Path(workdir), []).start()
        try:
            prepare(server)
            source = RedisQueues(RedisSource(type="redis", name="bench", url=f"redis://{server.address}"))
            try:
                lists = queries("length", [f"key=q{i}" for i in range(KEYS)])
                list_ms, list_trips = await refresh_ms(source, lists)
                streams = queries("stream_backlog", [f"key=s{i},group=workers" for i in range(STREAMS)])
                stream_ms, stream_trips = await refresh_ms(source, streams)
            finally:
                await source.close()
            floor = await redis_py_pipeline_ms(server)
            baseline = baseline_llen_ms(server, KEYS)
        finally:
            server.stop()
    print(f"{KEYS} list keys:            {list_ms:7.2f} ms per refresh, {list_trips:g} round trip(s)")
    print(f"{STREAMS} streams with groups: {stream_ms:7.2f} ms per refresh, {stream_trips:g} round trip(s)")
    print(f"bare redis-py pipeline, {KEYS} LLENs: {floor:7.2f} ms")
    print(f"redis-benchmark, {KEYS} pipelined LLENs: {baseline:7.2f} ms")
    print(f"ratio ours / bare redis-py pipeline: {list_ms / floor:.1f}x")
    print(f"ratio ours / redis-benchmark: {list_ms / baseline:.1f}x")
    print(f"refresh_ms_1000_keys={list_ms:.2f} round_trips={list_trips:g}")


if __name__ == "__main__":
    asyncio.run(main())
