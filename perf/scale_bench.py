"""Benchmark: N HPAs on one adapter, each asking its own series once per sync period (Redis and Kafka).

    python perf/scale_bench.py [--period 15] [--measure 30] [--baseline /tmp/scale-baseline]
                               [--no-redis] [--no-kafka] [--no-replicas]

Starts a real redis-server with 10,000 list keys and `zeroscale serve` (TLS with its self-signed
certificate, authentication off on loopback, one `queue-depth` metric with a `queue` label, the
cache defaults: interval 5 s). A load generator in two separate processes asks each of N series
once per `--period` (the HPA's default sync is 15 s), paced evenly, over 32 keep-alive TLS
connections: the HPA's pattern. Latency counts from the time a request was due, so a request held
up behind a slow one is counted as late (no coordinated omission). Then the same against a real
Kafka broker (scripts/kafka/run.sh) with 1,000 consumer groups, each with offsets committed on the
three partitions of its topic (ten topics), one series per group.

For N = 1,000 and 10,000 (Kafka: 1,000 groups) it prints request p50/p99, the adapter's CPU (% of
one core, from /proc/<pid>/stat) while asked and after the asks stop (one period and cache.unwatch_after
later: what keeping series costs when nobody asks), source reads per second
(`zeroscale_source_query_duration_seconds_count` from the adapter's /metrics) and RSS (/proc/<pid>/status).
Then two replicas share the 10,000 series:
each connection goes to one of them and each ask takes a random connection, as the API server's
aggregator spreads an APIService's requests. `--baseline DIR` runs the same against the adapter
code in DIR (a checkout of main: `git worktree add /tmp/scale-baseline main`) first, for comparison.
The first period of each run is the warm-up (first reads); measurement starts after it.

Where the tail comes from: the adapter and each generator run the loop probe (ZEROSCALE_LOOP_PROBE,
adapter.telemetry.probe); for the measured window it prints their event-loop stalls of 5 ms or more
(and how many of them the process spent mostly on the CPU: its own work; the rest it was waiting
for the machine), the collector's pauses by generation (those of 20 ms or more one by one, with
their CPU time), and what the adapter's collector tracks, by type.

Last line: `p99_ms_10k=<x> cpu_pct_10k=<y> rss_mib_10k=<z> source_reads_per_s_10k=<w>` (ours, Redis;
cpu is the background figure). Goal at 10k: p99 <= 5 ms, background CPU <= 10 % of a core, RSS <= 250 MiB.
The machine is shared: the figures move with its load, printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapter.children import listening, on_a_free_port, port_outside_ephemeral, wait_ready_blocking  # noqa: E402
from adapter.telemetry.probe import ENV as PROBE_ENV  # noqa: E402
from adapter.telemetry.probe import Probe  # noqa: E402
from tests.fixtures.kafka_broker import KafkaBroker, commit  # noqa: E402
from tests.fixtures.redis_servers import RedisProcess  # noqa: E402

KEYS = 10_000
CONNECTIONS = 32
GENERATORS = 2  # processes: one Python process cannot pace 667 TLS requests/s on a loaded machine
METRIC_PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/queue-depth"
SERVER = """\
server:
  bind: 127.0.0.1
  port: {port}
  metrics_bind: 127.0.0.1
  metrics_port: {metrics_port}
  auth: {{enabled: false}}
cache:
  max_series: 20000
  max_series_per_namespace: 20000
"""
REDIS = """\
sources:
  - name: bench
    type: redis
    url: redis://127.0.0.1:{redis_port}
metrics:
  - name: queue-depth
    type: redis
    source: bench
    query: length
    redis_key: "${{queue}}"
    labels:
      queue: {{pattern: "q[0-9]+", required: true}}
"""
KAFKA = """\
sources:
  - name: bench
    type: kafka
    bootstrap_servers: ["{bootstrap}"]
metrics:
  - name: queue-depth
    type: kafka
    source: bench
    labels:
      group: {{pattern: "g[0-9]+", required: true}}
"""
KAFKA_GROUPS = 1000
KAFKA_TOPICS = 10  # 100 groups per topic
# The cache default: the sources stop following series nobody asked for this long (older code: idle_ttl).
UNWATCH_AFTER = 30.0
KAFKA_PARTITIONS = 3  # per topic: each group has committed offsets on three partitions


@dataclass
class Backend:
    """The source the adapter reads: its part of the configuration and how a series is selected."""

    label: str
    config: str  # sources and metrics, YAML
    selector: str  # the labelSelector of series i, without i (URL-encoded)


@dataclass
class Adapter:
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    probe: Path  # the adapter's loop probe file (adapter.telemetry.probe)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1)) / 1024

    def source_reads(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as response:
            text = response.read().decode()
        match = re.search(r'^zeroscale_source_query_duration_seconds_count\{source="bench"\} (\S+)', text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0


@dataclass
class Sample:
    cpu: float
    reads: float
    at: float


def sample(adapters: list[Adapter]) -> list[Sample]:
    return [Sample(a.cpu_seconds(), a.source_reads(), time.monotonic()) for a in adapters]


def rates(adapters: list[Adapter], before: list[Sample]) -> tuple[float, float]:
    """CPU % of one core (summed over the adapters) and source reads per second since `before`."""
    after = sample(adapters)
    cpu = sum((b.cpu - a.cpu) / (b.at - a.at) for a, b in zip(before, after, strict=True)) * 100
    reads = sum((b.reads - a.reads) / (b.at - a.at) for a, b in zip(before, after, strict=True))
    return cpu, reads


def start_adapter(code: Path, directory: Path, backend: Backend, name: str) -> Adapter:
    """`zeroscale serve` from `code`, which may be a baseline without `--ready-file`: its ports are chosen
    outside the ephemeral range (again if a listener holds one: docs/architecture.md#no-port-races)."""
    probe = directory / f"{name}.probe.json"
    log = directory / f"{name}.log"
    metrics_port = port_outside_ephemeral()

    def start(port: int) -> Adapter:
        config = directory / f"{name}.yaml"
        config.write_text(SERVER.format(port=port, metrics_port=metrics_port) + backend.config)
        with log.open("ab") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "adapter", "--log-level", "WARNING", "serve", "--config", str(config)],
                cwd=code,
                env={**os.environ, PROBE_ENV: str(probe)},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        for bound in (port, metrics_port):
            wait_ready_blocking(process, functools.partial(listening, process.pid, bound), "zeroscale serve", log)
        return Adapter(process, port, metrics_port, probe)

    return on_a_free_port(start)


def stop(adapters: list[Adapter]) -> None:
    for adapter in adapters:
        adapter.process.terminate()
    for adapter in adapters:
        try:
            adapter.process.wait(20)
        except subprocess.TimeoutExpired:
            adapter.process.kill()


# --- the load generator (run as a child process: `scale_bench.py --generate <json>`) ---


async def _connection(port: int, context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")


async def _ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lock: asyncio.Lock, selector: str
) -> tuple[int, bytes]:
    request = (
        f"GET {METRIC_PATH}?labelSelector={selector} HTTP/1.1\r\nHost: adapter\r\nAccept: application/json\r\n\r\n"
    )
    async with lock:  # one request at a time per keep-alive connection (HTTP/1.1, no pipelining)
        writer.write(request.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        match = re.search(rb"(?i)content-length:\s*(\d+)", head)
        assert match is not None, head
        body = await reader.readexactly(int(match.group(1)))
        return status, body


async def generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Ask series spec["series"] once per period each, evenly spread, until spec["until"] (wall clock)."""
    probe = Probe(Path(spec["probe"]))  # the generator's own stalls: its share of the latency
    probe.start()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    ports: list[int] = spec["ports"]
    links = [await _connection(ports[i % len(ports)], context) for i in range(spec["connections"])]
    locks = [asyncio.Lock() for _ in links]
    series: list[int] = spec["series"]
    period: float = spec["period"]
    measure_from: float = spec["measure_from"]
    until: float = spec["until"]
    latencies: list[float] = []
    late: list[float] = []  # how late the generator itself sent (its own share of the latency)
    errors: dict[str, int] = {}
    pending: set[asyncio.Task[None]] = set()
    rng = random.Random(spec["seed"])

    async def one(index: int, due: float) -> None:
        link = rng.randrange(len(links))  # the aggregator's choice of connection: any of them
        sent = time.time()
        status, body = await _ask(*links[link], locks[link], f"{spec['selector']}{index}")
        done = time.time()
        if done >= measure_from:
            latencies.append((done - due) * 1000)
            late.append((sent - due) * 1000)
            if status != 200:
                key = f"{status} {body[:120]!r}"
                errors[key] = errors.get(key, 0) + 1

    step = period / len(series)
    start = spec["start"]
    k = 0
    while True:
        due = start + k * step
        if due >= until:
            break
        delay = due - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(series[k % len(series)], due))
        pending.add(task)
        task.add_done_callback(pending.discard)
        k += 1
    await asyncio.gather(*pending)
    for _, writer in links:
        writer.close()
    probe.stop()
    return {"latencies": latencies, "late": late, "errors": errors}


@dataclass
class Load:
    latencies: list[float]  # ms, of the measured window
    late: list[float]  # the generators' sending delays, ms
    errors: dict[str, int]
    window: tuple[float, float]  # wall-clock start and end of the measured window
    probes: list[Path]  # the generators' loop probe files


def run_load(
    directory: Path, selector: str, ports: list[int], n: int, period: float, warmup: float, measure: float
) -> Load:
    """The N series split over the generator processes."""
    now = time.time() + 1.0
    specs: list[dict[str, Any]] = [
        {
            "ports": ports,
            "connections": CONNECTIONS // GENERATORS,
            "series": list(range(g, n, GENERATORS)),
            "period": period,
            # Generators offset by half a step, so their asks interleave evenly.
            "start": now + g * period / n,
            "measure_from": now + warmup,
            "until": now + warmup + measure,
            "seed": g,
            "selector": selector,
            "probe": str(directory / f"generator-{n}-{g}.probe.json"),
        }
        for g in range(GENERATORS)
    ]
    children = [
        subprocess.Popen([sys.executable, __file__, "--generate", json.dumps(spec)], stdout=subprocess.PIPE)
        for spec in specs
    ]
    latencies: list[float] = []
    late: list[float] = []
    errors: dict[str, int] = {}
    for child in children:
        out, _ = child.communicate(timeout=warmup + measure + 300)
        result = json.loads(out)
        latencies += result["latencies"]
        late += result["late"]
        for key, count in result["errors"].items():
            errors[key] = errors.get(key, 0) + count
    probes = [Path(spec["probe"]) for spec in specs]
    return Load(latencies, late, errors, (now + warmup, now + warmup + measure), probes)


@dataclass
class Stalls:
    """What a loop probe saw in the measured window (adapter.telemetry.probe)."""

    over_5ms: int
    busy_5ms: int  # of those, the ones mostly on CPU (its own work, not the machine's)
    max_ms: float
    total_ms: float  # of stalls >= 1 ms
    gc_over_5ms: list[int]  # per generation
    gc_max_ms: list[float]
    collections: list[int]  # since the process started
    tracked: list[tuple[str, int]]  # the collector's objects by type at the end, the most common

    def text(self) -> str:
        gc_max = "/".join(f"{m:.1f}" for m in self.gc_max_ms)
        gc_over = "/".join(str(c) for c in self.gc_over_5ms)
        return (
            f"stalls>=5ms {self.over_5ms} ({self.busy_5ms} mostly on CPU, the rest off it), max {self.max_ms:.1f} ms, "
            f"all>=1ms {self.total_ms:.0f} ms; "
            f"gc pauses>=5ms gen0/1/2 {gc_over}, max {gc_max} ms, collections {self.collections}"
        )


def stalls(path: Path, window: tuple[float, float]) -> Stalls:
    state = json.loads(path.read_text())
    start, end = window
    lags = [(late, cpu) for at, late, cpu in state["stalls"] if start <= at <= end]
    pauses = [(took, generation) for at, took, generation, *_ in state["gc_pauses"] if start <= at <= end]
    for at, took, generation, collected, cpu in state["gc_pauses"]:
        if start <= at <= end and took >= 0.02:
            print(f"    gc gen {generation}: {took * 1000:.1f} ms ({cpu * 1000:.1f} ms CPU), {collected} collected")
    return Stalls(
        over_5ms=sum(1 for late, _ in lags if late >= 0.005),
        # The thread ran at least half the stall since the timer was armed: its own work (slowed by the machine).
        busy_5ms=sum(1 for late, cpu in lags if late >= 0.005 and cpu >= late / 2),
        max_ms=max((late for late, _ in lags), default=0.0) * 1000,
        total_ms=sum(late for late, _ in lags) * 1000,
        gc_over_5ms=[sum(1 for took, g in pauses if g == gen and took >= 0.005) for gen in range(3)],
        gc_max_ms=[max((took for took, g in pauses if g == gen), default=0.0) * 1000 for gen in range(3)],
        collections=state["collections"],
        tracked=state["tracked"],
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


@dataclass
class Result:
    label: str
    n: int
    p50: float
    p99: float
    cpu_asked: float
    cpu_idle: float
    reads_asked: float
    reads_idle: float
    rss: float
    errors: int
    late_p99: float

    def line(self) -> str:
        return (
            f"{self.label:<10} N={self.n:>6}: p50 {self.p50:8.2f} ms  p99 {self.p99:8.2f} ms  "
            f"cpu asked {self.cpu_asked:5.1f}%  cpu idle {self.cpu_idle:5.1f}%  "
            f"reads/s asked {self.reads_asked:7.1f}  idle {self.reads_idle:7.1f}  RSS {self.rss:6.1f} MiB"
            f"  errors {self.errors}  (generator's own sending delay p99 {self.late_p99:.2f} ms)"
        )


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def scenario(
    code: Path, directory: Path, backend: Backend, label: str, n: int, replicas: int, args: argparse.Namespace
) -> Result:
    adapters = [start_adapter(code, directory, backend, f"{label}-{n}-{r}") for r in range(replicas)]
    try:
        warmup = args.period  # the first period: every series' first (cold) read
        # The load runs in a thread; CPU and reads are sampled when its measured window begins.
        started = time.monotonic()
        result: dict[str, Any] = {}

        def load() -> None:
            ports = [a.port for a in adapters]
            result["out"] = run_load(directory, backend.selector, ports, n, args.period, warmup, args.measure)

        thread = threading.Thread(target=load)
        thread.start()
        time.sleep(max(0.0, warmup + 1.0 - (time.monotonic() - started)))
        before = sample(adapters)
        thread.join()
        cpu_asked, reads_asked = rates(adapters, before)
        out: Load = result["out"]
        latencies, late, errors = out.latencies, out.late, out.errors
        time.sleep(1.5)  # the probes' files are rewritten once a second
        for adapter in adapters:
            if adapter.probe.exists():  # not in a baseline without the probe
                print(f"  {label} N={n} adapter  {stalls(adapter.probe, out.window).text()}")
        for path in out.probes:
            print(f"  {label} N={n} generator {stalls(path, out.window).text()}")
        slow = sum(1 for latency in latencies if latency > 5.0)
        print(f"  {label} N={n} answers over 5 ms: {slow} of {len(latencies)}")
        # Nobody asks any more: after one period (the refreshes planned for asks that did not come) and
        # cache.unwatch_after (the sources stop following the series), what keeping the series costs.
        time.sleep(args.period + UNWATCH_AFTER)
        before = sample(adapters)
        time.sleep(args.idle)
        cpu_idle, reads_idle = rates(adapters, before)
        rss = sum(a.rss_mib() for a in adapters)
        for adapter in adapters:
            adapter.probe.with_name(adapter.probe.name + ".census").touch()  # asks the probe for a census
        time.sleep(3)
        for adapter in adapters:
            if adapter.probe.exists():
                tracked = json.loads(adapter.probe.read_text())["tracked"]
                print(f"  {label} N={n} adapter's collector tracks, most common: {tracked}")
        for key, count in errors.items():
            print(f"  {label} N={n}: {count} x {key}")
        return Result(
            label,
            n,
            percentile(latencies, 0.5),
            percentile(latencies, 0.99),
            cpu_asked,
            cpu_idle,
            reads_asked,
            reads_idle,
            rss,
            sum(errors.values()),
            percentile(late, 0.99),
        )
    finally:
        stop(adapters)


def fill(server: RedisProcess) -> None:
    client: Any = server.client()
    pipe = client.pipeline(transaction=False)
    for i in range(KEYS):
        pipe.rpush(f"q{i}", *range(i % 20 + 1))
    pipe.execute()


async def fill_kafka(bootstrap: str) -> None:
    """KAFKA_GROUPS groups, each with offsets committed part way through the three partitions of its topic."""
    topics = [f"t{i}" for i in range(KAFKA_TOPICS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(name, KAFKA_PARTITIONS, 1) for name in topics])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    for name in topics:
        for partition in range(KAFKA_PARTITIONS):
            for _ in range(5):
                await producer.send(name, b"m", partition=partition)
    await producer.flush()
    await producer.stop()
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        for g in range(KAFKA_GROUPS):
            topic = topics[g * KAFKA_TOPICS // KAFKA_GROUPS]
            await commit(client, f"g{g}", topic, [(p, g % 5, "") for p in range(KAFKA_PARTITIONS)])
    finally:
        await client.close()


def run_sizes(
    backend: Backend, directory: Path, sizes: list[int], args: argparse.Namespace, results: list[Result]
) -> None:
    codes = ([("main", args.baseline)] if args.baseline else []) + [("this", ROOT)]
    for label, code in codes:
        for n in sizes:
            results.append(scenario(code, directory, backend, f"{backend.label} {label}", n, 1, args))
            print(results[-1].line(), f" load {load_average()}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--period", type=float, default=15.0, help="seconds between two asks of one series (15)")
    parser.add_argument("--measure", type=float, default=30.0, help="seconds measured after the warm-up period (30)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the no-request CPU is measured (10)")
    parser.add_argument("--baseline", type=Path, help="a checkout of main to run first, for comparison")
    parser.add_argument("--sizes", default="1000,10000", help="N values (1000,10000)")
    parser.add_argument("--no-replicas", action="store_true", help="skip the two-replica run")
    parser.add_argument("--no-kafka", action="store_true", help="skip the Kafka runs")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis runs")
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        print(json.dumps(asyncio.run(generate(json.loads(args.generate)))))
        return 0
    sizes = [int(n) for n in args.sizes.split(",")]
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as workdir:
        directory = Path(workdir)
        print(
            f"cpus {os.cpu_count()}, period {args.period:g}s, measured {args.measure:g}s after a "
            f"{args.period:g}s warm-up, {CONNECTIONS} TLS keep-alive connections; shared machine"
        )
        if not args.no_redis:
            server = RedisProcess(directory, []).start()
            try:
                fill(server)
                redis = Backend("redis", REDIS.format(redis_port=server.port), "queue%3Dq")
                run_sizes(redis, directory, sizes, args, results)
                if not args.no_replicas:
                    results.append(scenario(ROOT, directory, redis, "redis 2 replicas", max(sizes), 2, args))
                    print(results[-1].line(), f" load {load_average()}  (CPU, reads, RSS: both replicas)", flush=True)
            finally:
                server.stop()
        if not args.no_kafka:
            broker = KafkaBroker(directory / "kafka")
            broker.state_dir.mkdir()
            broker.start()
            try:
                asyncio.run(fill_kafka(broker.bootstrap))
                kafka = Backend("kafka", KAFKA.format(bootstrap=broker.bootstrap), "group%3Dg")
                run_sizes(kafka, directory, [KAFKA_GROUPS], args, results)
            finally:
                broker.stop()
    ours = next((r for r in results if r.label == "redis this" and r.n == max(sizes)), None)
    if ours is None:
        return 0
    print(
        f"p99_ms_10k={ours.p99:.2f} cpu_pct_10k={ours.cpu_idle:.1f} rss_mib_10k={ours.rss:.0f} "
        f"source_reads_per_s_10k={ours.reads_asked:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
