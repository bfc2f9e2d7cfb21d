"""Real processes for the dashboard tests: `zeroscale serve`, `zeroscale proxy` and Debian's Prometheus.

The proxy reaches the Kubernetes API stand-in (tests/kube_standin.py, a stand-in, not Kubernetes) for its
target's scale subresource and EndpointSlices; its upstream is a plain HTTP server on loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_standin import KubeStandIn
from tests.netutil import free_port, wait_for_port
from tests.proxy.kube_routes import HPAS, SLICES_V1, ScaleStandIn


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Process:
    """A child process whose output goes to a file, shown when a test fails."""

    def __init__(self, name: str, argv: list[str], directory: Path) -> None:
        self.name = name
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=directory)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class Prometheus:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            document = json.load(response)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"] if isinstance(data["result"], list) else [data]
        return result


class Stack:
    """Everything the scripted cold start needs, with the ports it listens on."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[Process] = []
        self.api_port, self.metrics_port, self.scaler_port = free_port(), free_port(), free_port()
        self.proxy_port, self.admin_port, self.prometheus_port = free_port(), free_port(), free_port()
        self.closed_port = free_port()  # nothing listens here: the never-ready upstream
        self.redis_port = free_port()
        self.upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
        self.upstream_port = self.upstream.server_address[1]
        self.prometheus = Prometheus(self.prometheus_port)

    def start(self, kube: KubeStandIn) -> None:
        threading.Thread(target=self.upstream.serve_forever, daemon=True).start()
        # A real Redis for the `jobs` source; the script stops it to make the source fail.
        redis_argv = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        self.redis = Process("redis", [*redis_argv, "--appendonly", "no"], self.directory)
        self.processes.append(self.redis)
        self._wait(self.redis_port)
        config = self.directory / "zeroscale.yaml"
        config.write_text(yaml.safe_dump(self._config(kube)))
        zeroscale = [sys.executable, "-m", "adapter"]
        self.processes.append(Process("adapter", [*zeroscale, "serve", "--config", str(config)], self.directory))
        self.processes.append(Process("proxy", [*zeroscale, "proxy", "--config", str(config)], self.directory))
        for port in (self.api_port, self.metrics_port, self.scaler_port, self.proxy_port, self.admin_port):
            self._wait(port)
        scrape = self.directory / "prometheus.yml"
        scrape.write_text(yaml.safe_dump(self._scrape_config()))
        if shutil.which("prometheus") is None:
            pytest.fail("Debian's prometheus is not installed (scripts/setup-system.sh installs it)")
        self.processes.append(
            Process(
                "prometheus",
                [
                    "prometheus",
                    f"--config.file={scrape}",
                    f"--storage.tsdb.path={self.directory / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                    "--storage.tsdb.retention.time=1h",
                ],
                self.directory,
            )
        )
        self._wait(self.prometheus_port)
        self._wait_for_steady_scrapes()

    def _wait_for_steady_scrapes(self) -> None:
        """Until Prometheus scrapes both targets every second: the first scrapes come late after start."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                counts = self.prometheus.query("count_over_time(up[5s])")
            except OSError:
                counts = []
            if len(counts) == 2 and all(float(series["value"][1]) >= 3 for series in counts):
                return
            time.sleep(0.25)
        raise AssertionError("Prometheus did not settle into scraping both targets every second")

    def _wait(self, port: int) -> None:
        try:
            wait_for_port(port, timeout=30)
        except TimeoutError:
            logs = "\n".join(f"--- {p.name}\n{p.output()}" for p in self.processes)
            raise AssertionError(f"port {port} never opened\n{logs}") from None

    def _config(self, kube: KubeStandIn) -> dict[str, Any]:
        loopback = "127.0.0.1"
        return {
            "server": {
                "bind": loopback,
                "port": self.api_port,
                "metrics_bind": loopback,
                "metrics_port": self.metrics_port,
                "auth": {"enabled": False},
            },
            "cache": {"interval": "1s", "max_staleness": "2s"},
            "grpc": {"scaler": {"enabled": True, "bind": loopback, "port": self.scaler_port}},
            "sources": [
                {"name": "demo", "type": "static", "series": [{"labels": {}, "value": 420}]},
                {"name": "jobs", "type": "redis", "url": f"redis://{loopback}:{self.redis_port}", "timeout": "1s"},
            ],
            "metrics": [
                {"name": "demo-depth", "type": "static", "source": "demo"},
                {"name": "jobs-depth", "type": "redis", "source": "jobs", "query": "length", "redis_key": "jobs"},
            ],
            "proxy": {
                "bind": loopback,
                "port": self.proxy_port,
                "admin_bind": loopback,
                "admin_port": self.admin_port,
                "kubernetes": {"url": kube.url, "token_file": str(kube.token_file)},
                "routes": [
                    {
                        "name": "web",
                        "hosts": ["web"],
                        "upstream": {"service": "web", "namespace": "default", "port": "http"},
                        "target": {"namespace": "default", "kind": "Deployment", "name": "web"},
                        "wake": "scale",
                        "readiness": "endpointslice",
                    },
                    {
                        "name": "idle",
                        "hosts": ["idle"],
                        "upstream": {"address": f"{loopback}:{self.closed_port}"},
                        "wake": "none",
                        "limits": {"hold_timeout": "1s", "max_held_requests": 1},
                    },
                ],
            },
        }

    def _scrape_config(self) -> dict[str, Any]:
        return {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "zeroscale-adapter", "static_configs": [{"targets": [f"127.0.0.1:{self.metrics_port}"]}]},
                {"job_name": "zeroscale-proxy", "static_configs": [{"targets": [f"127.0.0.1:{self.admin_port}"]}]},
            ],
        }

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.upstream.shutdown()
        self.upstream.server_close()

    def wait_until_scraped(self, after: float) -> None:
        """Until both targets were scraped after wall-clock time `after` (and once more, for rates)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            targets = self.prometheus.get("/api/v1/targets")["activeTargets"]
            stamps = [t.get("lastScrape", "") for t in targets if t["health"] == "up"]
            if len(stamps) == 2 and all(_parse(stamp) > after + 2.5 for stamp in stamps):
                return
            time.sleep(0.25)
        raise AssertionError(f"Prometheus did not scrape both targets: {self.prometheus.get('/api/v1/targets')}")


def _parse(stamp: str) -> float:
    from datetime import datetime

    # RFC 3339 with nanoseconds; Python wants at most microseconds.
    head, _, rest = stamp.partition(".")
    fraction = "".join(ch for ch in rest if ch.isdigit())[:6]
    zone = rest[len("".join(ch for ch in rest if ch.isdigit())) :] or "Z"
    return datetime.fromisoformat(f"{head}.{fraction or '0'}{zone.replace('Z', '+00:00')}").timestamp()


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList")
        standin.serve_collection(HPAS, "HorizontalPodAutoscalerList")  # none: the route wakes (wake_without_hpa)
        yield standin


@pytest.fixture(scope="module")
def scale(kube: KubeStandIn) -> ScaleStandIn:
    return ScaleStandIn(kube, "default", "web", replicas=0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, kube: KubeStandIn, scale: ScaleStandIn) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("dashboards"))
    try:
        running.start(kube)
        yield running
    finally:
        running.stop()
