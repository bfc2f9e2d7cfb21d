"""Benchmark: the external metrics list call over TLS with keep-alive, against nginx serving the same bytes.

    python perf/api_bench.py [--duration 10]

Starts `zeroscale serve` (one process, a static metric, authentication off on loopback,
self-signed certificate) and nginx (1 worker, TLS, the same JSON body as a static file)
on free loopback ports with their own temporary config, then runs wrk against each, at 1
and at 64 connections, interleaved (ours, nginx, ours, nginx). Prints req/s, p50 and p99
for both and the ratios. The last line is `ratio_vs_nginx=<x> p99_ms=<y>` for 64
connections. Goal: ratio >= 0.25, p99 <= 5 ms. The figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapter.api.tls import self_signed  # noqa: E402
from adapter.children import listening, on_a_free_port, wait_ready_blocking  # noqa: E402
from tests.fixtures.replicas import spawn  # noqa: E402

PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/bench-queue-depth"
CONFIG = """\
server:
  bind: 127.0.0.1
  port: {port}
  metrics_bind: 127.0.0.1
  metrics_port: {metrics_port}
  auth: {{enabled: false}}
sources:
  - name: bench
    type: static
    series:
      - labels: {{queue: orders}}
        value: 1500
metrics:
  - name: bench-queue-depth
    type: static
    source: bench
    labels:
      queue: {{pattern: "[a-z]+"}}
"""
NGINX = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
  client_body_temp_path {dir}/tmp;
  proxy_temp_path {dir}/tmp;
  fastcgi_temp_path {dir}/tmp;
  uwsgi_temp_path {dir}/tmp;
  scgi_temp_path {dir}/tmp;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {dir}/tls.crt;
    ssl_certificate_key {dir}/tls.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    root {dir}/www;
    default_type application/json;
  }}
}}
"""
_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


@dataclass
class Run:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    requests: int
    cpu_us_per_request: float = 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (nginx's worker), from /proc."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = 0.0
    for each in [pid, *map(int, children)]:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _latency_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def wrk(url: str, connections: int, seconds: int, server_pid: int) -> Run:
    threads = 1 if connections == 1 else 2
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    cpu_before = cpu_seconds(server_pid)
    output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    cpu = cpu_seconds(server_pid) - cpu_before
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    p50 = re.search(r"^\s+50%\s+(\S+)", output, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.MULTILINE)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    count = re.search(r"(\d+) requests in", output)
    if rate is None or p50 is None or p99 is None or count is None:
        raise RuntimeError(f"cannot read wrk's output:\n{output}")
    if errors is not None:
        raise RuntimeError(f"{url} answered errors under load:\n{output}")
    requests = int(count.group(1))
    return Run(
        float(rate.group(1)), _latency_ms(p50.group(1)), _latency_ms(p99.group(1)), requests, cpu / requests * 1e6
    )


def fetch_body(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{PATH}", context=context, timeout=10) as response:
        body: bytes = response.read()
        return body


def start_adapter(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`zeroscale serve`, its listeners on port 0; returns once it has bound them (its ready file)."""
    config = directory / "zeroscale.yaml"
    config.write_text(CONFIG.format(port=0, metrics_port=0))
    adapter = spawn("adapter", "serve", directory, "--config", str(config))
    return adapter.process, adapter.ports["https"]


def start_nginx(directory: Path, body: bytes) -> tuple[subprocess.Popen[bytes], int]:
    """nginx serving `body` on a port outside the ephemeral range (docs/architecture.md#no-port-races)."""
    cert, key = self_signed(["localhost", "127.0.0.1"])
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    target = directory / "www" / PATH.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_bytes(body)
    (directory / "tmp").mkdir()
    # The nginx worker drops privileges when started as root: let it read this throwaway tree.
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    conf = directory / "nginx.conf"
    log = directory / "nginx.log"

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        conf.write_text(NGINX.format(dir=directory, port=port))
        with log.open("ab") as out:
            process = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(directory)], stderr=out)
        wait_ready_blocking(process, functools.partial(listening, process.pid, port), "nginx", log)
        return process, port

    return on_a_free_port(start)


def stop(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian package {tool})", file=sys.stderr)
            return 2
    directory = Path(tempfile.mkdtemp(prefix="zeroscale-api-bench-"))
    # nginx stops gracefully on SIGQUIT, the adapter on SIGTERM.
    processes: list[tuple[subprocess.Popen[bytes], signal.Signals]] = []
    try:
        adapter, adapter_port = start_adapter(directory)
        processes.append((adapter, signal.SIGTERM))
        body = fetch_body(adapter_port)  # also makes the series cached before measuring
        nginx, nginx_port = start_nginx(directory, body)
        processes.append((nginx, signal.SIGQUIT))
        if fetch_body(nginx_port) != body:
            raise RuntimeError("nginx does not serve the same body")
        print(f"body: {len(body)} bytes; cpus: {os.cpu_count()}; {args.duration}s per run; shared machine")
        results: dict[tuple[str, int], Run] = {}
        for connections in (1, 64):
            for name, port, pid in (("zeroscale", adapter_port, adapter.pid), ("nginx", nginx_port, nginx.pid)):
                run = wrk(f"https://127.0.0.1:{port}{PATH}", connections, args.duration, pid)
                results[(name, connections)] = run
                print(
                    f"{name:>9} c={connections:<3} {run.requests_per_second:>10.0f} req/s"
                    f"  p50 {run.p50_ms:7.3f} ms  p99 {run.p99_ms:7.3f} ms"
                    f"  server CPU {run.cpu_us_per_request:6.1f} us/request",
                    flush=True,
                )
        for connections in (1, 64):
            ours, theirs = results[("zeroscale", connections)], results[("nginx", connections)]
            print(
                f"c={connections}: req/s ratio {ours.requests_per_second / theirs.requests_per_second:.3f}, "
                f"p99 {ours.p99_ms:.3f} ms vs nginx {theirs.p99_ms:.3f} ms, "
                f"CPU/request ratio {ours.cpu_us_per_request / theirs.cpu_us_per_request:.2f}"
            )
        ours, theirs = results[("zeroscale", 64)], results[("nginx", 64)]
        print(f"ratio_vs_nginx={ours.requests_per_second / theirs.requests_per_second:.3f} p99_ms={ours.p99_ms:.3f}")
        return 0
    finally:
        for process, signum in processes:
            stop(process, signum)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
