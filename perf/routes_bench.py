"""Benchmark: ZeroscaleRoute objects on a real control plane, from the API write to the proxy routing by it.

    python perf/routes_bench.py [--changes 40] [--routes 1000] [--many 10000] [--concurrency 16]

Brings up a control plane of its own (scripts/k8s, built by `make e2e`; its own ZS_K8S_HOME and port, the build
shared: perf/activator.py), installs the ZeroscaleRoute CRD as the docs say (deploy/crds, server-side apply), and
runs a real `zeroscale proxy` process with proxy.route_objects enabled (and proxy.activator, whose Lease elects the
status writer). Every route is in one namespace and sends to one Service, whose EndpointSlice lists a real HTTP
server on this machine's own address (the API refuses loopback addresses in a slice); each route claims a host of
its own and reads that Service's slices (from the one watch of the namespace's slices every route shares).

- Update latency, at 10 routes (the baseline) and at --routes: --changes changes, alternately a new route created
  and an existing route's host replaced (a merge patch). Timed from the API call returning (the object is stored)
  to the first request for the new host the proxy does not answer with its 404 ("no route for this host"), polled
  over one keep-alive connection: "table" when that request was sent (the new table took it), "answered" when
  its answer from the upstream came (a new route version dials its endpoints afresh: pools are per version): the
  first request routed by the change, the figure of the last line. A created route
  is deleted again after its trial (so the count stays), and the time until its host answers 404 again is
  printed too.
- Memory: the proxy's VmRSS (/proc/<pid>/status) with 0 routes (the baseline), --routes and --many routes, read
  once every route's host answers through the proxy (at --many, a sample of 200 hosts, each request given 5 s, in
  rounds until all are forwarded or --settle seconds passed: how many were is printed). The routes are created
  --concurrency at a time.

Prints p50/p99 of each, the ratios to the baselines, and last
`route_update_p99_ms_1000=<x> rss_mib_1000_routes=<y> rss_mib_10000_routes=<z>`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import activator  # noqa: E402  (perf/activator.py: this directory is on sys.path)

from adapter.config.route_object import API_VERSION, KIND, PLURAL  # noqa: E402

NAMESPACE = "bench-routes"
SERVICE = "web"
BASELINE_ROUTES = 10
_API_PORT = 19443  # beside perf/activator.py's 18443 and the e2e default 16443; its etcd takes 15379-15381
ROUTES = f"/apis/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
CRD = "zeroscaleroutes.zeroscale.io"
NOT_FOUND = 404
SAMPLE = 200  # hosts checked at --many routes, spread over them
FORWARD_TIMEOUT = 5.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        # One write: a head and a body written apart meet Nagle's algorithm and the proxy's delayed ACK (~40 ms).
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Upstream(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """Quiet: a route version closed drops its idle pooled connections (a reset here), by design."""


def host(name: str) -> str:
    return f"{name}.{NAMESPACE}.example"


def route(name: str, hosts: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"hosts": hosts, "upstream": {"service": SERVICE, "port": "http"}, "wake": "none"},
    }


def objects(address: str, upstream: int) -> list[dict[str, Any]]:
    """The upstream Service with its slice (what kubelet and the EndpointSlice controller would write), and the
    proxy's own Service (proxy.activator names it; nothing here is in mode activator)."""

    def service(name: str) -> dict[str, Any]:
        spec = {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}

    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-pod",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": upstream, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }
    return [service(SERVICE), service("zs-proxy"), endpoint_slice]


def proxy_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "proxy": {
            "bind": "127.0.0.1",
            "port": 0,
            "admin_bind": "127.0.0.1",
            "admin_port": 0,
            "kubernetes": {"kubeconfig": str(kubeconfig)},
            "activator": {
                "proxy_service": {"service": "zs-proxy", "namespace": NAMESPACE},
                "lease_namespace": NAMESPACE,
                "identity": "bench-proxy",
            },
            "route_objects": {"enabled": True, "namespaces": [NAMESPACE]},
        }
    }


class Poller:
    """Requests to the proxy over one keep-alive connection (opened again if the proxy closes it)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._connection: HTTPConnection | None = None

    def status(self, host_name: str) -> int:
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = HTTPConnection("127.0.0.1", self._port, timeout=30)
            try:
                self._connection.request("GET", "/", headers={"Host": host_name})
                response = self._connection.getresponse()
                response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
                return response.status
            except (OSError, ConnectionError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def until(self, host_name: str, routed: bool, within: float = 30.0) -> tuple[float, float]:
        """Seconds until the host is routed (an answer other than 404), or no longer (404): when the request that
        first said so was sent (the table serving it took that request) and when its answer came (a new route's
        first request waits for the route's first list of its Service's slices)."""
        started = time.perf_counter()
        while True:
            sent = time.perf_counter()
            if (self.status(host_name) != NOT_FOUND) == routed:
                return sent - started, time.perf_counter() - started
            if sent - started > within:
                raise TimeoutError(f"{host_name}: {'not routed' if routed else 'still routed'} after {within:g} s")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(len(ordered) * 0.99) - 1]


def create_routes(kube: Any, names: Iterable[str], concurrency: int) -> None:
    """POST each route, `concurrency` at a time, printing progress every 1000."""
    todo = list(names)
    done = 0
    lock = threading.Lock()
    started = time.monotonic()

    def one(name: str) -> None:
        nonlocal done
        kube.request("POST", ROUTES, route(name, [host(name)]))
        with lock:
            done += 1
            if done % 1000 == 0 or done == len(todo):
                print(f"  created {done}/{len(todo)} routes in {time.monotonic() - started:.0f} s", flush=True)

    with ThreadPoolExecutor(concurrency) as pool:
        for _ in pool.map(one, todo):
            pass


def all_routed(poller: Poller, hosts: Iterable[str], within: float) -> float:
    """Seconds until every host answers through the proxy (each polled in turn)."""
    started = time.perf_counter()
    for name in hosts:
        poller.until(name, routed=True, within=within)
    return time.perf_counter() - started


def forwarded(port: int, host_name: str) -> bool:
    """A request for the host reached the upstream within FORWARD_TIMEOUT (a route whose slices are not read yet
    holds it)."""
    connection = HTTPConnection("127.0.0.1", port, timeout=FORWARD_TIMEOUT)
    try:
        connection.request("GET", "/", headers={"Host": host_name})
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def settled(port: int, sample: list[str], within: float) -> tuple[int, float]:
    """Rounds over the sample until every host's request is forwarded, or `within` seconds passed: how many were
    forwarded in the last round, and when it ended."""
    started = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        while True:
            served = sum(pool.map(lambda name: forwarded(port, name), sample))
            took = time.perf_counter() - started
            print(f"  {served}/{len(sample)} of a sample forwarded after {took:.0f} s", flush=True)
            if served == len(sample) or took > within:
                return served, took
            time.sleep(5)


def update_trials(
    kube: Any, poller: Poller, hosts: dict[str, str], changes: int, tag: str
) -> dict[str, list[tuple[float, float]]]:
    """`changes` changes, alternately a route created (and deleted again) and an existing route's host replaced
    (`hosts`, route -> its host, follows); (table, answered) in milliseconds, as Poller.until."""
    times: dict[str, list[tuple[float, float]]] = {"create": [], "edit": [], "delete": []}
    merge = "application/merge-patch+json"
    existing = sorted(hosts)

    def timed(kind: str, host_name: str, routed: bool) -> None:
        table, answered = poller.until(host_name, routed=routed)
        times[kind].append((table * 1000, answered * 1000))

    for trial in range(changes):
        if trial % 2 == 0:
            name = f"new-{tag}-{trial}"
            kube.request("POST", ROUTES, route(name, [host(name)]))
            timed("create", host(name), routed=True)
            kube.request("DELETE", f"{ROUTES}/{name}")
            timed("delete", host(name), routed=False)
        else:
            name = existing[trial % len(existing)]
            hosts[name] = host(f"{name}-{tag}-{trial}")
            kube.request("PATCH", f"{ROUTES}/{name}", {"spec": {"hosts": [hosts[name]]}}, content_type=merge)
            timed("edit", hosts[name], routed=True)
    return times


def report(label: str, times: dict[str, list[tuple[float, float]]]) -> list[float]:
    """Prints each kind's p50/p99 (table: the first request the new table took was sent; answered: its answer
    came); returns the changes' (create and edit) answered times."""

    def figures(values: list[float]) -> str:
        return f"p50 {statistics.median(values):6.1f} ms, p99 {p99(values):6.1f} ms"

    for kind, pairs in [*times.items(), ("change", times["create"] + times["edit"])]:
        table, answered = [t for t, _ in pairs], [a for _, a in pairs]
        print(f"  {label}: {kind:6} n={len(pairs):3}  table {figures(table)};  answered {figures(answered)}")
    return [answered for _, answered in times["create"] + times["edit"]]


def run(args: argparse.Namespace) -> None:
    if not activator.built():
        sys.exit("the control plane is not built: `make e2e` builds it into ~/.cache/zeroscale-k8s")
    with activator.control_plane(_API_PORT) as kube, tempfile.TemporaryDirectory(prefix="bench-routes-") as workdir:
        # After control_plane(): tests.e2e reads ZS_K8S_HOME and ZS_K8S_PORT at import.
        from tests.e2e.test_04_proxy_wake import pod_address
        from tests.fixtures.replicas import spawn
        from tests.fixtures.route_crd import CRD_FILE

        kube.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
        kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
        upstream = _Upstream((pod_address(), 0), _Handler)
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        kube.namespace(NAMESPACE)
        kube.apply(objects(str(upstream.server_address[0]), int(upstream.server_address[1])))
        config = Path(workdir, "proxy.yaml")
        config.write_text(yaml.safe_dump(proxy_config(kube.plane.admin_kubeconfig)))
        proxy = spawn("proxy", "proxy", Path(workdir), "--config", str(config))
        try:
            measure(kube, proxy.ports["http"], proxy.process.pid, args)
        except BaseException:
            print(f"proxy log tail:\n{tail(proxy.log)}", file=sys.stderr)
            raise
        finally:
            proxy.stop()
            upstream.shutdown()


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def settle() -> None:
    """Let the last rebuild's garbage go before RSS is read."""
    time.sleep(2)


def measure(kube: Any, port: int, pid: int, args: argparse.Namespace) -> None:
    poller = Poller(port)
    settle()
    rss_0 = rss_mib(pid)
    print(f"0 routes: RSS {rss_0:.1f} MiB", flush=True)

    names = [f"r{i:05}" for i in range(args.many)]
    hosts = {name: host(name) for name in names}  # what each route claims now (the edits move some)
    create_routes(kube, names[:BASELINE_ROUTES], args.concurrency)
    all_routed(poller, [hosts[name] for name in names[:BASELINE_ROUTES]], within=60)
    print(f"{BASELINE_ROUTES} routes: {args.changes} changes", flush=True)
    first = {name: hosts[name] for name in names[:BASELINE_ROUTES]}
    base = report(f"{BASELINE_ROUTES} routes", update_trials(kube, poller, first, args.changes, "b"))
    hosts.update(first)

    create_routes(kube, names[BASELINE_ROUTES : args.routes], args.concurrency)
    took = all_routed(poller, [hosts[name] for name in names[: args.routes]], within=120)
    settle()
    rss_routes = rss_mib(pid)
    print(f"{args.routes} routes: all routed ({took:.1f} s after the last write); RSS {rss_routes:.1f} MiB", flush=True)
    print(f"{args.routes} routes: {args.changes} changes", flush=True)
    served = {name: hosts[name] for name in names[: args.routes]}
    at_routes = report(f"{args.routes} routes", update_trials(kube, poller, served, args.changes, "m"))
    hosts.update(served)

    create_routes(kube, names[args.routes :], args.concurrency)
    sample = [hosts[name] for name in names[:: max(1, args.many // SAMPLE)]]
    forwarded_now, took = settled(port, sample, args.settle)
    settle()
    rss_many = rss_mib(pid)
    print(
        f"{args.many} routes: {forwarded_now}/{len(sample)} of a sample forwarded {took:.1f} s after the last write; "
        f"RSS {rss_many:.1f} MiB",
        flush=True,
    )
    poller.close()

    p99_routes, p99_base = p99(at_routes), p99(base)
    print(
        f"ratios: update p99 at {args.routes} routes {p99_routes / p99_base:.2f}x the p99 at {BASELINE_ROUTES}; "
        f"RSS at {args.routes} routes {rss_routes / rss_0:.2f}x, at {args.many} {rss_many / rss_0:.2f}x the RSS at "
        f"0 routes ({(rss_routes - rss_0) * 1024 / args.routes:.1f} KiB, "
        f"{(rss_many - rss_0) * 1024 / args.many:.1f} KiB per route)"
    )
    print(
        f"route_update_p99_ms_{args.routes}={p99_routes:.1f} rss_mib_{args.routes}_routes={rss_routes:.1f} "
        f"rss_mib_{args.many}_routes={rss_many:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=40, help="changes timed at each size (half creates)")
    parser.add_argument("--routes", type=int, default=1000)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16, help="route objects created at once")
    parser.add_argument("--settle", type=float, default=600, help="seconds the --many routes get to be served")
    args = parser.parse_args()
    if not BASELINE_ROUTES < args.routes < args.many:
        parser.error(f"want {BASELINE_ROUTES} < --routes < --many")
    run(args)


if __name__ == "__main__":
    main()
