"""What the end-to-end tests import: the types their session fixtures yield (tests/e2e/conftest.py), the timeline
each scenario records, and the API connection settings of a token."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.cluster import ControlPlane
from tests.e2e.processes import Zeroscale
from tests.fixtures.kafka_broker import KafkaBroker

_TIMELINES: list[str] = []


class Timeline:
    def record(self, line: str) -> None:
        _TIMELINES.append(line)
        print(line)


class BrokerStart:
    """The broker starts (a JVM: the slowest part) in the background while the control plane comes up.

    The thread that starts it stays alive until stop(): the broker gets SIGTERM when its starting thread
    ends (PR_SET_PDEATHSIG follows the thread, not the process).
    """

    def __init__(self, workdir: Path) -> None:
        self.broker = KafkaBroker(workdir / "kafka")
        self._failure: BaseException | None = None
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.broker.start()
        except BaseException as err:  # reported by wait(), in the test that needs the broker
            self._failure = err
        self._started.set()
        self._stopping.wait()
        self.broker.stop()

    def wait(self) -> KafkaBroker:
        if not self._started.wait(timeout=180) or self._failure is not None:
            raise RuntimeError(f"the Kafka broker did not start ({self._failure}):\n{self.broker.log_tail()}")
        return self.broker

    def stop(self) -> None:
        self._started.wait(timeout=180)
        self._stopping.set()
        self._thread.join(timeout=60)


@dataclass(frozen=True)
class Installed:
    certs: Path
    adapter_token: Path
    proxy_token: Path


def kube_api(plane: ControlPlane, token: Path) -> dict[str, str]:
    return {"url": plane.url, "ca_file": str(plane.pki / "ca.crt"), "token_file": str(token)}


@dataclass(frozen=True)
class Adapter:
    process: Zeroscale
    port: int
    metrics_port: int
    # Seconds from registration to the aggregator's Available=True.
    available_after: float
