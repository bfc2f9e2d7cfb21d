"""The proxy holds requests for a Deployment at zero, wakes it through the real scale subresource, sees the
endpoint through its real EndpointSlice watch and forwards; an HPA on its pending count keeps it up meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.cluster import (
    ENDPOINTSLICE_API,
    ControlPlane,
    Kube,
    deployment,
    external_hpa,
    hpa_condition,
    hpa_reads_metric,
    start_at_zero,
    wait_for,
    wait_hpa_total,
    wait_replicas,
)
from tests.e2e.file_routes import start_proxy, wake_route
from tests.e2e.fixtures import Adapter, Installed, Timeline
from tests.e2e.install import endpoint_slice
from tests.e2e.processes import Zeroscale
from tests.fixtures.redis_servers import RedisProcess

NAMESPACE, NAME, HOST = "e2e-proxy", "web", "web.e2e-proxy"
# A second workload, which a person stops: its HPA reads a Redis list.
STOPPED, STOPPED_HOST, STOPPED_KEY = "stopped", "stopped.e2e-proxy", "e2e-stopped-jobs"
HELD = 3
# Pending requests per replica: 3 held requests ask for 1 replica, none for 0.
PENDING_PER_REPLICA = 5


def pod_address() -> str:
    """This machine's address on its default route: an EndpointSlice may not name a loopback address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # a UDP connect picks the route and sends nothing
        except OSError:
            pytest.skip("no non-loopback IPv4 address for the pod's EndpointSlice")
        return str(probe.getsockname()[0])


class Upstream(ThreadingHTTPServer):
    """The workload's pod, on this machine's own address: answers every GET and counts what arrived."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((pod_address(), 0), _Handler)
        self.paths: list[str] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
        body = f"served {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(
    plane: ControlPlane, kube: Kube, installed: Installed, counts_port: int, workdir: Path
) -> Iterator[Zeroscale]:
    route = wake_route(kube, NAMESPACE, NAME, HOST, "http")
    stopped = {
        **route,
        "name": STOPPED,
        "hosts": [STOPPED_HOST],
        "upstream": {**route["upstream"], "service": STOPPED},
        "target": {**route["target"], "name": STOPPED},
    }
    process = start_proxy(plane, installed, counts_port, workdir / "proxy", [route, stopped])
    yield process
    process.stop()


def _get(port: int, path: str, host: str = HOST) -> tuple[int, bytes, float]:
    start = time.monotonic()
    connection = HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        connection.request("GET", path, headers={"Host": host})
        response = connection.getresponse()
        return response.status, response.read(), time.monotonic() - start
    finally:
        connection.close()


def test_held_requests_wake_the_deployment_and_are_forwarded_once_an_endpoint_is_ready(
    adapter: Adapter, kube: Kube, upstream: Upstream, proxy: Zeroscale, timeline: Timeline
) -> None:
    kube.namespace(NAMESPACE)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"selector": {"app": NAME}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }
    hpa = external_hpa(NAMESPACE, NAME, "http-pending", {"route": NAME}, PENDING_PER_REPLICA, 3)
    start_at_zero(kube, hpa, "the HPA reads the proxy's pending count", service)

    with ThreadPoolExecutor(HELD) as pool:
        sent = time.monotonic()
        answers: list[Future[tuple[int, bytes, float]]] = [
            pool.submit(_get, proxy.port, f"/order/{n}") for n in range(HELD)
        ]
        woke = wait_replicas(kube, NAMESPACE, NAME, 1, timeout=20)  # the proxy patched the scale subresource
        # The HPA reads the held requests through the adapter and keeps the Deployment up (it would scale a
        # Deployment whose metric reads 0 straight back to 0): two syncs at 1 replica with 3 pending.
        wait_hpa_total(kube, NAMESPACE, NAME, HELD, 20, "the HPA sees 3 pending")
        time.sleep(4)
        assert kube.replicas(NAMESPACE, NAME) == 1
        assert not any(answer.done() for answer in answers), "no endpoint yet: every request is still held"
        assert upstream.paths == []

        # What kubelet and the EndpointSlice controller do once the pod is Ready.
        address, port = str(upstream.server_address[0]), int(upstream.server_address[1])
        kube.apply([endpoint_slice(NAMESPACE, f"{NAME}-pod", NAME, "http", address, port)])
        endpoint_at = time.monotonic() - sent
        results = [answer.result(timeout=60) for answer in answers]

    lost = sum(1 for status, _, _ in results if status != 200)
    assert lost == 0, results
    assert sorted(body for _, body, _ in results) == [f"served /order/{n}".encode() for n in range(HELD)]
    assert sorted(upstream.paths) == [f"/order/{n}" for n in range(HELD)], "each forwarded exactly once"
    held = max(elapsed for _, _, elapsed in results)

    idle = wait_replicas(kube, NAMESPACE, NAME, 0)  # traffic stopped: the HPA reads 0 pending
    kube.delete(f"/apis/{ENDPOINTSLICE_API}/namespaces/{NAMESPACE}/endpointslices/{NAME}-pod")
    timeline.record(
        f"proxy: {HELD} requests held, woke 0->1 in {woke:.2f} s, HPA kept 1 on 3 pending, endpoint ready at "
        f"{endpoint_at:.1f} s, held {held:.1f} s in all, lost {lost}; idle 1->0 in {idle:.1f} s"
    )


def test_a_workload_a_person_stopped_is_not_woken_and_the_requests_say_how_to_start_it(
    adapter: Adapter, kube: Kube, redis_server: RedisProcess, proxy: Zeroscale, timeline: Timeline
) -> None:
    """v1.37's HPA leaves a workload a person scaled to zero where it is (ScalingActive=False, ScalingDisabled;
    ScaledToZero not True); the proxy, listing that HPA before it would patch, does not wake it either and
    answers at once."""
    if not kube.records_scaled_to_zero():
        pytest.skip("before v1.37 the HPA records no ScaledToZero (routes use wake: always there)")
    jobs = redis_server.client()
    jobs.delete(STOPPED_KEY)
    jobs.rpush(STOPPED_KEY, *range(5))  # work waiting: 1 replica's worth
    kube.namespace(NAMESPACE)
    kube.apply(
        [
            deployment(NAMESPACE, STOPPED, replicas=1),
            external_hpa(NAMESPACE, STOPPED, "redis-jobs", {"key": STOPPED_KEY}, 10, 3),
        ]
    )
    wait_for(lambda: hpa_reads_metric(kube.hpa(NAMESPACE, STOPPED)), 30, "the HPA reads the queue")

    kube.kubectl("scale", "-n", NAMESPACE, "deployment", STOPPED, "--replicas=0")
    wait_for(
        lambda: hpa_condition(kube.hpa(NAMESPACE, STOPPED), "ScalingActive").get("reason") == "ScalingDisabled",
        10,
        "the HPA reports ScalingDisabled",
    )
    status, body, elapsed = _get(proxy.port, "/anything", STOPPED_HOST)
    text = body.decode()
    assert status == 503, text
    assert f"Deployment {NAMESPACE}/{STOPPED} was stopped by hand" in text
    assert f"kubectl scale -n {NAMESPACE} deployment/{STOPPED} --replicas=1" in text
    time.sleep(2.5)  # one more HPA sync: neither woke it
    assert kube.replicas(NAMESPACE, STOPPED) == 0
    timeline.record(
        f"proxy, stopped by hand: HPA ScalingActive=False/ScalingDisabled with 5 jobs queued; a request answered "
        f"503 in {elapsed:.2f} s ({text.split(':')[0]}), target left at 0"
    )
