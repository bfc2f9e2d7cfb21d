"""Proxy and adapter replicas as real processes (`python -m adapter proxy|serve`) on loopback, for tests and perf.

`start_proxy`'s replicas have one route, `web`, whose upstream is a loopback port nobody listens on: its
connect probes fail, so every request it accepts is held, and the held count is what the adapters report.
`start_sidecar` is sidecar mode beside an app; `start_activator_proxy` a cluster proxy whose route `web` is in
mode activator, reading the Kubernetes API stand-in (tests/kube_standin.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.api.httpclient import fetch
from tests.netutil import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[str, int] = field(default_factory=dict)

    def kill(self) -> None:
        """SIGKILL: the replica vanishes without a goodbye, as a crashed pod does."""
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _spawn(name: str, command: str, config: dict[str, Any], directory: Path, ports: dict[str, int]) -> Process:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = directory / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "adapter", "--log-level", "WARNING", command, "--config", str(path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Process(name, process, log, ports)


def _proxy_ports(*extra: str) -> dict[str, int]:
    return {name: free_port() for name in ("http", "admin", "counts", *extra)}


def _spawn_proxy(name: str, directory: Path, ports: dict[str, int], counts: dict[str, Any], **proxy: Any) -> Process:
    """`zeroscale proxy` on loopback (`ports`: http, admin, counts), with the `proxy:` settings given."""
    listeners = {"bind": "127.0.0.1", "port": ports["http"], "admin_bind": "127.0.0.1", "admin_port": ports["admin"]}
    config = {
        "proxy": {**listeners, "grace_period": 1, **proxy},
        "grpc": {"counts": {"enabled": True, "bind": "127.0.0.1", "port": ports["counts"], **counts}},
    }
    return _spawn(name, "proxy", config, directory, ports)


def start_proxy(name: str, directory: Path, **counts: Any) -> Process:
    web = {
        "name": "web",
        "upstream": {"address": f"127.0.0.1:{free_port()}"},  # nobody listens: requests are held
        "wake": "none",
        "readiness": "probe",
        "probe_interval": 1,
    }
    return _spawn_proxy(name, directory, _proxy_ports(), counts, routes=[web])


_HEARTBEAT = {"heartbeat_interval": 0.2}


def start_sidecar(name: str, directory: Path, app: str, route: str) -> Process:
    """`zeroscale proxy` in sidecar mode: every request to it goes to `app` (host:port), counted under `route`."""
    return _spawn_proxy(name, directory, _proxy_ports(), _HEARTBEAT, sidecar={"upstream": app, "route": route})


def start_activator_proxy(name: str, directory: Path, kube: dict[str, Any], routes: list[Any]) -> Process:
    """A cluster proxy with route `web` in mode activator (its pods: the slices of Service shop/web-pods, port
    `http`; its target: Deployment shop/web) beside `routes`; `kube` is the stand-in's `kubernetes` settings.
    Its `activator` port is ports["web"]."""
    ports = _proxy_ports("web")
    web = {
        "name": "web",
        "hosts": ["web.shop.test"],
        "upstream": {"service": "web-pods", "namespace": "shop", "port": "http"},
        "mode": "activator",
        "activator": {"service": "web", "port": ports["web"]},
        "target": {"namespace": "shop", "name": "web"},
        "wake": "none",
        "readiness": "endpointslice",
    }
    activator = {
        "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale", "port": "http"},
        "lease_namespace": "zeroscale",
    }
    return _spawn_proxy(name, directory, ports, _HEARTBEAT, kubernetes=kube, routes=[web, *routes], activator=activator)


def start_adapter(
    name: str, directory: Path, proxies: list[Process], stale_after: float = 1.5, *, by_dns: bool = False
) -> Process:
    """`zeroscale serve` summing `proxies`' counts: a fixed list, or (`by_dns`) one DNS name each (IP literals:
    each stands for a headless Service of one replica)."""
    ports = {"https": free_port(), "metrics": free_port(), "grpc": free_port()}
    config = {
        "server": {
            "bind": "127.0.0.1",
            "port": ports["https"],
            "metrics_bind": "127.0.0.1",
            "metrics_port": ports["metrics"],
            "auth": {"enabled": False},
        },
        "cache": {"interval": 60},  # only the proxies' pushes refresh the series quickly
        "grpc": {"scaler": {"enabled": True, "bind": "127.0.0.1", "port": ports["grpc"]}},
        "sources": [
            {
                "name": "proxies",
                "type": "http",
                "dns" if by_dns else "proxies": [f"127.0.0.1:{proxy.ports['counts']}" for proxy in proxies],
                "stale_after": stale_after,
                "reconnect_max": 0.2,
            }
        ],
        "metrics": [{"name": "http-requests-pending", "type": "http", "source": "proxies"}],
    }
    return _spawn(name, "serve", config, directory, ports)


def wait_until_listening(processes: list[Process], timeout: float = 60.0) -> None:
    for process in processes:
        for port in process.ports.values():
            try:
                wait_for_port(port, timeout=timeout)
            except TimeoutError:
                raise RuntimeError(f"{process.name} did not start:\n{process.log_tail()}") from None


def stop_all(processes: list[Process]) -> None:
    for process in processes:
        with contextlib.suppress(Exception):
            process.stop()


METRIC_PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/http-requests-pending?labelSelector=route%3Dweb"


async def send_requests(port: int, count: int, host: str = "web.test", path: str = "/") -> list[asyncio.StreamWriter]:
    """Open `count` connections to 127.0.0.1:port, one request each, and leave them waiting for the answer."""
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        writers.append(writer)
    return writers


async def api_value(adapter: Process) -> int:
    """The value the HPA would read from this adapter for route=web; any non-200 answer fails the test."""
    answer = await fetch(adapter.ports["https"], METRIC_PATH)
    assert answer.status == 200, f"{adapter.name} answered {answer.status}: {answer.body!r}"
    return int(answer.json()["items"][0]["value"])
