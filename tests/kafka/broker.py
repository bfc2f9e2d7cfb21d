"""A real Apache Kafka broker (KRaft) on free loopback ports, run by scripts/kafka/run.sh.

Shared by the tests (tests/kafka/conftest.py) and the benchmark (perf/kafka_bench.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaClient
from aiokafka.errors import CoordinatorNotAvailableError
from aiokafka.protocol.commit import OffsetCommitRequest

from tests.netutil import free_port, wait_for_port

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "kafka"
USER = "zeroscale"
PASSWORD = "zeroscale-secret"  # a test broker's only user, on loopback
_PR_SET_PDEATHSIG = 1


def kafka_jars() -> Path:
    """The jar directory, fetched from Maven Central on first use (cached afterwards)."""
    out = subprocess.run([SCRIPTS / "fetch.sh"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even by SIGKILL, so no broker outlives it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class KafkaBroker:
    """One broker process; stop() and start() again keep its data, ports and users.

    With `tls_dir` (server.pem, ca.pem: see scripts/kafka/run.sh) it also has a TLS listener
    that requires a client certificate.
    """

    def __init__(self, state_dir: Path, tls_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        self.tls_dir = tls_dir
        self.port = free_port()
        self.sasl_port = free_port()
        self.controller_port = free_port()
        self.tls_port = free_port() if tls_dir is not None else None
        self.log_file = state_dir / "broker.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def tls_bootstrap(self) -> str:
        assert self.tls_port is not None, "a broker started without tls_dir"
        return f"127.0.0.1:{self.tls_port}"

    def start(self, timeout: float = 120.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        started = self.log_file.stat().st_size if self.log_file.exists() else 0
        env = {**os.environ, "KAFKA_USER": USER, "KAFKA_PASSWORD": PASSWORD}
        ports = [self.port, self.sasl_port, self.controller_port]
        if self.tls_dir is not None and self.tls_port is not None:
            env["KAFKA_TLS_DIR"] = str(self.tls_dir)
            ports.append(self.tls_port)
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [SCRIPTS / "run.sh", self.state_dir, *map(str, ports)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        # The listener opens before the broker has joined its own quorum; the log says when it serves.
        while b"Kafka Server started" not in self.log_file.read_bytes()[started:]:
            if self._process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self._process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the Kafka broker did not start within {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.1)
        wait_for_port(self.port, timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker (SIGTERM: a clean shutdown; SIGKILL if that hangs)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class Described:
    """One row of `kafka-consumer-groups --describe`; None where it prints `-`."""

    current_offset: int | None
    log_end_offset: int | None
    lag: int | None


def describe_groups(bootstrap: str, groups: list[str]) -> dict[tuple[str, str, int], Described]:
    """Kafka's own `kafka-consumer-groups.sh --describe`, from the same jars: (group, topic, partition)
    -> its CURRENT-OFFSET, LOG-END-OFFSET and LAG columns (the partitions the group committed to)."""
    command = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{kafka_jars()}/*"]
    command += ["org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--bootstrap-server", bootstrap]
    command += ["--describe", *(arg for group in groups for arg in ("--group", group))]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120).stdout
    rows: dict[tuple[str, str, int], Described] = {}
    for line in out.splitlines():
        fields = line.split()
        # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
        if len(fields) >= 6 and fields[0] in groups and fields[2].isdigit():
            current, end, lag = (None if value == "-" else int(value) for value in fields[3:6])
            rows[(fields[0], fields[1], int(fields[2]))] = Described(current, end, lag)
    return rows


async def commit(client: AIOKafkaClient, group: str, topic: str, commits: list[tuple[int, int, str]]) -> None:
    """Commit as a group does, retried while the new broker's coordinator is still loading."""
    for _ in range(50):
        node = await coordinator(client, group)
        response = await client.send(node, OffsetCommitRequest(group, -1, "", -1, [(topic, commits)]))
        if all(error == 0 for _, partitions in response.topics for _, error in partitions):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{group} could not commit")


async def coordinator(client: AIOKafkaClient, group: str) -> int:
    """The group's coordinator; on a new broker the offsets topic is created at the first ask."""
    for _ in range(50):
        try:
            return int(await client.coordinator_lookup(0, group))
        except CoordinatorNotAvailableError:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"no coordinator for {group}")
