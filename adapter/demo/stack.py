"""The servers the demo runs on loopback: Redis, optionally Kafka and Jaeger, the adapter and the proxy, and their
config.

Each has its config file in the run directory (proxy.yaml, zeroscale.yaml for the adapter), and no port is
chosen for another process to bind: see `Ports` (docs/architecture.md#no-port-races). The adapter serves
HTTPS with a certificate from a CA made for this run (`adapter.certs`), so the demo's HPA verifies it as the
kube-aggregator would with a caBundle; authentication is off, on loopback only.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from adapter import certs
from adapter.children import ChildFailed, PortAttempts, log_says, port_outside_ephemeral, wait_ready
from adapter.demo import jaeger
from adapter.demo.processes import Supervisor
from adapter.ready import read_ready_file

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


@dataclass
class Ports:
    """Where the demo's servers listen, filled in as each starts (docs/architecture.md#no-port-races): ours
    bind port 0 and report theirs, Redis and Kafka get ports outside the ephemeral range, and `web`, the one
    port every replica of the web app shares, is held by the demo from the start (`shared_port`)."""

    redis: int = 0
    adapter: int = 0
    adapter_metrics: int = 0
    proxy: int = 0
    proxy_admin: int = 0
    counts: int = 0
    web: int = 0
    kafka: int = 0
    jaeger: jaeger.JaegerPorts | None = None  # with --with-jaeger

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka}"


def tracing_config(ports: Ports) -> dict[str, Any]:
    """With the demo's Jaeger: a trace of every request and answer (ratio 1) sent to it; else none (tracing off)."""
    if ports.jaeger is None:
        return {}
    return {"tracing": {"enabled": True, "endpoint": jaeger.otlp_traces_endpoint(ports.jaeger), "sample_ratio": 1.0}}


def proxy_config(ports: Ports, scaler_port: int) -> dict[str, Any]:
    """The proxy's listeners on port 0 (it reports what it bound); its route to the web app's shared port."""
    return {
        **tracing_config(ports),
        "proxy": {
            "bind": HOST,
            "port": 0,
            "admin_bind": HOST,
            "admin_port": 0,
            "grace_period": "5s",
            "allow_loopback_endpoints": True,  # development mode: the demo's apps are local processes
            "routes": [
                {
                    "name": "web",
                    # Counted as demo/web: the demo's HPA, in namespace demo, reads route=web there.
                    "namespace": NAMESPACE,
                    "upstream": {"address": f"{HOST}:{ports.web}"},
                    # Development mode: the demo's local scaler stands in for the scale subresource.
                    "target": {"kind": "Local", "name": "web", "url": f"http://{HOST}:{scaler_port}"},
                    "wake": "scale",
                    "wake_retry_interval": "1s",
                    "readiness": "probe",
                    "limits": {"hold_timeout": "60s"},
                    # A browser's navigation gets the waking page at once (reloading every second); the demo's
                    # other requests are programs': held until the app answers.
                    "waking_page": {"refresh": 1},
                }
            ],
        },
        "grpc": {"counts": {"enabled": True, "bind": HOST, "port": 0, "heartbeat_interval": "500ms"}},
    }


def adapter_config(ports: Ports, tls_dir: Path, with_kafka: bool) -> dict[str, Any]:
    """Short intervals so one second of HPA sync sees fresh values; everything on loopback, listeners on
    port 0 (it reports what it bound), the proxy's count stream at the port the proxy reported."""
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
        **tracing_config(ports),
        "server": {
            "bind": HOST,
            "port": 0,
            "metrics_bind": HOST,
            "metrics_port": 0,
            "tls": {"cert_file": str(tls_dir / "tls.crt"), "key_file": str(tls_dir / "tls.key")},
            "auth": {"enabled": False},
        },
        "cache": {"interval": "500ms", "max_staleness": "10s"},
        "sources": sources,
        "metrics": metrics,
    }


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text("# Written by `zeroscale demo` for this run.\n" + yaml.safe_dump(document, sort_keys=False))
    return path


async def _start_reporting(supervisor: Supervisor, name: str, command: str, config: Path) -> dict[str, int]:
    """`zeroscale <command>` with `--ready-file`; the ports it bound, once it has bound them all."""
    ready = supervisor.log_dir / f"{name}.ready.json"
    ready.unlink(missing_ok=True)  # `--out` may be a directory an earlier run used
    argv = [sys.executable, "-m", "adapter", "--log-level", "WARNING", command, "--config", str(config)]
    process = await supervisor.start(name, [*argv, "--ready-file", str(ready)])
    log = supervisor.log_dir / f"{name}.log"
    return await wait_ready(process, lambda: read_ready_file(ready), f"zeroscale {command}", log)


async def _start_on_a_free_port(
    supervisor: Supervisor, name: str, argv: Callable[[int], list[str]], says: str, within: float = 60.0
) -> int:
    """Start a server that cannot report its port on one outside the ephemeral range, ready once its log
    `says` so; again on another port if that one was taken. Returns the port."""
    log = supervisor.log_dir / f"{name}.log"
    attempts = PortAttempts(HOST)
    while True:
        port = attempts.port()
        ready = log_says(log, says)
        try:
            await wait_ready(await supervisor.start(name, argv(port)), ready, name, log, within)
            return port
        except ChildFailed as failed:
            attempts.failed(failed)


async def start_redis(supervisor: Supervisor, run_dir: Path, ports: Ports) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError(_REDIS_MISSING)

    def argv(port: int) -> list[str]:
        return [binary, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(run_dir)]

    ports.redis = await _start_on_a_free_port(supervisor, "redis", argv, "Ready to accept connections")


async def start_kafka(supervisor: Supervisor, run_dir: Path, ports: Ports) -> None:
    """One KRaft broker (scripts/kafka/run.sh) and the demo topic; the first run downloads Kafka's jars."""
    if not _KAFKA_RUN.exists():
        raise StackError(f"--with-kafka runs {_KAFKA_RUN}, which is not here: run the demo from a source checkout")
    if shutil.which("java") is None:
        raise StackError("--with-kafka needs Java: run `sudo apt-get install default-jre-headless` (or `make setup`)")

    def argv(port: int) -> list[str]:
        # Its SASL and controller listeners get ports outside the ephemeral range too; one taken is retried.
        others = (port_outside_ephemeral(HOST), port_outside_ephemeral(HOST))
        return [str(_KAFKA_RUN), str(run_dir / "kafka"), *(str(p) for p in (port, *others))]

    ports.kafka = await _start_on_a_free_port(supervisor, "kafka", argv, "Kafka Server started", within=180.0)
    await _create_topic(ports, supervisor.log_dir / "kafka.log")


async def start_jaeger(supervisor: Supervisor, run_dir: Path, ports: Ports) -> None:
    """Jaeger v2 (adapter/demo/jaeger.py), built by scripts/jaeger/build the first time (about 6 minutes, saying
    so on the terminal; cached after), on loopback ports outside the ephemeral range."""
    if not jaeger.BUILD.exists():
        raise StackError(f"--with-jaeger runs {jaeger.BUILD}, which is not here: run the demo from a source checkout")
    build = await asyncio.create_subprocess_exec(str(jaeger.BUILD), stdout=asyncio.subprocess.PIPE)
    out, _ = await build.communicate()  # its progress and errors go to the terminal (stderr)
    if build.returncode != 0:
        raise StackError(f"{jaeger.BUILD} failed (exit {build.returncode}): see its message above")
    binary = out.decode().strip().splitlines()[-1]
    config = run_dir / "jaeger.yaml"

    def argv(port: int) -> list[str]:
        # Its other listeners get ports outside the ephemeral range too; one taken is retried with all anew.
        ports.jaeger = jaeger.JaegerPorts(port, *(port_outside_ephemeral(HOST) for _ in range(3)))
        _write(config, jaeger.jaeger_config(ports.jaeger))
        return [binary, "--config", str(config)]

    await _start_on_a_free_port(supervisor, "jaeger", argv, jaeger.READY_LINE)


async def _create_topic(ports: Ports, log: Path) -> None:
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


async def start_zeroscale(
    supervisor: Supervisor, run_dir: Path, ports: Ports, scaler_port: int, with_kafka: bool
) -> None:
    """The proxy, then the adapter reading its count stream; each reports the ports it bound (written to
    `ports`). Their config files are in the run directory: proxy.yaml and zeroscale.yaml."""
    proxy = _write(run_dir / "proxy.yaml", proxy_config(ports, scaler_port))
    bound = await _start_reporting(supervisor, "proxy", "proxy", proxy)
    ports.proxy, ports.proxy_admin, ports.counts = bound["proxy"], bound["admin"], bound["counts"]
    tls_dir = run_dir / "tls"
    certs.write(certs.issue("zeroscale-demo", NAMESPACE, 1, ["localhost"]), tls_dir)
    adapter = _write(run_dir / "zeroscale.yaml", adapter_config(ports, tls_dir, with_kafka))
    bound = await _start_reporting(supervisor, "adapter", "serve", adapter)
    ports.adapter, ports.adapter_metrics = bound["api"], bound["metrics"]
