"""A gRPC service at zero behind the proxy: a held call wakes it, and its pod answers it once.

The Deployment's pods are real grpcio servers (tests/e2e/grpc_pod.py), which speak HTTP/2 only, run by the kubelet
stand-in. Its Service's port says `appProtocol: kubernetes.io/h2c`, which the EndpointSlice controller (the stand-in
here) copies into the slices; the route names no protocol, so the call reaching the pod at all proves the proxy took
h2c from there. A grpcio client calls over cleartext HTTP/2 with prior knowledge on the proxy's one port (the one
HTTP/1.1 clients use). The Deployment is at zero, so the call is held; the proxy wakes it through the scale
subresource; the HPA on the route's pending requests (the `http` external metric) reads the held stream and keeps
it at 1; the pod starts but loads its model (NOT_SERVING on grpc.health.v1, so the stand-in's readiness probe keeps
it out of the slices) until the test lets it finish; then the call is forwarded, once, and answered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.cluster import (
    ControlPlane,
    Kube,
    external_hpa,
    start_at_zero,
    wait_for,
    wait_hpa_total,
    wait_replicas,
)
from tests.e2e.file_routes import start_proxy, wake_route
from tests.e2e.fixtures import Adapter, Installed, Timeline
from tests.e2e.grpc_pod import SAY, GrpcPod, answer
from tests.e2e.kubelet_standin import KubeletStandIn
from tests.e2e.processes import Zeroscale

NAMESPACE, NAME, HOST, PORT_NAME = "e2e-grpc", "echo", "echo.e2e-grpc", "grpc"
# Pending requests per replica: the one held call asks for 1 replica, none for 0.
PENDING_PER_REPLICA = 5
CALL_TIMEOUT = 90.0  # sent as grpc-timeout: longer than the whole cold start, so it is not what ends the hold
REQUEST = b"hello from a cold start"


@pytest.fixture
def proxy(
    plane: ControlPlane, kube: Kube, installed: Installed, counts_port: int, workdir: Path
) -> Iterator[Zeroscale]:
    route = wake_route(kube, NAMESPACE, NAME, HOST, PORT_NAME)
    assert "protocol" not in route["upstream"], "the upstream protocol is the Service port's appProtocol's"
    process = start_proxy(plane, installed, counts_port, workdir / "grpc-proxy", [route])
    yield process
    process.stop()


@pytest.fixture
def workload(adapter: Adapter, proxy: Zeroscale, kube: Kube) -> Iterator[KubeletStandIn[GrpcPod]]:
    """The Deployment at zero (its HPA scaled it there, reading the proxy's pending count), its h2c Service, and the
    kubelet stand-in running its pods."""
    kube.namespace(NAMESPACE)
    port = {"name": PORT_NAME, "port": 80, "targetPort": 50051, "appProtocol": "kubernetes.io/h2c"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"selector": {"app": NAME}, "ports": [port]},
    }
    hpa = external_hpa(NAMESPACE, NAME, "http-pending", {"route": NAME}, PENDING_PER_REPLICA, 3)
    start_at_zero(kube, hpa, "the HPA reads the proxy's pending count", service)
    kubelet = KubeletStandIn(kube, NAMESPACE, NAME, NAME, PORT_NAME, pod=GrpcPod, start_delay=0.5, pre_stop=1.0)
    try:
        yield kubelet
    finally:
        kubelet.close()
        kube.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}")
        kube.delete(f"/api/v1/namespaces/{NAMESPACE}/services/{NAME}")


def still_held(call: grpc.Future[bytes]) -> None:
    """Fail at once, saying how, if the call ended while it should be held (a proxy that does not take it as a
    held stream ends it at once: its status and message say why)."""
    if call.done():
        raise AssertionError(f"the call ended while it should be held: {call.exception() or call.result()!r}")


def test_a_held_grpc_call_wakes_the_deployment_and_its_pod_answers_it_once(
    workload: KubeletStandIn[GrpcPod], proxy: Zeroscale, kube: Kube, timeline: Timeline
) -> None:
    # The proxy routes by :authority, which a grpcio channel takes from its target unless told; and it is called
    # directly, whatever http_proxy says.
    options = [("grpc.default_authority", HOST), ("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(f"127.0.0.1:{proxy.port}", options=options) as channel:
        # No serializers: the request and the answer are the bytes on the wire.
        say: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(SAY, None, None)
        sent = time.monotonic()
        call = say.future(REQUEST, timeout=CALL_TIMEOUT)

        def woken() -> bool:  # the proxy patched the scale subresource
            still_held(call)
            return kube.replicas(NAMESPACE, NAME) == 1

        wait_for(woken, 20, f"the proxy woke {NAMESPACE}/{NAME} (0 -> 1)")
        woke = time.monotonic() - sent
        pod = wait_for(lambda: workload.pods[0] if workload.pods else None, 20, "the stand-in started a pod")
        # The HPA reads the held stream through the adapter and keeps the Deployment up (it would scale a
        # Deployment whose metric reads 0 straight back to 0): two more syncs at 1 replica with 1 pending.
        wait_hpa_total(kube, NAMESPACE, NAME, 1, 20, "the HPA sees the held call")
        seen_at = time.monotonic() - sent
        time.sleep(4)
        assert kube.replicas(NAMESPACE, NAME) == 1
        still_held(call)  # the pod is still loading: not ready, in no slice
        assert pod.calls == []

        pod.loaded()
        loaded_at = time.monotonic() - sent
        said = call.result(timeout=60)
        held = time.monotonic() - sent

    assert said == answer(pod.name, REQUEST), said
    assert pod.calls == [REQUEST], "forwarded exactly once"
    assert len(workload.pods) == 1, [p.name for p in workload.pods]
    idle = wait_replicas(kube, NAMESPACE, NAME, 0)  # the call is over: the HPA reads 0 pending
    timeline.record(
        f"grpc: 1 call held over h2c, woke 0->1 in {woke:.2f} s, HPA read the held stream at {seen_at:.1f} s and "
        f"kept 1, pod loaded at {loaded_at:.1f} s, answered after {held:.1f} s in all ({held - loaded_at:.2f} s "
        f"after loading), forwarded once; idle 1->0 in {idle:.1f} s"
    )
