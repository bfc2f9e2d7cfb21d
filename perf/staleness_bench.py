"""Benchmark: how stale the proxy's view of Kubernetes can get, and how fast the activator repairs its own slices
(docs/architecture.md#staleness-bounds).

    python perf/staleness_bench.py [--rounds 3] [--repairs 20] [--silence 30] [--resync 30]

A proxy in-process with one activator route, against the Kubernetes stand-in (tests/fixtures/kube_standin.py),
with the given kubernetes.watch_silence_timeout and activator.resync_interval (the defaults by default) and
the default client timeout (10 s).

- Staleness, each round: just after the activator's resync (it lists its inputs again, so their watches have just
  been opened: the worst moment, both the silence timeout and the next resync are as far as they get), every watch
  of EndpointSlices goes silent (open, nothing sent, lists still fresh) and the pod is replaced. Timed: until the
  route stops routing to the old pod, and until the activator's Service stops listing it. Between rounds the
  watches speak again.
- Repair, each round: the activator's slice is deleted; timed until it is back.

Prints each figure's worst and median, and last `staleness_max_s=<x> repair_p50_ms=<y> repair_max_ms=<z>`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapter.children import port_outside_ephemeral  # noqa: E402
from adapter.config.proxy import ProxyConfig  # noqa: E402
from adapter.kube.client import KubeClient  # noqa: E402
from adapter.proxy.app import Proxy  # noqa: E402
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice, slices_collection  # noqa: E402
from tests.fixtures.kube_standin import KubeStandIn  # noqa: E402

SERVICES = "/api/v1/namespaces/default/services"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
SLICES, PROXY_SLICES = slices_collection("default"), slices_collection("zeroscale")
OURS = "web-zeroscale-0"


def seed(kube: KubeStandIn) -> None:
    for pattern, kind in (
        (SLICES_V1, "EndpointSliceList"),
        (r"/apis/apps/v1/namespaces/[^/]+/deployments", "DeploymentList"),
        (r"/api/v1/namespaces/[^/]+/services", "ServiceList"),
        (r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases", "LeaseList"),
    ):
        kube.serve_collection(pattern, kind, writable=True)
    kube.put(DEPLOYMENTS, {"metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": 1}})
    kube.put(SERVICES, {"metadata": {"name": "web", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}})
    kube.put(SLICES, pods("10.0.0.0"))
    proxies = endpoint_slice("zeroscale-proxy-x", "zeroscale-proxy", [("10.1.0.7", {"ready": True})], 8080)
    proxies["metadata"]["namespace"] = "zeroscale"
    kube.put(PROXY_SLICES, proxies)


def pods(address: str) -> dict[str, Any]:
    return endpoint_slice("web-pods-abcde", "web-pods", [(address, {"ready": True})], 8080)


def service_lists(kube: KubeStandIn) -> list[str]:
    body = kube.get(SLICES, OURS)
    return [address for endpoint in (body or {}).get("endpoints", []) for address in endpoint["addresses"]]


async def until(condition: Callable[[], bool], within: float) -> float:
    """Seconds until `condition` held."""
    started = time.monotonic()
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - state set from callbacks and another thread
            await asyncio.sleep(0.002)
    return time.monotonic() - started


def resyncs(kube: KubeStandIn) -> int:
    """The Service read by itself: each resync, once its inputs were listed again."""
    return sum(1 for method, path, _ in kube.requests if method == "GET" and path == f"{SERVICES}/web")


async def run(args: argparse.Namespace) -> None:
    with KubeStandIn(tls=False, token="t") as kube:
        seed(kube)
        client = KubeClient.from_config(kube.client_config(watch_silence_timeout=args.silence, timeout=10.0))
        route = {
            "name": "web",
            "upstream": {"service": "web-pods", "namespace": "default", "port": "http"},
            "mode": "activator",
            "activator": {"service": "web", "port": port_outside_ephemeral()},
            "target": {"namespace": "default", "kind": "Deployment", "name": "web"},
            "wake": "none",
            "readiness": "endpointslice",
        }
        activator = {
            "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
            "lease_namespace": "zeroscale",
            "identity": "bench",
            "resync_interval": args.resync,
        }
        config = ProxyConfig(
            bind="127.0.0.1", port=0, admin_bind="127.0.0.1", admin_port=0, routes=[route], activator=activator
        )
        server = Proxy(config, kube=client)
        await server.start()
        web = server.routes["default/web"]
        limit = 10 * max(args.silence, args.resync)
        try:
            await until(lambda: service_lists(kube) == ["10.0.0.0"], within=30)
            route_stale, service_stale = [], []
            for round_ in range(1, args.rounds + 1):
                done = resyncs(kube)
                await until(lambda: resyncs(kube) > done, within=limit)  # noqa: B023 - awaited here
                speak = kube.silence_watches(SLICES_V1)
                new = f"10.0.0.{round_}"
                kube.put(SLICES, pods(new))
                started = time.monotonic()
                await until(lambda: [ep.host for ep in web.endpoints] == [new], within=limit)  # noqa: B023
                route_stale.append(time.monotonic() - started)
                await until(lambda: service_lists(kube) == [new], within=limit)  # noqa: B023
                service_stale.append(time.monotonic() - started)
                speak()
                print(f"round {round_}: route {route_stale[-1]:.2f} s, Service {service_stale[-1]:.2f} s", flush=True)
            wanted = service_lists(kube)
            repairs = []
            for _ in range(args.repairs):
                kube.delete(SLICES, OURS)
                repairs.append(await until(lambda: service_lists(kube) == wanted, within=limit) * 1000)
                await asyncio.sleep(0.05)
        finally:
            await server.shutdown(grace=0)
            await client.close()
    staleness = max(route_stale + service_stale)
    print(f"route stale: max {max(route_stale):.2f} s, median {statistics.median(route_stale):.2f} s")
    print(f"Service stale: max {max(service_stale):.2f} s, median {statistics.median(service_stale):.2f} s")
    print(f"slice repair: p50 {statistics.median(repairs):.1f} ms, max {max(repairs):.1f} ms")
    print(
        f"staleness_max_s={staleness:.2f} repair_p50_ms={statistics.median(repairs):.1f} "
        f"repair_max_ms={max(repairs):.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repairs", type=int, default=20)
    parser.add_argument("--silence", type=float, default=30.0, help="kubernetes.watch_silence_timeout")
    parser.add_argument("--resync", type=float, default=30.0, help="proxy.activator.resync_interval")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
