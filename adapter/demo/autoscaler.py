"""The demo's HPAs: adapter/hpa's v1.37 controller, fed by the adapter's external metrics API over HTTPS.

Each sync reads every External metric with the list call the HPA makes (adapter/hpa/fetch.py), then
the local workload's replicas, and applies the decision to the workload. The manifests are written to
the run directory, so `zeroscale explain -f` can be pointed at them while the demo runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adapter.demo.stack import KAFKA_GROUP, KAFKA_TOPIC, NAMESPACE
from adapter.demo.workloads import LocalWorkload
from adapter.hpa import Decision, HorizontalController, HPAManifest, MetricFailure, MetricReading, parse_manifests
from adapter.hpa.fetch import read_external_metric
from adapter.hpa.spec import ExternalMetric
from adapter.kube.client import KubeClient


@dataclass(frozen=True)
class Timing:
    """The short clock the demo runs on (a cluster's defaults: 15 s sync, 300 s down-window)."""

    sync_period: float = 1.0
    scale_down_window: int = 5
    policy_period: int = 1


def _hpa(name: str, metric: str, selector: str, target: str, max_replicas: int, timing: Timing) -> str:
    return f"""apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}
  minReplicas: 0
  maxReplicas: {max_replicas}
  metrics:
    - type: External
      external:
        metric: {{name: {metric}{selector}}}
        target: {{type: AverageValue, averageValue: "{target}"}}
  behavior:
    scaleUp:
      stabilizationWindowSeconds: 0
      policies: [{{type: Pods, value: 4, periodSeconds: {timing.policy_period}}}]
    scaleDown:
      stabilizationWindowSeconds: {timing.scale_down_window}
      policies: [{{type: Percent, value: 100, periodSeconds: {timing.policy_period}}}]
"""


def hpa_manifests(timing: Timing, with_kafka: bool) -> str:
    """AverageValue targets (they need no pod readiness) and a Pods scale-up policy (docs/protocols.md#hpa-replica-math,
    docs/protocols.md#hpa-behavior traps)."""
    documents = [
        _hpa("web", "demo-http-pending", ", selector: {matchLabels: {route: web}}", "10", 4, timing),
        _hpa("worker", "demo-jobs", "", "5", 4, timing),
    ]
    if with_kafka:
        selector = f", selector: {{matchLabels: {{group: {KAFKA_GROUP}, topic: {KAFKA_TOPIC}}}}}"
        documents.append(_hpa("consumer", "demo-kafka-lag", selector, "10", 4, timing))
    return "---\n".join(documents)


def load_hpas(text: str) -> list[HPAManifest]:
    return parse_manifests(text, "demo HPAs", NAMESPACE)


@dataclass(frozen=True)
class Reading:
    """What one sync saw and did."""

    at: float
    hpa: str
    value: float | None  # the metric's value (None: it could not be read)
    decision: Decision


class LocalHPA:
    """One HPA driving one local workload; a fresh one starts with ScaledToZero=True (it "scaled it to zero")."""

    def __init__(self, manifest: HPAManifest, workload: LocalWorkload, client: KubeClient) -> None:
        self.spec = manifest.spec
        self.workload = workload
        self._client = client
        # Under v1.37 an HPA wakes only a workload it scaled to zero itself (docs/protocols.md#hpa-scale-to-zero); ours
        # start at zero.
        self.controller = HorizontalController(manifest.spec, scaled_to_zero=True)
        self.last: Reading | None = None

    async def sync(self, now: float) -> Reading:
        readings: list[MetricReading] = []
        for metric in self.spec.metrics:
            assert isinstance(metric, ExternalMetric), "the demo's HPAs use External metrics only"
            readings.append(await read_external_metric(self._client, self.spec.namespace, metric))
        workload = self.workload
        decision = self.controller.sync(
            now, workload.spec_replicas, workload.status_replicas, workload.ready_replicas, readings
        )
        if decision.rescale:
            workload.scale(decision.desired_replicas)
        first = readings[0]
        value = None if isinstance(first, MetricFailure) else first / 1000
        self.last = Reading(now, self.spec.name, value, decision)
        return self.last


async def run_hpas(
    hpas: Mapping[str, LocalHPA], period: float, clock: Callable[[], float], on_sync: Callable[[Reading], None]
) -> None:
    """Sync every HPA each `period` seconds (concurrently, like the controller's workers), until cancelled."""
    next_at = time.monotonic()
    while True:
        now = clock()
        for reading in await asyncio.gather(*(hpa.sync(now) for hpa in hpas.values())):
            on_sync(reading)
        next_at += period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
