"""Counting while the proxy is out of the path (route mode activator), with real processes: a cluster proxy
reading the Kubernetes API stand-in, sidecars (`zeroscale proxy` in sidecar mode) in front of real HTTP apps, and
`zeroscale serve` summing them.

A route in mode activator counts what it holds, never what it forwarded: that request is in a pod, where the
sidecar counts it as in flight (or as held while the app's port is not up). So the route's `http` metric is the
cluster proxies' held plus the sidecars' in flight, and a held request forwarded to a sidecar is counted once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from adapter.rpc.generated import externalscaler_pb2 as pb_scaler
from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from tests.fixtures.grpc_servers import ref, scaler_stub
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.replicas import (
    Process,
    api_value,
    send_requests,
    start_activator_proxy,
    start_adapter,
    start_sidecar,
    stop_all,
    wait_until_listening,
)
from tests.fixtures.upstream_app import Upstream

DEPLOYMENTS = r"/apis/apps/v1/namespaces/[^/]+/deployments"
SLOW = "/slow?s=60"  # the app answers after a minute: every request sent stays outstanding for the test
Snapshot = dict[str, tuple[int, int]]


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    """The API the activator route reads: Deployment shop/web at 2 replicas, the EndpointSlices of shop/web-pods
    (none yet: no pod ready) and of the proxy's own Service (none). No Lease can be taken (404): this proxy is
    not the writer, which changes nothing of what it holds, forwards and counts."""
    with KubeStandIn() as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList")
        standin.serve_collection(DEPLOYMENTS, "DeploymentList")
        deployment = {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "web", "namespace": "shop"}}
        standin.put("/apis/apps/v1/namespaces/shop/deployments", {**deployment, "spec": {"replicas": 2}})
        yield standin


def kube_settings(standin: KubeStandIn) -> dict[str, Any]:
    return {"url": standin.url, "ca_file": str(standin.ca_file), "token_file": str(standin.token_file)}


def pods_ready(standin: KubeStandIn, *ports: int) -> None:
    """The pods of shop/web-pods turn ready, one slice per pod (each listens on its own loopback port)."""
    for port in ports:
        pod = endpoint_slice(f"web-pods-{port}", "web-pods", [("127.0.0.1", {"ready": True})], port)
        standin.put(slices_collection("shop"), pod)


@pytest.fixture
async def apps() -> AsyncIterator[list[Upstream]]:
    """Two real HTTP apps, one per pod."""
    started = [await Upstream().start() for _ in range(2)]
    yield started
    for app in started:
        await app.stop()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    stop_all(started)


async def watch_counts(proxy: Process) -> AsyncGenerator[Snapshot]:
    """Every snapshot of one proxy's pending-count stream, as the adapter reads it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.ports['counts']}") as channel:
        stub = pb_grpc.PendingCountsStub(channel)  # type: ignore[no-untyped-call]
        async for message in stub.Watch(pb.WatchRequest()):
            yield {route.route: (route.held, route.inflight) for route in message.routes}


async def until(stream: AsyncIterator[Snapshot], wanted: Callable[[Snapshot], bool], seen: list[Snapshot]) -> None:
    """Read snapshots (kept in `seen`) until one is `wanted`."""
    async with asyncio.timeout(20):
        async for snapshot in stream:
            seen.append(snapshot)
            if wanted(snapshot):
                return


async def requests_reach(apps: list[Upstream], count: int) -> None:
    deadline = time.monotonic() + 20
    while sum(len(app.requests) for app in apps) < count:
        assert time.monotonic() < deadline, f"the apps got {[len(app.requests) for app in apps]}, not {count}"
        await asyncio.sleep(0.01)


async def test_an_activator_route_reports_what_it_holds_not_what_it_forwarded(
    tmp_path: Path, kube: KubeStandIn, apps: list[Upstream], processes: list[Process]
) -> None:
    app = apps[0]
    api = {"name": "api", "hosts": ["api.shop.test"], "upstream": {"address": app.address}, "wake": "none"}
    proxy = start_activator_proxy("cluster-proxy", tmp_path, kube_settings(kube), [{**api, "readiness": "probe"}])
    processes.append(proxy)
    wait_until_listening(processes)
    stream = watch_counts(proxy)
    seen: list[Snapshot] = []
    # No pod ready: the activator route holds what arrives on its listener.
    clients = await send_requests(proxy.ports["web"], 3, host="anything.example", path=SLOW)
    await until(stream, lambda counts: counts.get("shop/web") == (3, 0), seen)
    # A pod turns ready: the proxy forwards the three; they are in the app now, unanswered, and the route
    # reports neither held nor in flight (the pod's sidecar counts them).
    pods_ready(kube, app.port)
    await requests_reach([app], 3)
    # A route in the path counts what it forwarded: the stream does report in-flight requests.
    clients += await send_requests(proxy.ports["http"], 2, host="api.shop.test", path=SLOW)
    await until(stream, lambda counts: counts.get("default/api") == (0, 2), seen)
    await requests_reach([app], 5)
    assert "shop/web" not in seen[-1]  # holding nothing and forwarding nothing: an idle route is left out
    assert max(counts.get("shop/web", (0, 0))[1] for counts in seen) == 0, (
        "the activator route reported what it forwarded"
    )
    await stream.aclose()
    for client in clients:
        client.close()


async def test_pending_is_held_by_the_cluster_proxy_plus_in_flight_in_the_sidecars_and_never_twice(
    tmp_path: Path, kube: KubeStandIn, apps: list[Upstream], processes: list[Process]
) -> None:
    """N held in the cluster proxy, M in flight in each of two sidecars: route web reads N + 2M from its namespace,
    shop (the cluster route's, the sidecars' pods'), and 0 from another. Then the pods turn ready and the proxy
    forwards its N to the sidecars: sampled all the while, the sum never exceeds the N + 2M requests outstanding,
    and ends at N + 2M again, now all in the sidecars."""
    held, each = 20, 3
    outstanding = held + 2 * each
    proxy = start_activator_proxy("cluster-proxy", tmp_path, kube_settings(kube), [])
    sidecars = [start_sidecar(f"sidecar-{i}", tmp_path, app.address, "web", "shop") for i, app in enumerate(apps)]
    processes += [proxy, *sidecars]
    # One DNS name per replica, as the cluster proxies' and the sidecars' headless Services are in a cluster.
    adapter = start_adapter("adapter", tmp_path, [proxy, *sidecars], by_dns=True)
    processes.append(adapter)
    wait_until_listening(processes)
    clients = await send_requests(proxy.ports["web"], held, path=SLOW)
    for sidecar in sidecars:
        clients += await send_requests(sidecar.ports["http"], each, path=SLOW)
    await requests_reach(apps, 2 * each)
    deadline = time.monotonic() + 20
    while (value := await api_value(adapter, "shop")) != outstanding:
        assert time.monotonic() < deadline, f"route web reads {value}, not {held} held + {2 * each} in flight"
        await asyncio.sleep(0.02)
    assert await api_value(adapter) == 0  # route web of namespace default: none of shop's

    samples: list[int] = []
    moved = asyncio.Event()

    async def sample() -> None:
        """As fast as the adapter answers: KEDA's GetMetrics on one open channel reads the same cache."""
        request = pb_scaler.GetMetricsRequest(
            scaledObjectRef=ref(metric="http-requests-pending", selector="route=web", owner="shop"),
            metricName="http-requests-pending",
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.ports['grpc']}") as channel:
            stub = scaler_stub(channel)
            while not moved.is_set():
                answer = await stub.GetMetrics(request)
                samples.append(int(answer.metricValues[0].metricValueFloat))

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(0.2)
    before = len(samples)
    pods_ready(kube, *(sidecar.ports["http"] for sidecar in sidecars))
    await requests_reach(apps, outstanding)  # the held ones went through the sidecars to the apps
    await asyncio.sleep(1)  # long past the last count message of the move: the adapter's sum is settled
    moved.set()
    await sampler
    during = samples[before:]
    assert len(during) > 50, f"only {len(during)} samples while the requests moved"
    assert max(samples) <= outstanding, f"counted twice while moving: {sorted(set(during))}"
    assert await api_value(adapter, "shop") == outstanding  # all in flight in the sidecars now, counted there alone
    for client in clients:
        client.close()
