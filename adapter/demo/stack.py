"""The servers the demo runs on loopback: Redis, optionally Kafka, the adapter and the proxy, and their config.

One config file serves both `zeroscale serve` and `zeroscale proxy` (each reads its own sections). The
adapter serves HTTPS with a certificate from a CA made for this run (`adapter.certs`), so the demo's
HPA verifies it as the kube-aggregator would with a caBundle; authentication is off, on loopback only.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adapter import certs
from adapter.demo.processes import Supervisor

HOST = "127.0.0.1"
NAMESPACE = "demo"
JOBS_KEY = "demo:jobs"
JOBS_DONE_KEY = "demo:jobs:done"
KAFKA_TOPIC = "demo-events"
KAFKA_GROUP = "demo-consumers"
KAFKA_PARTITIONS = 4
_KAFKA_OK, _KAFKA_TOPIC_EXISTS = 0, 36  # Kafka protocol error codes
_KAFKA_RUN = Path(__file__).resolve().parents[2] / "scripts" / "kafka" / "run.sh"
_REDIS_MISSING = "redis-server is not installed: run `sudo apt-get install redis-server` (or `make setup`)"


class StackError(Exception):
    """A server could not be started; the message says which and where its log is."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_for_port(port: int, what: str, log: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            if time.monotonic() > deadline:
                raise StackError(f"{what} is not listening on {HOST}:{port} after {within:g}s; see {log}") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


@dataclass(frozen=True)
class Ports:
    redis: int = field(default_factory=free_port)
    adapter: int = field(default_factory=free_port)
    adapter_metrics: int = field(default_factory=free_port)
    proxy: int = field(default_factory=free_port)
    proxy_admin: int = field(default_factory=free_port)
    counts: int = field(default_factory=free_port)
    web: int = field(default_factory=free_port)
    kafka: int = field(default_factory=free_port)
    kafka_sasl: int = field(default_factory=free_port)
    kafka_controller: int = field(default_factory=free_port)

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka}"


def zeroscale_config(ports: Ports, tls_dir: Path, scaler_port: int, with_kafka: bool) -> dict[str, Any]:
    """Short intervals so one second of HPA sync sees fresh values; everything on loopback."""
    sources: list[dict[str, Any]] = [
        {"name": "redis", "type": "redis", "url": ports.redis_url},
        {"name": "proxies", "type": "http", "proxies": [f"{HOST}:{ports.counts}"], "stale_after": "3s"},
    ]
    metrics: list[dict[str, Any]] = [
        {"name": "demo-jobs", "type": "redis", "source": "redis", "query": "length", "redis_key": JOBS_KEY},
        {"name": "demo-http-pending", "type": "http", "source": "proxies", "count": "pending"},
    ]
    if with_kafka:
        sources.append({"name": "kafka", "type": "kafka", "bootstrap_servers": [ports.kafka_bootstrap]})
        metrics.append(
            {
                "name": "demo-kafka-lag",
                "type": "kafka",
                "source": "kafka",
                # The topic too: the group has not committed yet, so the lag is read per topic
                # (docs/protocols.md#kafka-lag).
                "labels": {"group": {"pattern": "[a-z-]+", "required": True}, "topic": {"pattern": "[a-z-]+"}},
                "lag_threshold": 10,
                # The group has never committed: count every message as lag, so it wakes from zero.
                "offset_reset_policy": "earliest",
            }
        )
    return {
        "server": {
            "bind": HOST,
            "port": ports.adapter,
            "metrics_bind": HOST,
            "metrics_port": ports.adapter_metrics,
            "tls": {"cert_file": str(tls_dir / "tls.crt"), "key_file": str(tls_dir / "tls.key")},
            "auth": {"enabled": False},
        },
        "cache": {"interval": "500ms", "max_staleness": "10s"},
        "proxy": {
            "bind": HOST,
            "port": ports.proxy,
            "admin_bind": HOST,
            "admin_port": ports.proxy_admin,
            "grace_period": "5s",
            "allow_loopback_endpoints": True,  # development mode: the demo's apps are local processes
            "routes": [
                {
                    "name": "web",
                    "upstream": {"address": f"{HOST}:{ports.web}"},
                    # Development mode: the demo's local scaler stands in for the scale subresource.
                    "target": {"kind": "Local", "name": "web", "url": f"http://{HOST}:{scaler_port}"},
                    "wake": "scale",
                    "wake_retry_interval": "1s",
                    "readiness": "probe",
                    "limits": {"hold_timeout": "60s"},
                }
            ],
        },
        "grpc": {"counts": {"enabled": True, "bind": HOST, "port": ports.counts, "heartbeat_interval": "500ms"}},
        "sources": sources,
        "metrics": metrics,
    }


def write_config(run_dir: Path, ports: Ports, scaler_port: int, with_kafka: bool) -> Path:
    tls_dir = run_dir / "tls"
    certs.write(certs.issue("zeroscale-demo", NAMESPACE, 1, ["localhost"]), tls_dir)
    path = run_dir / "zeroscale.yaml"
    document = zeroscale_config(ports, tls_dir, scaler_port, with_kafka)
    path.write_text("# Written by `zeroscale demo` for this run.\n" + yaml.safe_dump(document, sort_keys=False))
    return path


def _zeroscale(*args: str) -> list[str]:
    return [sys.executable, "-m", "adapter", "--log-level", "WARNING", *args]


async def start_redis(supervisor: Supervisor, run_dir: Path, ports: Ports) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError(_REDIS_MISSING)
    argv = [binary, "--bind", HOST, "--port", str(ports.redis), "--save", "", "--appendonly", "no"]
    await supervisor.start("redis", [*argv, "--dir", str(run_dir)])
    await wait_for_port(ports.redis, "redis-server", supervisor.log_dir / "redis.log")


async def start_kafka(supervisor: Supervisor, run_dir: Path, ports: Ports) -> None:
    """One KRaft broker (scripts/kafka/run.sh) and the demo topic; the first run downloads Kafka's jars."""
    if not _KAFKA_RUN.exists():
        raise StackError(f"--with-kafka runs {_KAFKA_RUN}, which is not here: run the demo from a source checkout")
    if shutil.which("java") is None:
        raise StackError("--with-kafka needs Java: run `sudo apt-get install default-jre-headless` (or `make setup`)")
    state = run_dir / "kafka"
    ports_args = [str(p) for p in (ports.kafka, ports.kafka_sasl, ports.kafka_controller)]
    await supervisor.start("kafka", [str(_KAFKA_RUN), str(state), *ports_args])
    log = supervisor.log_dir / "kafka.log"
    await wait_for_port(ports.kafka, "the Kafka broker", log, within=180.0)
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    deadline = time.monotonic() + 60.0
    while True:  # the listener opens a little before the broker accepts admin requests
        admin = AIOKafkaAdminClient(bootstrap_servers=ports.kafka_bootstrap)
        try:
            await admin.start()
            response = await admin.create_topics([NewTopic(KAFKA_TOPIC, KAFKA_PARTITIONS, 1)])
            # Errors come back per topic, not raised; "already exists" is as good as created.
            codes = {error[1] for error in response.topic_errors}
            if codes <= {_KAFKA_OK, _KAFKA_TOPIC_EXISTS}:
                return
            problem = f"error codes {sorted(codes)}"
        except KafkaError as err:
            problem = str(err)
        finally:
            await admin.close()
        if time.monotonic() > deadline:
            raise StackError(f"cannot create the topic {KAFKA_TOPIC}: {problem}; see {log}")
        await asyncio.sleep(0.5)


async def start_zeroscale(supervisor: Supervisor, config: Path, ports: Ports) -> None:
    """The adapter and the proxy, each waited for on its ports."""
    await supervisor.start("adapter", _zeroscale("serve", "--config", str(config)))
    await supervisor.start("proxy", _zeroscale("proxy", "--config", str(config)))
    await wait_for_port(ports.adapter, "zeroscale serve", supervisor.log_dir / "adapter.log")
    await wait_for_port(ports.proxy, "zeroscale proxy", supervisor.log_dir / "proxy.log")
    await wait_for_port(ports.counts, "the proxy's count stream", supervisor.log_dir / "proxy.log")
