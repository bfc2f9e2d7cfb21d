"""Benchmark: what reading a namespace's HPAs before a wake costs the proxy's event loop.

    python perf/hpa_list_bench.py [--hpas 5000] [--rounds 8]

`wake: scale` lists the HPAs of the target's namespace before each patch (docs/architecture.md#wake), in pages of
500. The HPAs (realistic: managedFields, the last-applied annotation; ~2.3 KB each) are served from another process,
so the server's own work does not hold this one. Per round it measures the longest event-loop stall while
the list is read, with a 1 ms ticker: read as the proxy reads it (list_hpas: pages, five facts kept per HPA), and,
for comparison, in one answer of every HPA with the objects kept (how the first version read it). Prints the
medians and last `hpa_list_stall_p50_ms=<paged>`. Goal: at 5000 HPAs, at most half the stall of one answer (on
the loaded 2-core machine: 234-254 ms in one answer, 84-120 ms paged). What is left beyond one page's parse (~20 ms)
is mostly the garbage collector's full passes, which grow with what the whole list allocates, not with a page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapter.config.kube import KubeAPIConfig  # noqa: E402
from adapter.kube.client import KubeClient  # noqa: E402
from adapter.kube.hpas import hpas_path, list_hpas  # noqa: E402
from tests.fixtures.kube_routes import hpa  # noqa: E402


def realistic(i: int) -> dict[str, Any]:
    """An HPA as `kubectl get -o json` shows one applied with kubectl and synced by the controller."""
    obj = hpa(f"hpa-{i:05}", f"web-{i}", "True")
    status_fields: dict[str, object] = {"f:conditions": {".": {}}, "f:desiredReplicas": {}, "f:currentMetrics": {}}
    obj["metadata"]["managedFields"] = [
        {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "autoscaling/v2",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:maxReplicas": {}, "f:metrics": {}, "f:minReplicas": {},
                                                          "f:scaleTargetRef": {}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "autoscaling/v2",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:status": status_fields}, "subresource": "status"},
    ]  # fmt: skip
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj["spec"])}
    return obj


def serve(count: int, ports: multiprocessing.Queue[int]) -> None:
    """The HPA collection, paged as the API server pages it (`limit`, `continue`), answers built once each."""
    items = [realistic(i) for i in range(count)]
    answers: dict[tuple[int, int], bytes] = {}

    def answer(start: int, limit: int) -> bytes:
        if (start, limit) not in answers:
            end = start + limit if limit else count
            metadata = {"resourceVersion": "1"} | ({"continue": str(end)} if end < count else {})
            listing = {"kind": "HorizontalPodAutoscalerList", "metadata": metadata, "items": items[start:end]}
            answers[start, limit] = json.dumps(listing).encode()
        return answers[start, limit]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            body = answer(int(query.get("continue", ["0"])[0]), int(query.get("limit", ["0"])[0]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ports.put(server.server_address[1])
    server.serve_forever()


async def longest_stall(read: Callable[[], Awaitable[object]]) -> float:
    """The longest the event loop went without running a 1 ms ticker while `read` ran, in ms."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await read()
    done.set()
    await ticking
    return max(gaps) * 1000


async def measure(port: int, rounds: int) -> dict[str, float]:
    kube = KubeClient.from_config(KubeAPIConfig(url=f"http://127.0.0.1:{port}", timeout=60))

    async def one_answer() -> object:
        return await kube.request("GET", hpas_path("default"))

    readers: dict[str, Callable[[], Awaitable[object]]] = {
        "one answer, objects kept": one_answer,
        "pages of 500 (list_hpas)": lambda: list_hpas(kube, "default"),
    }
    medians = {}
    try:
        for name, read in readers.items():
            await read()  # the server builds its answers once
            stalls = [await longest_stall(read) for _ in range(rounds)]
            medians[name] = statistics.median(stalls)
            print(f"{name}: longest stall p50 {medians[name]:.0f} ms, max {max(stalls):.0f} ms")
    finally:
        await kube.close()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hpas", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(args.hpas, ports), daemon=True)
    server.start()
    try:
        medians = asyncio.run(measure(ports.get(timeout=120), args.rounds))
    finally:
        server.terminate()
        server.join()
    print(f"hpa_list_stall_p50_ms={medians['pages of 500 (list_hpas)']:.0f}")


if __name__ == "__main__":
    main()
