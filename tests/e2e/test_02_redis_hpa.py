"""The real HPA controller scales a Deployment on a Redis list's length read through the aggregator."""

from __future__ import annotations

from tests.e2e.cluster import (
    Kube,
    deployment,
    external_hpa,
    hpa_metric_total,
    hpa_reads_metric,
    wait_for,
    wait_replicas,
)
from tests.e2e.conftest import Adapter, Timeline
from tests.redis.servers import RedisProcess

NAMESPACE, NAME, KEY = "e2e-redis", "worker", "e2e-jobs"


def test_jobs_scale_up_drain_scales_to_zero_and_jobs_wake_from_zero(
    adapter: Adapter, kube: Kube, redis_server: RedisProcess, timeline: Timeline
) -> None:
    jobs = redis_server.client()
    jobs.delete(KEY)
    kube.namespace(NAMESPACE)
    # 10 jobs per replica (AverageValue), minReplicas 0.
    kube.apply([deployment(NAMESPACE, NAME), external_hpa(NAMESPACE, NAME, "redis-jobs", {"key": KEY}, 10, 5)])
    wait_for(lambda: hpa_reads_metric(kube.hpa(NAMESPACE, NAME)), 30, "the HPA reads an empty queue")
    wait_replicas(kube, NAMESPACE, NAME, 0)

    jobs.rpush(KEY, *range(30))
    up = wait_replicas(kube, NAMESPACE, NAME, 3)
    wait_for(lambda: hpa_metric_total(kube.hpa(NAMESPACE, NAME)) == 30, 10, "the HPA's status shows 30 jobs")

    jobs.delete(KEY)  # the workers drained the queue
    down = wait_replicas(kube, NAMESPACE, NAME, 0)

    jobs.rpush(KEY, *range(5))
    again = wait_replicas(kube, NAMESPACE, NAME, 1)
    timeline.record(f"redis: 0->3 in {up:.1f} s, 3->0 in {down:.1f} s, 0->1 in {again:.1f} s")
