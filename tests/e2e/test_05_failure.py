"""The adapter killed while an HPA reads it: the HPA holds its replicas (an error is not a zero); restarted,
scaling resumes."""

from __future__ import annotations

import time

from tests.e2e.cluster import Kube, deployment, external_hpa, hpa_condition, hpa_reads_metric, wait_for, wait_replicas
from tests.e2e.fixtures import Adapter, Timeline
from tests.e2e.install import wait_available
from tests.fixtures.redis_servers import RedisProcess

NAMESPACE, NAME, KEY = "e2e-failure", "worker", "failure-jobs"
# Several of the controller's 2 s syncs.
OUTAGE = 8.0


def test_replicas_are_kept_while_the_adapter_is_down_and_scaling_resumes_after_restart(
    adapter: Adapter, kube: Kube, redis_server: RedisProcess, timeline: Timeline
) -> None:
    jobs = redis_server.client()
    jobs.delete(KEY)
    jobs.rpush(KEY, *range(20))
    kube.namespace(NAMESPACE)
    kube.apply(
        [deployment(NAMESPACE, NAME, replicas=1), external_hpa(NAMESPACE, NAME, "redis-jobs", {"key": KEY}, 10, 5)]
    )
    wait_replicas(kube, NAMESPACE, NAME, 2)

    adapter.process.kill()
    killed = time.monotonic()
    wait_for(
        lambda: hpa_condition(kube.hpa(NAMESPACE, NAME), "ScalingActive").get("reason") == "FailedGetExternalMetric",
        20,
        "the HPA reports it cannot read the metric",
    )
    noticed = time.monotonic() - killed
    jobs.delete(KEY)  # drained meanwhile: the HPA cannot know, and must not guess 0
    kept = []
    while time.monotonic() - killed < OUTAGE:
        kept.append(kube.replicas(NAMESPACE, NAME))
        time.sleep(0.5)
    assert set(kept) == {2}, kept
    assert hpa_condition(kube.hpa(NAMESPACE, NAME), "ScalingActive")["status"] == "False"

    adapter.process.start()
    restarted = time.monotonic()
    wait_available(kube)
    wait_for(lambda: hpa_reads_metric(kube.hpa(NAMESPACE, NAME)), 30, "the HPA reads the metric again")
    wait_replicas(kube, NAMESPACE, NAME, 0)
    resumed = time.monotonic() - restarted
    timeline.record(
        f"failure: adapter SIGKILLed at 2 replicas; HPA noticed in {noticed:.1f} s and kept 2 for {OUTAGE:.0f} s "
        f"(queue drained meanwhile); restarted: 2->0 {resumed:.1f} s after restart"
    )
