"""The dashboards are generated, and proven: every panel's query returns data from a real Prometheus that
scraped a real adapter and proxy through a scripted cold start.

The script: the adapter answers a read of a static metric, fails a read of a Redis metric (nothing listens),
answers KEDA's GetMetrics over gRPC, forwards a metric it does not serve to its delegate, and refuses a connection
over server.max_connections while the others time out in their handshakes; the activator proxy takes the Lease and
switches its Service to the pods once one is ready, and back to itself when the Deployment goes to zero; the proxy
holds a request for route `web` while its Deployment is at zero, patches the scale subresource, and forwards it
once an EndpointSlice shows a ready endpoint, then carries a tunnel (an upgrade) until it goes quiet past
limits.tunnel_idle_timeout; route `idle` (never ready) answers 503 (over its hold limit), 504 (hold timeout) and 499
(client gone), and its health check itself (a never-wake rule); route `stopped` refuses to wake what a person
stopped; a chunked HTTP/1.0 request is refused 400; a connection over proxy.max_connections is closed at once.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from adapter.kube.endpointslices import MANAGED_BY
from grafana import generate
from tests.fixtures.kube_routes import ScaleStandIn, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.prometheus import ACTIVATOR_PROXY_ADDRESS, API_MAX_CONNECTIONS, PROXY_MAX_CONNECTIONS, Stack

ROOT = Path(__file__).resolve().parents[2]
# What Grafana puts for its built-in variables; the windows fit the few seconds this test runs.
METRICS_PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default"
BUILT_INS = {"$__rate_interval": "30s", "$__range": "5m", "$__interval": "1s"}


def proxy_get(port: int, host: str, timeout: float = 30.0, path: str = "/") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Host": host})
        return connection.getresponse().status
    finally:
        connection.close()


def api_get(port: int, path: str) -> int:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the adapter's self-signed loopback certificate
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def scaler_get_metrics(port: int, metric: str) -> float:
    from adapter.rpc.generated import externalscaler_pb2 as pb
    from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        ref = pb.ScaledObjectRef(name="demo", namespace="default", scalerMetadata={"metricName": metric})
        answer = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric), timeout=10)
        return float(answer.metricValues[0].metricValueFloat)


def closed_at_once(connection: socket.socket) -> bool:
    connection.settimeout(5)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def fill_connections(port: int, limit: int) -> list[socket.socket]:
    """`limit` idle connections, then one more, which must be closed at once; returns the idle ones (to close)."""
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(limit)]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as over:
        assert closed_at_once(over), f"port {port} took a connection over its limit of {limit}"
    return idle


def tunnel(port: int, host: str) -> None:
    """An upgrade through the proxy: 101, bytes echoed for a while (scraped open), then quiet until the proxy closes
    it (the route's tunnel_idle_timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = connection.recv(4096)
            assert chunk, f"closed before the 101: {head!r}"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        for _ in range(8):  # for 2 s, each well within the idle timeout
            connection.sendall(b"ping")
            assert connection.recv(4) == b"ping"
            time.sleep(0.25)
        assert closed_at_once(connection)


def activator_lists(kube: KubeStandIn) -> set[str]:
    """The addresses the activator's EndpointSlices of Service shop/web list now."""
    return {
        address
        for body in kube.objects(slices_collection("shop"))
        if body["metadata"]["labels"].get("endpointslice.kubernetes.io/managed-by") == MANAGED_BY
        for endpoint in body["endpoints"]
        for address in endpoint["addresses"]
    }


def in_background(work: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Run `work` in a thread; its exception, if any, lands in the list (to raise after join)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:
            failures.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


def wait_for(condition: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cold_start(stack: Stack, kube: KubeStandIn, scale: ScaleStandIn, stopped: ScaleStandIn) -> Stack:
    """Run the script once for the module; Prometheus has scraped everything when it returns."""
    # The adapter: good reads, a gRPC call, then a Redis outage (source errors, then a stale value refused).
    redis.Redis(port=stack.redis_port).rpush("jobs", "a", "b", "c")
    assert api_get(stack.api_port, f"{METRICS_PATH}/demo-depth") == 200
    assert api_get(stack.api_port, f"{METRICS_PATH}/jobs-depth") == 200
    assert scaler_get_metrics(stack.scaler_port, "demo-depth") == 420.0
    stack.redis.stop()
    wait_for(
        lambda: api_get(stack.api_port, f"{METRICS_PATH}/jobs-depth") == 503, "the stale Redis value to be refused"
    )
    # A metric the adapter does not serve: its delegate answers it.
    assert api_get(stack.api_port, f"{METRICS_PATH}/theirs-depth") == 200

    # The activator: its Service goes to the pod once one is ready, and back to the proxy at zero replicas.
    pod = endpoint_slice("web-pods-a", "web-pods", [("127.0.0.1", {"ready": True})], stack.upstream_port)
    pod["metadata"]["namespace"] = "shop"
    kube.put(slices_collection("shop"), pod)
    wait_for(lambda: activator_lists(kube) == {"127.0.0.1"}, "the activator to list the ready pod")
    at_zero = {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "web", "namespace": "shop"}}
    kube.put("/apis/apps/v1/namespaces/shop/deployments", {**at_zero, "spec": {"replicas": 0}})
    wait_for(lambda: activator_lists(kube) == {ACTIVATOR_PROXY_ADDRESS}, "the activator to list the proxy at zero")

    # The cold start: held while at zero, woken, forwarded once an endpoint is ready.
    statuses: dict[str, int] = {}
    held = threading.Thread(target=lambda: statuses.update(web=proxy_get(stack.proxy_port, "web")))
    held.start()
    wait_for(lambda: scale.replicas == 1, "the proxy to patch the scale subresource to 1")
    # A visible cold start (the pod takes a while to become ready). The API's connections are filled: one more is
    # refused, and the idle ones time out in their handshakes (server.header_timeout, 1 s) while the script goes on
    # (it calls the API no more).
    idle = fill_connections(stack.api_port, API_MAX_CONNECTIONS)
    time.sleep(1.0)
    slice_obj = endpoint_slice("web-abc", "web", [("127.0.0.1", {"ready": True})], stack.upstream_port)
    kube.put(slices_collection("default"), slice_obj)
    held.join(30)
    assert statuses["web"] == 200
    tunnelled, tunnel_failures = in_background(lambda: tunnel(stack.proxy_port, "web"))

    # The errors: 503 over the hold limit (1), 504 when the hold times out, 499 when the client leaves.
    first = threading.Thread(target=lambda: statuses.update(held=proxy_get(stack.proxy_port, "idle")))
    first.start()
    time.sleep(0.3)
    assert proxy_get(stack.proxy_port, "idle") == 503
    first.join(10)
    assert statuses["held"] == 504
    # A cold-start choice: the never-wake health check is answered by the proxy while `idle` has no endpoint.
    assert proxy_get(stack.proxy_port, "idle", path="/healthz") == 200
    with socket.create_connection(("127.0.0.1", stack.proxy_port)) as leaving:
        leaving.sendall(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n")
        time.sleep(0.3)
    # Stopped by a person: not woken, answered 503 at once.
    assert proxy_get(stack.proxy_port, "stopped") == 503
    assert stopped.replicas == 0
    # Framed in a way HTTP/1.0 does not have (a chunked body): refused 400.
    with socket.create_connection(("127.0.0.1", stack.proxy_port), timeout=10) as framed:
        framed.sendall(b"POST / HTTP/1.0\r\nHost: web\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert framed.recv(4096).startswith(b"HTTP/1.1 400")

    tunnelled.join(30)
    assert not tunnel_failures, tunnel_failures
    for connection in [*idle, *fill_connections(stack.proxy_port, PROXY_MAX_CONNECTIONS)]:
        connection.close()

    stack.wait_until_scraped(after=time.time())
    return stack


def variable_values(stack: Stack, dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Each query variable's values as Grafana would list them (label_values against Prometheus)."""
    values: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"])
            assert match is not None, variable["query"]
            series, label = match.groups()
            values[variable["name"]] = stack.prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": series})
        elif variable["type"] == "textbox":
            values[variable["name"]] = [variable["query"]]
    return values


def fill(expr: str, chosen: dict[str, str]) -> str:
    for name, value in (*BUILT_INS.items(), *((f"${name}", value) for name, value in chosen.items())):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unfilled variable in {expr}"
    return expr


def panel_queries(dashboard: dict[str, Any], values: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(panel title, filled query) for every target; a repeated panel once per value of its variable."""
    everything = {name: "|".join(found) for name, found in values.items()}
    queries = []
    for panel in dashboard["panels"]:
        repeat = panel.get("repeat")
        for value in values[repeat] if repeat else [None]:
            chosen = everything | ({repeat: value} if repeat and value else {})
            for target in panel.get("targets", []):
                queries.append((f"{panel['title']} [{value or 'all'}]", fill(target["expr"], chosen)))
    return queries


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_every_panel_returns_data(cold_start: Stack, name: str) -> None:
    dashboard = json.loads((generate.OUT / name).read_text())
    values = variable_values(cold_start, dashboard)
    assert all(values.values()), f"a template variable has no values: {values}"
    empty = []
    queries = panel_queries(dashboard, values)
    assert len(queries) >= 10
    for title, expr in queries:
        if not cold_start.prometheus.query(expr):
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_proxy_reports_replicas_and_time_at_zero(cold_start: Stack) -> None:
    """The replica panels' series carry the facts of the script, not just any sample."""
    replicas = cold_start.prometheus.query('zeroscale_proxy_target_replicas{route="default/web"}')
    assert [float(series["value"][1]) for series in replicas] == [1.0]
    (at_zero,) = cold_start.prometheus.query('zeroscale_proxy_target_at_zero_seconds_total{route="default/web"}')
    assert float(at_zero["value"][1]) >= 1.0  # at zero from the start until the EndpointSlice came
    errors = cold_start.prometheus.query('zeroscale_proxy_error_responses_total{route="default/idle"}')
    codes = {s["metric"]["code"] for s in errors}
    assert {"503", "504", "499"} <= codes


def value(stack: Stack, expr: str) -> float:
    (series,) = stack.prometheus.query(expr)
    return float(series["value"][1])


@pytest.mark.parametrize(
    ("expr", "least"),
    [
        # The activator: one leader, both switches, its slices written.
        ('sum(zeroscale_proxy_activator_leader{job="zeroscale-activator"})', 1),
        ('count(zeroscale_proxy_activator_switch_seconds_count{route="shop/web"} > 0)', 2),  # to pods, to proxy
        ('sum(zeroscale_proxy_activator_slice_writes_total{route="shop/web", result="updated"})', 1),
        # What the HPA intends: `stopped` was not woken.
        ('sum(zeroscale_proxy_wake_refusals_total{route="default/stopped", reason="stopped_by_hand"})', 1),
        # Limits, refusals, the tunnel.
        ('sum(zeroscale_proxy_limit_hits_total{route="default/idle", limit="max_held_requests"})', 1),
        ('sum(zeroscale_proxy_limit_hits_total{route="default/web", limit="tunnel_idle_timeout"})', 1),
        ('max(max_over_time(zeroscale_proxy_open_tunnels{route="default/web"}[5m]))', 1),
        ('sum(zeroscale_proxy_refused_messages_total{side="request"})', 1),
        ('sum(zeroscale_proxy_refused_connections_total{job="zeroscale-proxy"})', 1),
        ('sum(zeroscale_api_connections_refused_total{listener="api"})', 1),
        ('sum(zeroscale_api_timeouts_total{listener="api", phase="handshake"})', 1),
        # The delegate: discovered, and a call answered.
        ('sum(zeroscale_delegate_requests_total{outcome="ok"})', 1),
        ("max(zeroscale_delegate_metrics)", 1),
    ],
)
def test_the_new_panels_series_carry_the_facts_of_the_script(cold_start: Stack, expr: str, least: float) -> None:
    """Not just any sample: each thing the script did is counted (a series at 0 would pass the data check)."""
    assert value(cold_start, expr) >= least


def test_queries_with_a_typo_return_nothing(cold_start: Stack) -> None:
    """The data check can fail: a misspelt series gives an empty result."""
    assert cold_start.prometheus.query("zeroscale_proxy_held_requestz") == []


def test_every_panel_says_what_it_shows_for_the_person_on_call() -> None:
    for name in generate.DASHBOARDS:
        for panel in json.loads((generate.OUT / name).read_text())["panels"]:
            if panel["type"] != "row":
                assert len(panel.get("description", "")) >= 40, f"{name}: {panel['title']} has no description"


def test_the_committed_json_is_what_the_generator_makes() -> None:
    for name, build in generate.DASHBOARDS.items():
        assert (generate.OUT / name).read_text() == generate.render(build()), f"run python grafana/generate.py ({name})"


def test_the_shipped_scrape_config_passes_promtool() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "grafana" / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_provisioning_points_at_the_dashboards() -> None:
    import yaml

    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/zeroscale.yaml").read_text())["providers"][0]
    assert provider["type"] == "file"
    datasource = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"
    # Every dashboard picks its data source through the `datasource` variable of type prometheus.
    for name in generate.DASHBOARDS:
        dashboard = json.loads((generate.OUT / name).read_text())
        (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
        assert variable["query"] == "prometheus"
        assert {p.get("datasource") for p in dashboard["panels"] if p.get("targets")} == {"${datasource}"}
