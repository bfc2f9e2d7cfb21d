"""Route mode activator against a real control plane (scripts/k8s, built by `make e2e`), for perf/proxy_bench.py.

Our control plane has no kubelet: the bench writes the pods' EndpointSlice (the upstream Service's) and the
proxy's own as kubelet and the EndpointSlice controller would, and scales the Deployment through its scale
subresource as the HPA does. It measures:

- the warm path: wrk straight to the app (as kube-proxy routes the Service once warm) while `zeroscale proxy`
  runs the route in activator mode, warm and leading; and the proxy's CPU meanwhile, per request;
- switch times, each from the event to the Service's slice, as read by a watch of our own: a pod's endpoint
  turning ready -> the slice lists it; the target's spec.replicas set to 0 -> the slice lists the proxy.

Runs a control plane of its own (its own ZS_K8S_HOME and port, the build shared), so an e2e run may go on beside.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILDS = Path.home() / ".cache" / "zeroscale-k8s" / "build"
NAMESPACE = "bench-activator"
TRIALS = 20
_BENCH_API_PORT = 18443  # its etcd takes 18443 - 4064 (scripts/k8s/up)


def built() -> bool:
    return any(BUILDS.glob("*/bin/kube-apiserver"))


@contextmanager
def control_plane(port: int = _BENCH_API_PORT) -> Iterator[Any]:
    """A control plane of the bench's own on `port` (another bench's may run beside it on another port; its etcd
    takes port - 4064); yields tests.e2e.cluster.Kube."""
    home = Path(tempfile.mkdtemp(prefix="zs-bench-k8s-"))
    (home / "build").symlink_to(BUILDS)
    os.environ["ZS_K8S_HOME"], os.environ["ZS_K8S_PORT"] = str(home), str(port)
    # tests.e2e.cluster reads both at import: nothing of tests.e2e may be imported before this point.
    from tests.e2e.cluster import ControlPlane, Kube

    plane = ControlPlane(home)
    plane.up()
    try:
        yield Kube(plane)
    finally:
        plane.down()


def _slice(name: str, service: str, address: str, port: int, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "bench"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}],
    }


def _objects(address: str, upstream: int, proxy_port: int) -> list[dict[str, Any]]:
    def service(name: str, selector: dict[str, str] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        if selector:
            spec["selector"] = selector
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}

    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "example.invalid/web"}]},
            },
        },
    }
    return [
        service("web", None),
        service("web-pods", {"app": "web"}),
        service("zs-proxy", {"app": "zs-proxy"}),
        deployment,
        _slice("web-pods-pod", "web-pods", address, upstream, ready=True),
        _slice("zs-proxy-pod", "zs-proxy", address, proxy_port, ready=True),
    ]


def _proxy_config(kubeconfig: Path, route_port: int, upstream: int) -> dict[str, Any]:
    """Its own listeners on port 0 (it reports what it bound), the route's on `route_port`."""
    return {
        "proxy": {
            "bind": "0.0.0.0",
            "port": 0,
            "admin_bind": "127.0.0.1",
            "admin_port": 0,
            "kubernetes": {"kubeconfig": str(kubeconfig)},
            "activator": {
                "proxy_service": {"service": "zs-proxy", "namespace": NAMESPACE},
                "lease_namespace": NAMESPACE,
                "identity": "bench-proxy",
                "lease_duration": 2,
                "renew_deadline": 1,
                "retry_period": 0.2,
            },
            "routes": [
                {
                    "name": "web",
                    "mode": "activator",
                    "activator": {"service": "web", "port": route_port},
                    "upstream": {"service": "web-pods", "namespace": NAMESPACE, "port": "http"},
                    "target": {"namespace": NAMESPACE, "kind": "Deployment", "name": "web"},
                    "wake": "always",
                    "readiness": "endpointslice",
                }
            ],
        }
    }


class SliceWatch:
    """What the Service `web`'s slices list, as a watch of the bench's own sees it, with when each change came."""

    def __init__(self, kubeconfig: Path) -> None:  # in the running event loop
        from adapter.config.kube import KubeAPIConfig
        from adapter.kube.client import KubeClient

        self._client = KubeClient.from_config(KubeAPIConfig(kubeconfig=kubeconfig))
        self.ports: set[int] = set()
        self.changed = asyncio.Event()
        self._slices: dict[str, dict[str, Any]] = {}

    async def run(self) -> None:
        from adapter.kube.watching import ListWatch, collection_lister

        path = (
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
            "?labelSelector=kubernetes.io%2Fservice-name%3Dweb"
        )
        watch = ListWatch(self._client, collection_lister(self._client, path), "bench", self._seen, lambda _e: False)
        watch.start()
        try:
            await asyncio.Event().wait()
        finally:
            await watch.close()
            await self._client.close()

    def _seen(self, slices: dict[str, dict[str, Any]]) -> None:
        self.ports = {
            int(port["port"]) for item in slices.values() for port in item.get("ports") or [] if item.get("endpoints")
        }
        self.changed.set()

    async def until(self, port: int) -> float:
        """Wait until the slices list `port` (and only it); the time it was seen (time.perf_counter)."""
        while self.ports != {port}:
            self.changed.clear()
            await self.changed.wait()
        return time.perf_counter()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _switch_trials(
    kube: Any, watch: SliceWatch, upstream: int, route_port: int, address: str
) -> dict[str, list[float]]:
    loop = asyncio.get_running_loop()
    pods_path = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/web-pods-pod"
    scale_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/web/scale"
    merge = "application/merge-patch+json"

    async def call(method: str, path: str, body: dict[str, Any], content_type: str = "application/json") -> None:
        await loop.run_in_executor(None, lambda: kube.request(method, path, body, content_type=content_type))

    times: dict[str, list[float]] = {"pods": [], "proxy": []}
    for _ in range(TRIALS):
        # Cold with a replica asked for and no pod ready: the slice lists the proxy.
        await call("PUT", pods_path, _slice("web-pods-pod", "web-pods", address, upstream, ready=False))
        await asyncio.wait_for(watch.until(route_port), 10)
        await asyncio.sleep(0.1)
        # The pod turns ready -> the slice lists it.
        started = time.perf_counter()
        await call("PUT", pods_path, _slice("web-pods-pod", "web-pods", address, upstream, ready=True))
        times["pods"].append(await asyncio.wait_for(watch.until(upstream), 10) - started)
        await asyncio.sleep(0.1)
        # The target scaled to 0 (its pod still ready) -> the slice lists the proxy.
        started = time.perf_counter()
        await call("PATCH", scale_path, {"spec": {"replicas": 0}}, merge)
        times["proxy"].append(await asyncio.wait_for(watch.until(route_port), 10) - started)
        await call("PATCH", scale_path, {"spec": {"replicas": 1}}, merge)
        await asyncio.sleep(0.1)
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(len(ordered) * 0.99) - 1]


def run(
    upstream: int, wrk: Callable[[int, int], tuple[float, float, float]], rounds: int, seconds: float
) -> dict[str, Any] | None:
    """The activator figures, or None when the control plane is not built (`make e2e` builds it)."""
    if not built():
        return None
    from adapter.children import port_outside_ephemeral
    from tests.fixtures.replicas import spawn

    # The route's port is written into the Service's slices: outside the ephemeral range, so no outgoing
    # connection takes it; the proxy's own listeners bind port 0 and report (docs/architecture.md#no-port-races).
    route_port = port_outside_ephemeral()
    with control_plane() as kube, tempfile.TemporaryDirectory(prefix="bench-activator-") as workdir:
        from tests.e2e.test_04_proxy_wake import pod_address  # after control_plane(): see there

        address = pod_address()
        kube.namespace(NAMESPACE)
        kube.apply(_objects(address, upstream, route_port))
        kubeconfig = kube.plane.admin_kubeconfig
        config = Path(workdir, "zeroscale.yaml")
        config.write_text(yaml.safe_dump(_proxy_config(kubeconfig, route_port, upstream)))
        proxy = spawn("proxy", "proxy", Path(workdir), "--config", str(config))
        try:
            admin = proxy.ports["admin"]
            result = asyncio.run(
                _measure(kube, kubeconfig, proxy.process.pid, upstream, route_port, address, wrk, rounds)
            )
            # The proxy is not on the path: what it spends is its own background (Lease renewals every retry_period,
            # watches), given per second of the run and per request the app served meanwhile.
            cpu = result.pop("cpu")
            result["cpu_ms_per_second"] = [spent / seconds * 1000 for spent, _ in cpu]
            result["cpu_us_per_request"] = [spent / (rps * seconds) * 1e6 for spent, rps in cpu]
            result["metrics"] = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
        finally:
            proxy.stop()
    return result


async def _measure(
    kube: Any,
    kubeconfig: Path,
    pid: int,
    upstream: int,
    route_port: int,
    address: str,
    wrk: Callable[[int, int], tuple[float, float, float]],
    rounds: int,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    watch = SliceWatch(kubeconfig)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.until(upstream), 60)  # warm and leading: the written slice lists the pod
        # The app straight (as the Service routes it now), the proxy running beside it.
        warm: list[tuple[int, float, float, float]] = []
        cpu: list[tuple[float, float]] = []
        for _ in range(rounds):
            for connections in (1, 64):
                before = _cpu_seconds(pid)
                figures = await loop.run_in_executor(None, wrk, upstream, connections)
                if connections == 64:
                    cpu.append((_cpu_seconds(pid) - before, figures[0]))
                warm.append((connections, *figures))
        switches = await _switch_trials(kube, watch, upstream, route_port, address)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return {"warm": warm, "cpu": cpu, "switches": switches}


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Medians of the warm runs and p50/p99 of each switch, in ms and us."""
    out: dict[str, float] = {}
    for connections in (1, 64):
        runs = [figures for c, *figures in result["warm"] if c == connections]
        out[f"rps_{connections}"] = statistics.median(run[0] for run in runs)
        out[f"p50_us_{connections}"] = statistics.median(run[1] for run in runs)
    out["cpu_us_per_request"] = statistics.median(result["cpu_us_per_request"])
    out["cpu_ms_per_second"] = statistics.median(result["cpu_ms_per_second"])
    for to, values in result["switches"].items():
        out[f"switch_{to}_p50_ms"] = statistics.median(values) * 1000
        out[f"switch_{to}_p99_ms"] = p99(values) * 1000
    return out
