"""Real Redis processes for the tests: Debian's redis-server and redis-sentinel on free loopback ports."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from tests.netutil import free_port, wait_for_port

HOST = "127.0.0.1"


def require_binaries() -> None:
    for binary in ("redis-server", "redis-sentinel", "redis-cli"):
        if shutil.which(binary) is None:
            raise RuntimeError(f"{binary} is not installed: run scripts/setup-system.sh (Debian package redis)")


class RedisProcess:
    """One redis-server (or redis-sentinel) started with a config file in its own directory."""

    def __init__(self, workdir: Path, lines: Sequence[str], sentinel: bool = False, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.dir = workdir / f"{'sentinel' if sentinel else 'redis'}-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sentinel = sentinel
        self.lines = list(lines)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait_port: int | None = None) -> RedisProcess:
        config = self.dir / ("sentinel.conf" if self.sentinel else "redis.conf")
        base = [
            f"bind {HOST}",
            f"dir {self.dir}",
            "daemonize no",
            "protected-mode no",
            f"logfile {self.dir / 'log.txt'}",
        ]
        if not self.sentinel:
            base += ['save ""', "appendonly no"]
        if not any(line.startswith("port ") for line in self.lines):
            base.append(f"port {self.port}")
        config.write_text("\n".join(base + self.lines) + "\n", encoding="utf-8")
        binary = "redis-sentinel" if self.sentinel else "redis-server"
        self.process = subprocess.Popen([binary, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                wait_for_port(wait_port if wait_port is not None else self.port, timeout=0.2)
                return self
            except TimeoutError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{binary} did not start; its log:\n{self.log()}") from None

    def log(self) -> str:
        path = self.dir / "log.txt"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, decode_responses=True, **kwargs)  # type: ignore[arg-type]

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def wait_until(condition: object, timeout: float = 20.0, interval: float = 0.05) -> None:
    """Poll a callable until it returns a true value (setup steps such as replication or failover)."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout:g}s")
        time.sleep(interval)


def create_cluster(nodes: Sequence[RedisProcess]) -> None:
    addresses = [node.address for node in nodes]
    subprocess.run(
        ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )

    def converged() -> bool:
        clients: list[Any] = [node.client() for node in nodes]
        return all(client.execute_command("CLUSTER INFO")["cluster_state"] == "ok" for client in clients)

    wait_until(converged)
