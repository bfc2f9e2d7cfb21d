"""The real HPA controller scales a Deployment on a Redis list's length read through the aggregator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.cluster import (
    ControlPlane,
    Kube,
    external_hpa,
    hpa_condition,
    start_at_zero,
    wait_for,
    wait_hpa_total,
    wait_replicas,
    wait_scaled_to_zero,
)
from tests.e2e.fixtures import Adapter, Timeline
from tests.fixtures.redis_servers import RedisProcess

NAMESPACE, NAME, KEY = "e2e-redis", "worker", "e2e-jobs"
HELD_SYNCS = 3


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
    slept0 = hpa_condition(kube.hpa(NAMESPACE, NAME), "ScaledToZero").get("reason", "none before v1.37")

    jobs.rpush(KEY, *range(30))
    up = wait_replicas(kube, NAMESPACE, NAME, 3)
    woke = wait_scaled_to_zero(kube, NAMESPACE, NAME, "False")
    wait_hpa_total(kube, NAMESPACE, NAME, 30, 10, "the HPA's status shows 30 jobs")

    # `zeroscale explain` (v1.37 rules) reads the same cluster and agrees with the real controller.
    explained = explain(plane, hpa, tmp_path)
    assert (explained["currentReplicas"], explained["desiredReplicas"]) == (3, 3), explained

    jobs.delete(KEY)  # the workers drained the queue
    down = wait_replicas(kube, NAMESPACE, NAME, 0)
    slept = wait_scaled_to_zero(kube, NAMESPACE, NAME, "True")

    jobs.rpush(KEY, *range(5))
    again = wait_replicas(kube, NAMESPACE, NAME, 1)

    if not kube.records_scaled_to_zero():
        timeline.record(f"redis: 0->3 in {up:.1f} s, 3->0 in {down:.1f} s, 0->1 in {again:.1f} s (no ScaledToZero)")
        return
    # A person stops the workload: the HPA did not put it at zero, so it leaves it there, work or not.
    kube.kubectl("scale", "-n", NAMESPACE, "deployment", NAME, "--replicas=0")
    wait_for(
        lambda: hpa_condition(kube.hpa(NAMESPACE, NAME), "ScalingActive").get("reason") == "ScalingDisabled",
        10,
        "the HPA reports ScalingDisabled",
    )
    kept = []
    for _ in range(HELD_SYNCS * 4):  # 0.5 s apart: HELD_SYNCS of the controller's 2 s syncs
        kept.append(kube.replicas(NAMESPACE, NAME))
        time.sleep(0.5)
    status = kube.hpa(NAMESPACE, NAME)
    assert set(kept) == {0}, kept
    assert hpa_condition(status, "ScalingActive")["status"] == "False"
    assert hpa_condition(status, "ScaledToZero")["status"] == "False", "a person's zero is not the HPA's"
    timeline.record(
        f"redis: 1->0 by the HPA (ScaledToZero=True/{slept0}); 0->3 in {up:.1f} s (ScaledToZero=False/{woke}), "
        f"3->0 in {down:.1f} s (ScaledToZero=True/{slept}), 0->1 in {again:.1f} s; `zeroscale explain` agrees at 3; "
        f"`kubectl scale --replicas=0`: ScalingActive=False/ScalingDisabled, left at 0 for {HELD_SYNCS} syncs "
        "with 5 jobs queued"
    )
