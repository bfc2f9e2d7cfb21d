"""The real HPA controller scales a Deployment on a Redis list's length read through the aggregator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.cluster import (
    ControlPlane,
    Kube,
    external_hpa,
    start_at_zero,
    wait_hpa_total,
    wait_replicas,
)
from tests.e2e.conftest import Adapter, Timeline
from tests.redis.servers import RedisProcess

NAMESPACE, NAME, KEY = "e2e-redis", "worker", "e2e-jobs"


def explain(plane: ControlPlane, manifest: dict[str, Any], directory: Path) -> dict[str, Any]:
    """`zeroscale explain` on the live HPA's manifest, reading scale, pods and the metric through the cluster."""
    path = directory / "hpa.json"
    path.write_text(json.dumps(manifest), encoding="utf-8")
    command = [sys.executable, "-m", "adapter", "explain", "-f", str(path), "-o", "json"]
    done = subprocess.run(
        [*command, "--kubeconfig", str(plane.admin_kubeconfig)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (decision,) = json.loads(done.stdout)
    return dict(decision)


def test_jobs_scale_up_drain_scales_to_zero_and_jobs_wake_from_zero(
    adapter: Adapter, plane: ControlPlane, kube: Kube, redis_server: RedisProcess, tmp_path: Path, timeline: Timeline
) -> None:
    jobs = redis_server.client()
    jobs.delete(KEY)
    kube.namespace(NAMESPACE)
    # 10 jobs per replica (AverageValue), minReplicas 0.
    hpa = external_hpa(NAMESPACE, NAME, "redis-jobs", {"key": KEY}, 10, 5)
    start_at_zero(kube, hpa, "the HPA reads an empty queue")

    jobs.rpush(KEY, *range(30))
    up = wait_replicas(kube, NAMESPACE, NAME, 3)
    wait_hpa_total(kube, NAMESPACE, NAME, 30, 10, "the HPA's status shows 30 jobs")

    # `zeroscale explain` (v1.37 rules) reads the same cluster and agrees with the real controller.
    explained = explain(plane, hpa, tmp_path)
    assert (explained["currentReplicas"], explained["desiredReplicas"]) == (3, 3), explained

    jobs.delete(KEY)  # the workers drained the queue
    down = wait_replicas(kube, NAMESPACE, NAME, 0)

    jobs.rpush(KEY, *range(5))
    again = wait_replicas(kube, NAMESPACE, NAME, 1)
    timeline.record(
        f"redis: 0->3 in {up:.1f} s, 3->0 in {down:.1f} s, 0->1 in {again:.1f} s; `zeroscale explain` agrees at 3"
    )
