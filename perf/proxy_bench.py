"""The buffering proxy against its baselines, all in this run, on loopback.

(a) Warm path: wrk at 1 and 64 connections against the upstream directly, nginx `proxy_pass` with
    upstream keepalive (1 worker) and `zeroscale proxy` (1 process), interleaved, ROUNDS rounds;
    medians, and ratios against nginx and direct. The upstream is an nginx worker answering a short body.
(b) Wake detection: the upstream starts listening while a request is held; time from `listen()` to
    the first byte of the forwarded request (connect probes, the path without API access).
(c) Memory: RSS growth of the proxy process while it holds 10,000 idle connections, each with a request.
(d) Memory: RSS growth while 100 connections each send 256 KB of pipelined requests behind one held request
    (bounded by max_pipelined_bytes: the excess is refused, not parsed).
(e) Route mode activator, against a real control plane of its own (perf/activator.py; skipped unless `make e2e`
    has built it): the warm path (wrk straight to the app, as the Service routes it once warm, while the proxy
    runs the route warm and leading; the proxy's CPU per request meanwhile) and switch times (a pod turning
    ready -> the Service's slice lists it; spec.replicas set to 0 -> the slice lists the proxy). (a)'s
    `zeroscale` is also the cost of the counting sidecar in a pod: the bench runs the proxy in sidecar mode.
(f) HTTP/2 warm path: h2load (prior-knowledge h2c) at 1 stream and at 64 streams over 4 connections against an
    h2c upstream (an nginx worker on a `listen ... http2` port) directly, through nginx `grpc_pass` (h2c to the
    upstream, its connections kept) and through `zeroscale proxy` (its upstream h2c), interleaved, ROUNDS rounds;
    medians, ratios as in (a) (perf/proxy_h2.py).
(g) Memory: RSS growth of the proxy process while it holds 10,000 HTTP/2 streams, 100 on each of 100 connections.
(h) Tracing: wrk at 1 and 64 connections through four sidecar proxies, tracing off and on at sampling ratios 0, 0.01
    and 1 (exporting to a stand-in OTLP collector, perf/proxy_tracing.py), interleaved, ROUNDS rounds; the p50 each
    adds at 1 connection over tracing off.

Run: python perf/proxy_bench.py   (needs nginx, wrk and h2load; last line:
ratio_vs_nginx=<x> added_p50_us=<y> wake_p99_ms=<z> held_10k_rss_mib=<w> pipelined_rss_mib=<v>
activator_added_p50_us=<a> switch_p99_ms=<b> h2_ratio_vs_nginx=<c> h2_added_p50_us=<d> h2_held_kib_per_stream=<e>
trace_added_p50_us_ratio_0=<f> trace_added_p50_us_ratio_001=<g> trace_added_p50_us_ratio_1=<h>)
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import activator  # noqa: E402  (perf/activator.py: this directory is on sys.path)
import proxy_h2  # noqa: E402
import proxy_tracing  # noqa: E402

from adapter.children import listening, on_a_free_port, wait_ready_blocking  # noqa: E402
from tests.fixtures.netutil import refused_port  # noqa: E402
from tests.fixtures.replicas import spawn  # noqa: E402

ROUNDS = 3
SECONDS = int(os.environ.get("PROXY_BENCH_SECONDS", "5"))
CONNECTIONS = (1, 64)
WAKE_TRIALS = 100
HELD = 10_000
PIPELINING_CONNECTIONS = 100
PIPELINED_BYTES = 256 * 1024
H2_CONNECTIONS = 100  # (g): HELD streams over these, HELD / H2_CONNECTIONS on each (http2.max_concurrent_streams)
# A sidecar whose upstream speaks h2c.
H2C_UPSTREAM = {"ZEROSCALE_PROXY__SIDECAR__PROTOCOL": "h2c"}
_UNITS = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}


@contextmanager
def nginx(body: str) -> Iterator[int]:
    """One nginx master with one worker, configured by `body` (a server block using {port}), on a port outside
    the ephemeral range (docs/architecture.md#no-port-races)."""
    with ExitStack() as running:

        def start(port: int) -> int:
            running.enter_context(_nginx(body, port))  # returns once it listens, or raises ChildFailed
            return port

        yield on_a_free_port(start)


@contextmanager
def _nginx(body: str, port: int) -> Iterator[None]:
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as prefix:
        conf = Path(prefix, "nginx.conf")
        conf.write_text(
            f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  {body.replace("{port}", str(port))}
}}
"""
        )
        log = Path(prefix, "nginx.log")
        with log.open("wb") as out:
            process = subprocess.Popen(["nginx", "-c", str(conf), "-p", prefix], stderr=out)
        try:
            wait_ready_blocking(process, partial(listening, process.pid, port), "nginx", log)
            yield
        finally:
            process.terminate()
            process.wait(10)


@contextmanager
def zeroscale_proxy(upstream: int, **extra: str) -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """A sidecar-mode proxy, its listeners on port 0; returns once it has bound them (its ready file)."""
    env = {
        "ZEROSCALE_PROXY__SIDECAR__UPSTREAM": f"127.0.0.1:{upstream}",
        "ZEROSCALE_PROXY__BIND": "127.0.0.1",
        "ZEROSCALE_PROXY__PORT": "0",
        "ZEROSCALE_PROXY__ADMIN_BIND": "127.0.0.1",
        "ZEROSCALE_PROXY__ADMIN_PORT": "0",
        **extra,
    }
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as directory:
        proxy = spawn("proxy", "proxy", Path(directory), env=env)
        try:
            yield proxy.ports["http"], proxy.ports["admin"], proxy.process
        finally:
            proxy.stop()


def wrk(port: int, connections: int) -> tuple[float, float, float]:
    """(requests/s, p50 us, p99 us)."""
    threads = 1 if connections == 1 else 2
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{SECONDS}s", "--latency", f"http://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    if errors:
        raise SystemExit(f"wrk saw errors against port {port}:\n{out}")

    def percentile(label: str) -> float:
        value, unit = re.search(rf"\s{label}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * _UNITS[unit]

    return rps, percentile("50"), percentile("99")


UPSTREAM = 'server { listen 127.0.0.1:{port}; location / { return 200 "hello from upstream\\n"; } }'


def nginx_proxy(upstream: int) -> str:
    """nginx `proxy_pass` in front of `upstream`, HTTP/1.1 on both sides, upstream connections kept (keepalive)."""
    return (
        f"upstream up {{ server 127.0.0.1:{upstream}; keepalive 128; }}\n"
        "server { listen 127.0.0.1:{port}; location / { proxy_pass http://up; "
        'proxy_http_version 1.1; proxy_set_header Connection ""; } }'
    )


Figures = tuple[float, float, float]  # requests/s, p50 us, p99 us


def interleaved(
    targets: dict[str, int], load: Callable[[int, int], Figures], levels: tuple[int, ...], label: str
) -> dict[tuple[str, int], Figures]:
    """`load(port, level)` on each target at each level (connections or streams, printed as `label`), interleaved,
    ROUNDS rounds after one warm-up run each; the medians of each (target, level), printed."""
    results: dict[tuple[str, int], list[Figures]] = {}
    for port in targets.values():
        load(port, levels[-1])  # warm-up: connections, caches
    for round_number in range(1, ROUNDS + 1):
        for level in levels:
            for name, port in targets.items():
                figures = load(port, level)
                results.setdefault((name, level), []).append(figures)
                print(f"round {round_number} {name:9s} {_figures(label, level, figures)}", flush=True)
    median = {key: _median(runs) for key, runs in results.items()}
    for level in levels:
        for name in targets:
            print(f"median {name:9s} {_figures(label, level, median[(name, level)])}")
    return median


def _median(runs: list[Figures]) -> Figures:
    rps, p50, p99 = (statistics.median(column) for column in zip(*runs, strict=True))
    return rps, p50, p99


def _figures(label: str, level: int, figures: Figures) -> str:
    rps, p50, p99 = figures
    return f"{label}={level:<3d} {rps:9.0f} req/s  p50 {p50:8.0f} us  p99 {p99:8.0f} us"


def compare(median: dict[tuple[str, int], Figures], unit: str) -> tuple[float, float]:
    """Zeroscale against nginx and direct, printed; (req/s ratio to nginx at 64, added p50 over direct at 1)."""
    ratio = median[("zeroscale", 64)][0] / median[("nginx", 64)][0]
    ratio_direct = median[("zeroscale", 64)][0] / median[("direct", 64)][0]
    added_p50 = median[("zeroscale", 1)][1] - median[("direct", 1)][1]
    nginx_added_p50 = median[("nginx", 1)][1] - median[("direct", 1)][1]
    p99_ratio = median[("zeroscale", 64)][2] / median[("nginx", 64)][2]
    print(
        f"req/s at 64 {unit}: {ratio:.2f} of nginx, {ratio_direct:.2f} of direct; "
        f"added p50 at 1 {unit[:-1]}: {added_p50:.0f} us (nginx adds {nginx_added_p50:.0f} us); "
        f"p99 at 64 {unit}: {p99_ratio:.2f}x nginx's"
    )
    return ratio, added_p50


def warm_path() -> dict[tuple[str, int], Figures]:
    """(a): wrk over HTTP/1.1 against the upstream directly, nginx and Zeroscale."""
    with (
        nginx(UPSTREAM) as up,
        nginx(nginx_proxy(up)) as via_nginx,
        zeroscale_proxy(up) as (ours, _, _),
    ):
        targets = {"direct": up, "nginx": via_nginx, "zeroscale": ours}
        return interleaved(targets, wrk, CONNECTIONS, "c")


def h2_path() -> dict[tuple[str, int], Figures]:
    """(f): h2load over h2c against an h2c upstream directly, nginx (grpc_pass) and Zeroscale (an h2c route)."""
    load = partial(proxy_h2.h2load, seconds=SECONDS)
    with (
        nginx(proxy_h2.UPSTREAM) as up,
        nginx(proxy_h2.nginx_proxy(up)) as via_nginx,
        zeroscale_proxy(up, **H2C_UPSTREAM) as (ours, _, _),
    ):
        targets = {"direct": up, "nginx": via_nginx, "zeroscale": ours}
        return interleaved(targets, load, tuple(proxy_h2.LOADS), "streams")


def tracing_cost() -> str:
    """(h): the p50 tracing adds at each ratio, against tracing off in the same run; the summary's figures."""
    with nginx(UPSTREAM) as up, proxy_tracing.collector() as sink:
        with ExitStack() as proxies:
            targets = {
                label: proxies.enter_context(zeroscale_proxy(up, **proxy_tracing.environment(label, sink.endpoint)))[0]
                for label in proxy_tracing.SETTINGS
            }
            median = interleaved(targets, wrk, CONNECTIONS, "c")
        spans = sink.spans  # the proxies flushed their queues as they stopped
    off_p50, off_rps = median[("off", 1)][1], median[("off", 64)][0]
    figures = []
    for label in proxy_tracing.SETTINGS:
        if label == "off":
            continue
        added = median[(label, 1)][1] - off_p50
        share = median[(label, 64)][0] / off_rps
        print(f"{label}: adds {added:.0f} us at p50 (1 connection); {share:.2f} of tracing off's req/s at 64")
        figures.append(f"trace_added_p50_us_{label}={added:.0f}")
    print(f"spans the stand-in collector received: {spans}")
    return " ".join(figures)


async def answer_once(
    first_byte: asyncio.Future[float], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The woken upstream: note when the first request byte arrives, answer it, close."""
    data = await reader.read(65536)
    if data and not first_byte.done():
        first_byte.set_result(time.perf_counter())
        while b"\r\n\r\n" not in data:
            data += await reader.read(65536)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
    writer.close()


async def wake_trials(proxy_port: int, upstream_port: int) -> list[float]:
    delays = []
    for trial in range(WAKE_TRIALS):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(b"GET /trial/%d HTTP/1.1\r\nHost: bench\r\n\r\n" % trial)
        await asyncio.sleep(0.02 + (trial % 7) * 0.003)  # held, probes failing
        first_byte: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        server = await asyncio.start_server(
            partial(answer_once, first_byte), "127.0.0.1", upstream_port, reuse_port=True
        )
        arrived = await asyncio.wait_for(first_byte, 10)
        delays.append((arrived - started) * 1000)
        response = await asyncio.wait_for(reader.read(65536), 10)
        assert response.startswith(b"HTTP/1.1 200"), response
        writer.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.02)
    return delays


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def held_count(admin: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    # The sidecar's route is <namespace>/sidecar (the namespace its pod runs in; before route identities: sidecar).
    match = re.search(r'zeroscale_proxy_held_requests\{route="(?:[a-z0-9-]+/)?sidecar"\} ([\d.e+]+)', text)
    return float(match.group(1)) if match else 0.0


def wait_held(admin: int, count: int, timeout: float = 60) -> float:
    """The route's held count once it reaches `count`, or what it is after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (held := held_count(admin)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


def held_memory() -> tuple[float, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HELD + 1000
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(wanted * 2, soft), hard), hard))
    limits = {
        "ZEROSCALE_PROXY__SIDECAR__LIMITS__MAX_HELD_REQUESTS": str(HELD * 2),
        "ZEROSCALE_PROXY__SIDECAR__LIMITS__HOLD_TIMEOUT": "600",
        "ZEROSCALE_PROXY__SIDECAR__PROBE_INTERVAL": "0.5",
        "ZEROSCALE_PROXY__MAX_CONNECTIONS": str(HELD + 100),
    }
    with zeroscale_proxy(refused_port(), **limits) as (port, admin, process):
        warm = socket.create_connection(("127.0.0.1", port))
        warm.sendall(b"GET /warm HTTP/1.1\r\nHost: bench\r\n\r\n")
        wait_held(admin, 1)
        before = rss_kib(process.pid)
        sockets = [warm]
        request = b"GET /idle HTTP/1.1\r\nHost: bench\r\n\r\n"
        for _ in range(HELD - 1):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(request)
            sockets.append(sock)
        held = wait_held(admin, HELD)
        time.sleep(1)
        after = rss_kib(process.pid)
        for sock in sockets:
            sock.close()
    return held, after - before


def pipelined_memory() -> int:
    """RSS growth (KiB) while PIPELINING_CONNECTIONS each pipeline PIPELINED_BYTES behind a held request."""
    with zeroscale_proxy(refused_port(), ZEROSCALE_PROXY__SIDECAR__PROBE_INTERVAL="0.5") as (port, admin, process):
        warm = socket.create_connection(("127.0.0.1", port))
        warm.sendall(b"GET /warm HTTP/1.1\r\nHost: bench\r\n\r\n")
        wait_held(admin, 1)
        before = rss_kib(process.pid)
        one = b"GET /pipelined HTTP/1.1\r\nHost: bench\r\n\r\n"
        flood = b"GET /held HTTP/1.1\r\nHost: bench\r\n\r\n" + one * (PIPELINED_BYTES // len(one))
        sockets = [warm]
        for _ in range(PIPELINING_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.settimeout(2)
            # The proxy may stop reading: what is left then waits in the kernel's buffers.
            with suppress(TimeoutError):
                sock.sendall(flood)
            sockets.append(sock)
        time.sleep(2)
        after = rss_kib(process.pid)
        for sock in sockets:
            sock.close()
    return after - before


def held_streams_memory() -> tuple[float, int, dict[str, int]]:
    """(g): (streams held, RSS growth in KiB, what the proxy answered instead of holding) while HELD HTTP/2 streams
    wait over H2_CONNECTIONS connections, beyond one held stream before."""
    limits = {
        **H2C_UPSTREAM,
        "ZEROSCALE_PROXY__SIDECAR__LIMITS__MAX_HELD_REQUESTS": str(HELD * 2),
        "ZEROSCALE_PROXY__SIDECAR__LIMITS__HOLD_TIMEOUT": "600",
        "ZEROSCALE_PROXY__SIDECAR__PROBE_INTERVAL": "0.5",
        "ZEROSCALE_PROXY__HTTP2__MAX_CONCURRENT_STREAMS": str(HELD // H2_CONNECTIONS),
    }
    with zeroscale_proxy(refused_port(), **limits) as (port, admin, process):
        return asyncio.run(_hold_streams(port, admin, process.pid))


async def _hold_streams(port: int, admin: int, pid: int) -> tuple[float, int, dict[str, int]]:
    warm, streams = proxy_h2.HeldStreams(), proxy_h2.HeldStreams()
    try:
        await warm.open(port, 1, 1)
        await asyncio.to_thread(wait_held, admin, 1)
        before = rss_kib(pid)
        await streams.open(port, H2_CONNECTIONS, HELD // H2_CONNECTIONS)
        held = await asyncio.to_thread(wait_held, admin, 1 + HELD) - 1
        await asyncio.sleep(1)
        after = rss_kib(pid)
    finally:
        await asyncio.gather(warm.close(), streams.close())
    return held, after - before, {**warm.answered, **streams.answered}


def main() -> None:
    for tool in ("nginx", "wrk", "h2load"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (scripts/setup-system.sh installs it)")
    print(f"(a) warm path: wrk {SECONDS}s per run, {ROUNDS} rounds interleaved", flush=True)
    median = warm_path()
    ratio, added_p50 = compare(median, "connections")

    print(f"(b) wake detection: {WAKE_TRIALS} cold starts, upstream listen() -> first forwarded byte", flush=True)
    upstream_port = refused_port()  # each trial's upstream listens there with SO_REUSEPORT
    with zeroscale_proxy(upstream_port) as (port, _, _):
        delays = asyncio.run(wake_trials(port, upstream_port))
    delays.sort()
    wake_p50 = statistics.median(delays)
    wake_p99 = delays[math.ceil(len(delays) * 0.99) - 1]  # nearest rank
    print(f"wake detection p50 {wake_p50:.1f} ms, p99 {wake_p99:.1f} ms, max {delays[-1]:.1f} ms")

    print(f"(c) memory: {HELD} held idle connections", flush=True)
    held, growth_kib = held_memory()
    growth_mib = growth_kib / 1024
    print(f"held {held:.0f} requests; RSS growth {growth_mib:.1f} MiB ({growth_kib * 1024 / HELD / 1024:.1f} KiB each)")
    print(f"(d) memory: {PIPELINING_CONNECTIONS} connections pipelining {PIPELINED_BYTES // 1024} KiB each", flush=True)
    pipelined_mib = pipelined_memory() / 1024
    print(f"RSS growth {pipelined_mib:.1f} MiB")
    print("(e) activator mode against a real control plane", flush=True)
    with nginx(UPSTREAM) as up:
        result = activator.run(up, wrk, ROUNDS, SECONDS)
    if result is None:
        print("skipped: the control plane is not built (`make e2e` builds it into ~/.cache/zeroscale-k8s)")
        activator_figures = "activator_added_p50_us=n/a switch_p99_ms=n/a"
    else:
        figures = activator.summary(result)
        activator_added = figures["p50_us_1"] - median[("direct", 1)][1]
        print(
            f"warm, app straight with the activator running: c=1 p50 {figures['p50_us_1']:.0f} us (direct in (a): "
            f"{median[('direct', 1)][1]:.0f} us), c=64 {figures['rps_64']:.0f} req/s (direct in (a): "
            f"{median[('direct', 64)][0]:.0f}); the proxy, off the path, spent "
            f"{figures['cpu_ms_per_second']:.1f} ms CPU per second on its own (the Lease, watches): "
            f"{figures['cpu_us_per_request']:.3f} us per request served"
        )
        for to, event in (("pods", "a pod ready"), ("proxy", "spec.replicas 0")):
            print(
                f"switch to {to} ({event} -> the slice lists it), {activator.TRIALS} trials: "
                f"p50 {figures[f'switch_{to}_p50_ms']:.1f} ms, p99 {figures[f'switch_{to}_p99_ms']:.1f} ms"
            )
        switch_p99 = max(figures["switch_pods_p99_ms"], figures["switch_proxy_p99_ms"])
        activator_figures = f"activator_added_p50_us={activator_added:.0f} switch_p99_ms={switch_p99:.1f}"
    print(f"(f) HTTP/2 warm path: h2load {SECONDS}s per run, {ROUNDS} rounds interleaved, h2c", flush=True)
    h2_ratio, h2_added_p50 = compare(h2_path(), "streams")
    print(f"(g) memory: {HELD} held HTTP/2 streams over {H2_CONNECTIONS} connections", flush=True)
    streams, streams_kib, answered = held_streams_memory()
    kib_per_stream = streams_kib / HELD
    print(f"held {streams:.0f} streams; RSS growth {streams_kib / 1024:.1f} MiB ({kib_per_stream:.2f} KiB each)")
    if answered:
        print(f"answered instead of held: {answered}")
    print(f"(h) tracing: wrk {SECONDS}s per run, {ROUNDS} rounds interleaved, off and ratios 0, 0.01, 1", flush=True)
    trace_figures = tracing_cost()
    print(
        f"ratio_vs_nginx={ratio:.2f} added_p50_us={added_p50:.0f} wake_p99_ms={wake_p99:.1f} "
        f"held_10k_rss_mib={growth_mib:.1f} pipelined_rss_mib={pipelined_mib:.1f} {activator_figures} "
        f"h2_ratio_vs_nginx={h2_ratio:.2f} h2_added_p50_us={h2_added_p50:.0f} "
        f"h2_held_kib_per_stream={kib_per_stream:.2f} {trace_figures}"
    )


if __name__ == "__main__":
    main()
