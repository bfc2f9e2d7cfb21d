"""A real kube-proxy routes a selector-less Service's ClusterIP to whatever its EndpointSlice lists, and a new
slice reaches new connections within milliseconds: the propagation the activator's switches rely on
(docs/protocols.md#kube-proxy-programming)."""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

from tests.e2e.cluster import Kube, wait_for
from tests.e2e.dataplane import ClientRun, DataPlane
from tests.e2e.fixtures import Timeline
from tests.e2e.pods import Pod, answer_of

NAMESPACE, SERVICE = "e2e-dataplane", "dp-web"
FLIPS = 10


def _slice(pod: Pod) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-by-hand",
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": "e2e.zeroscale.io",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": pod.port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [pod.address], "conditions": {"ready": True}}],
    }


def test_a_slice_written_by_hand_routes_new_connections_within_milliseconds(
    kube: Kube, dataplane: DataPlane, timeline: Timeline
) -> None:
    kube.namespace(NAMESPACE)
    pods = Pod("A"), Pod("B")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},  # no selector: slices by hand
    }
    kube.apply([service, _slice(pods[0])])
    cluster_ip = kube.get(f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")["spec"]["clusterIP"]
    wait_for(lambda: _answered_by(dataplane, f"http://{cluster_ip}/") == "A" or None, 30, "the ClusterIP reaching A")
    delays: list[float] = []
    with dataplane.client(f"{cluster_ip}:80", connections=4, label="flip") as run:
        time.sleep(0.5)
        for flip in range(FLIPS):
            to = pods[(flip + 1) % 2]
            path = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/{SERVICE}-by-hand"
            written = time.time()
            kube.request("PATCH", path, _slice(to), content_type="application/merge-patch+json")
            answered = wait_for(partial(_first_answer_from, run, to.name, written), 10, f"{to.name} answering")
            delays.append((answered - written) * 1000)
            time.sleep(1.2)  # beyond kube-proxy's --min-sync-period (1 s): each change is synced on arrival
    outcomes = run.outcomes()
    failed = [o for o in outcomes if o["status"] != 200]
    timeline.record(
        f"data plane: {len(outcomes)} requests through kube-proxy's ClusterIP over {FLIPS} slice changes, "
        f"{len(failed)} failed; slice written -> first new connection answered by the new pod: "
        f"p50 {statistics.median(delays):.0f} ms, max {max(delays):.0f} ms"
    )
    assert not failed, failed[:5]  # both pods serve throughout: a changed slice loses nothing
    assert max(delays) < 5000
    for pod in pods:
        pod.stop()


def _answered_by(dataplane: DataPlane, url: str) -> str | None:
    status, body = dataplane.get(url)
    return str(answer_of({"body": body}).get("pod")) if status == 200 else None


def _first_answer_from(run: ClientRun, pod: str, after: float) -> float | None:
    """When the first request started after `after` was answered by `pod`."""
    times = [o["ended"] for o in run.outcomes() if o["started"] >= after and answer_of(o).get("pod") == pod]
    return min(times) if times else None
