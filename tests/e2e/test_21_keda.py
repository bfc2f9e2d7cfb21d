"""Zeroscale beside the real KEDA v2.21 (operator and metrics server built from its Go module by scripts/keda).

Zeroscale holds v1beta1.external.metrics.k8s.io with KEDA's metrics server as its `delegate`, with the RBAC of
deploy/overlays/beside-keda. The ScaledObjects are deploy/examples/keda-*.yaml as docs/concepts/beside-keda.md
shows them; the only changes (localize) are the loopback addresses of Redis and of the gRPC scaler, the
certificates in the Secret, and shorter polling and cooldown, so that a scenario takes seconds.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from adapter.children import port_outside_ephemeral
from tests.e2e import install, keda
from tests.e2e.cluster import (
    ControlPlane,
    Kube,
    KubeError,
    deployment,
    external_hpa,
    hpa_condition,
    hpa_reads_metric,
    start_at_zero,
    wait_for,
)
from tests.e2e.fixtures import Installed, Timeline, kube_api
from tests.e2e.processes import Zeroscale
from tests.fixtures.redis_servers import RedisProcess

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
OVERLAY = REPO / "deploy" / "overlays" / "beside-keda"
NAMESPACE = "jobs"  # the examples' namespace
POLLING, COOLDOWN = 1, 5
METRICS = f"/apis/{install.DISCOVERY_PATH.removeprefix('/apis/')}/namespaces/{NAMESPACE}"
KEDA_METRIC = f"{METRICS}/s0-redis-thumbnails?labelSelector={quote('scaledobject.keda.sh/name=thumbnailer')}"
OK_FORWARDS = 'zeroscale_delegate_requests_total{outcome="ok"}'
OUR_METRIC = f"{METRICS}/celery-queue?labelSelector={quote('key=celery')}"


@dataclass
class Beside:
    keda: keda.Keda
    zeroscale: Zeroscale
    metrics_port: int
    proxy_port: int
    localize: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def example(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text(encoding="utf-8")) if doc]


def _fragment_metrics(*names: str) -> list[dict[str, Any]]:
    """The examples' own metric definitions (their sources are replaced by loopback ones)."""
    return [metric for name in names for metric in yaml.safe_load((EXAMPLES / name).read_text())["metrics"]]


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as read, made fit to apply again."""
    meta = obj["metadata"]
    kept = {key: meta[key] for key in ("name", "namespace", "labels", "annotations") if key in meta}
    return {key: value for key, value in obj.items() if key != "status"} | {"metadata": kept}


def _saved(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return _clean(kube.get(path))
    except KubeError:
        return None


@pytest.fixture(scope="module")
def beside(
    plane: ControlPlane, kube: Kube, installed: Installed, workdir: Path, redis_server: RedisProcess
) -> Iterator[Beside]:
    directory = workdir / "keda"
    directory.mkdir()
    build_dir = keda.build()
    keda.install_crds(kube, build_dir / "crds")
    keda_certs = keda.make_certs(directory / "keda-certs")
    # KEDA dials the scaler at localhost: the certificate carries that name beside the Service's.
    certs = install.make_certs(directory / "certs", "localhost")
    kube.apply(doc for doc in yaml.safe_load_all((OVERLAY / "delegate-rbac.yaml").read_text()) if doc)
    running = keda.Keda(plane, build_dir, keda_certs, directory).start()

    counts_port, proxy_port = port_outside_ephemeral(), port_outside_ephemeral()
    route = {
        "name": "web",
        "hosts": [f"web.{NAMESPACE}"],
        "upstream": {"service": "web", "namespace": NAMESPACE, "port": "http"},
        "wake": "hpa",  # KEDA alone scales it (the external-push trigger)
        "readiness": "endpointslice",
    }
    proxy_config = {
        "proxy": {
            "bind": "127.0.0.1",
            "port": proxy_port,
            "admin_bind": "127.0.0.1",
            "admin_port": port_outside_ephemeral(),
            "kubernetes": kube_api(plane, installed.proxy_token),
            "routes": [route],
        },
        "grpc": {"counts": {"enabled": True, "bind": "127.0.0.1", "port": counts_port}},
    }
    (directory / "proxy").mkdir()
    proxy = Zeroscale("proxy", directory / "proxy", proxy_config, proxy_port).start()

    port, metrics_port, scaler_port = port_outside_ephemeral(), port_outside_ephemeral(), port_outside_ephemeral()
    tls = {"cert_file": str(certs / "tls.crt"), "key_file": str(certs / "tls.key")}
    config = {
        "server": {
            "bind": "127.0.0.1",
            "port": port,
            "metrics_bind": "127.0.0.1",
            "metrics_port": metrics_port,
            "tls": tls,
            "auth": {"kubernetes": kube_api(plane, installed.adapter_token)},
        },
        "cache": {"interval": 0.5, "max_staleness": 10},
        "sources": [
            {"name": "jobs", "type": "redis", "url": f"redis://{redis_server.address}"},
            {"name": "proxies", "type": "http", "proxies": [f"127.0.0.1:{counts_port}"]},
        ],
        "metrics": _fragment_metrics("redis-worker.zeroscale.yaml", "http-app.zeroscale.yaml"),
        "grpc": {
            "scaler": {
                "enabled": True,
                "bind": "127.0.0.1",
                "port": scaler_port,
                "tls": {**tls, "client_ca_file": str(certs / "ca.crt")},
            }
        },
        "delegate": {
            "url": f"https://127.0.0.1:{running.metrics_server_port}",
            "server_name": f"{keda.METRICS_SERVER_SERVICE}.{keda.NAMESPACE}.svc",
            "ca_file": str(keda_certs / "ca.crt"),
            "token_file": str(installed.adapter_token),
            "discovery_refresh": 2,
        },
    }
    (directory / "adapter").mkdir()
    zeroscale = Zeroscale("serve", directory / "adapter", config, port).start()

    def localize(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for obj in objects:
            if obj["kind"] == "Secret":
                obj["stringData"] = {
                    "ca.crt": (certs / "ca.crt").read_text(),
                    "tls.crt": (certs / "keda.crt").read_text(),
                    "tls.key": (certs / "keda.key").read_text(),
                }
            if obj["kind"] != "ScaledObject":
                continue
            obj["spec"].update(pollingInterval=POLLING, cooldownPeriod=COOLDOWN)
            for trigger in obj["spec"]["triggers"]:
                metadata = trigger["metadata"]
                if trigger["type"] == "redis":
                    metadata["address"] = redis_server.address
                if "scalerAddress" in metadata:
                    metadata["scalerAddress"] = f"localhost:{scaler_port}"
        return objects

    # Whatever held the APIService before (the session's adapter) gets it back afterwards.
    service_path = f"/api/v1/namespaces/{install.NAMESPACE}/services/{install.SERVICE}"
    before = [_saved(kube, service_path), _saved(kube, install.APISERVICE_PATH)]
    try:
        kube.namespace(NAMESPACE)
        install.register(kube, port, certs)
        install.wait_available(kube)
        yield Beside(running, zeroscale, metrics_port, proxy_port, localize)
    finally:
        kube.kubectl("delete", "-n", NAMESPACE, "scaledobjects,triggerauthentications", "--all", check=False)
        zeroscale.stop()
        proxy.stop()
        running.stop()
        restore = [obj for obj in before if obj is not None]
        if restore:
            kube.apply(restore)


@pytest.fixture
def scaled_objects(beside: Beside, kube: Kube) -> Iterator[None]:
    """Each scenario applies its ScaledObjects afresh and deletes them after: KEDA's operator then deletes its
    HPAs itself (it re-creates one deleted under it only at its ScaledObject's next change)."""
    yield
    kube.kubectl("delete", "-n", NAMESPACE, "scaledobjects,triggerauthentications", "--all", "--wait=true")


def reach(
    kube: Kube, wanted: dict[str, int], timeout: float, interval: float = 0.1, since: float | None = None
) -> dict[str, float]:
    """Seconds (from `since`, default now) until each Deployment (name -> replicas) first read its wanted
    replicas, polled together."""
    start, seen = since or time.monotonic(), dict[str, float]()
    while len(seen) < len(wanted):
        for name, replicas in wanted.items():
            if name not in seen and kube.replicas(NAMESPACE, name) == replicas:
                seen[name] = time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout:g} s: {wanted}, reached only {seen}")
        time.sleep(interval)
    return seen


def scraped(port: int, prefix: str) -> dict[str, float]:
    """Samples of Zeroscale's /metrics whose line starts with `prefix`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def keda_hpa(kube: Kube, name: str) -> dict[str, Any]:
    """The HPA KEDA's operator made for ScaledObject `name`, once it exists."""
    return wait_for(lambda: kube.hpa(NAMESPACE, f"keda-hpa-{name}"), 60, f"KEDA's HPA for {name}")


def test_keda_redis_scaler_and_a_zeroscale_hpa_side_by_side(
    beside: Beside, kube: Kube, redis_server: RedisProcess, timeline: Timeline, scaled_objects: None
) -> None:
    jobs = redis_server.client()
    jobs.delete("thumbnails", "celery")
    ours = external_hpa(NAMESPACE, "celery-worker", "celery-queue", {"key": "celery"}, 10, 5)
    start_at_zero(kube, ours, "the Zeroscale HPA reads an empty queue")
    kube.apply([deployment(NAMESPACE, "thumbnailer"), *beside.localize(example("keda-beside-redis.yaml"))])
    metric = keda_hpa(kube, "thumbnailer")["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert metric == "s0-redis-thumbnails"

    jobs.rpush("thumbnails", *range(30))
    jobs.rpush("celery", *range(30))
    up = reach(kube, {"thumbnailer": 3, "celery-worker": 3}, 90)
    # KEDA's HPA read its metric through the aggregator, Zeroscale and the delegate; ours from Zeroscale itself.
    wait_for(lambda: hpa_reads_metric(kube.hpa(NAMESPACE, "keda-hpa-thumbnailer")), 20, "KEDA's HPA reads its metric")
    assert hpa_reads_metric(kube.hpa(NAMESPACE, "celery-worker"))
    forwarded = scraped(beside.metrics_port, "zeroscale_delegate_requests_total")
    assert forwarded.get(OK_FORWARDS, 0) > 0, forwarded

    jobs.delete("thumbnails", "celery")
    down = reach(kube, {"thumbnailer": 0, "celery-worker": 0}, 90)
    timeline.record(
        f"beside KEDA: KEDA's redis ScaledObject 0->3 in {up['thumbnailer']:.1f} s and 3->0 in "
        f"{down['thumbnailer']:.1f} s (cooldown {COOLDOWN} s) through Zeroscale's delegate, while Zeroscale's HPA "
        f"went 0->3 in {up['celery-worker']:.1f} s and 3->0 in {down['celery-worker']:.1f} s; "
        f"the delegate had answered {forwarded[OK_FORWARDS]:.0f} forwarded read(s) by 3"
    )


def _hold(port: int, path: str) -> socket.socket:
    """One request to the proxy left waiting for its answer (closed by the caller)."""
    held = socket.create_connection(("127.0.0.1", port), timeout=10)
    held.sendall(f"GET {path} HTTP/1.1\r\nHost: web.{NAMESPACE}\r\n\r\n".encode())
    return held


def test_keda_operator_calls_the_grpc_scaler_polled_and_pushed(
    beside: Beside, kube: Kube, redis_server: RedisProcess, timeline: Timeline, scaled_objects: None
) -> None:
    jobs = redis_server.client()
    jobs.delete("priority-resize")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }
    kube.apply(
        [
            deployment(NAMESPACE, "resizer"),
            deployment(NAMESPACE, "web"),
            service,
            *beside.localize(example("keda-external-scalers.yaml")),
        ]
    )
    keda_hpa(kube, "resizer")
    keda_hpa(kube, "web")

    # external: KEDA polls IsActive and the HPA reads GetMetrics through KEDA's metrics server.
    jobs.rpush("priority-resize", *range(30))
    polled_up = reach(kube, {"resizer": 3}, 60)["resizer"]
    jobs.delete("priority-resize")
    polled_down = reach(kube, {"resizer": 0}, 60)["resizer"]

    # external-push: the proxy holds a request; the scaler's StreamIsActive tells KEDA's operator at once.
    sent = time.monotonic()
    held = [_hold(beside.proxy_port, "/first")]
    activation = reach(kube, {"web": 1}, 30, interval=0.02, since=sent)["web"]
    held += [_hold(beside.proxy_port, f"/more/{n}") for n in range(2)]
    pushed_up = reach(kube, {"web": 3}, 60)["web"]  # 3 pending, target 1 per replica
    for connection in held:
        connection.close()  # the clients give up: nothing pending
    pushed_down = reach(kube, {"web": 0}, 60)["web"]
    total = time.monotonic() - sent

    # KEDA's operator, not this test, made the calls: unary ones counted, the push stream open right now.
    samples = scraped(beside.metrics_port, "zeroscale_grpc_requests_total{")
    samples |= scraped(beside.metrics_port, "zeroscale_grpc_streams{")
    methods = {
        name.split('method="')[1].split('"')[0]
        for name, value in samples.items()
        if 'server="scaler"' in name and value > 0
    }
    assert {"GetMetricSpec", "IsActive", "GetMetrics", "StreamIsActive"} <= methods, samples
    timeline.record(
        f"KEDA external scaler: `external` 0->3 in {polled_up:.1f} s, 3->0 in {polled_down:.1f} s; `external-push` "
        f"first held request -> KEDA's operator scaled 0->1 in {activation * 1000:.0f} ms, 1->3 on 3 pending in "
        f"{pushed_up:.1f} s, 3->0 {pushed_down:.1f} s after the clients left ({total:.1f} s in all); KEDA called "
        f"{', '.join(sorted(methods))}"
    )


def test_the_delegate_dies_ours_keep_answering_and_both_recover(
    beside: Beside, kube: Kube, redis_server: RedisProcess, timeline: Timeline, scaled_objects: None
) -> None:
    jobs = redis_server.client()
    jobs.delete("thumbnails", "celery")
    jobs.rpush("thumbnails", *range(20))
    jobs.rpush("celery", *range(20))
    ours = external_hpa(NAMESPACE, "celery-worker", "celery-queue", {"key": "celery"}, 10, 5)
    kube.apply([deployment(NAMESPACE, "celery-worker", 1), ours, deployment(NAMESPACE, "thumbnailer")])
    kube.apply(beside.localize(example("keda-beside-redis.yaml")))
    reach(kube, {"thumbnailer": 2, "celery-worker": 2}, 90)
    assert kube.get(KEDA_METRIC)["items"], "KEDA's metric answers through Zeroscale"

    beside.keda.metrics_server.kill()
    killed = time.monotonic()

    def refused() -> str | None:
        try:
            kube.get(KEDA_METRIC)
        except KubeError as err:
            return str(err.body.get("message")) if err.status == 503 else None
        return None

    message = wait_for(refused, 20, "KEDA's metric answers 503")
    assert "external metrics delegate" in message, message
    assert str(beside.keda.metrics_server_port) in message, message
    noticed = time.monotonic() - killed
    for _ in range(5):  # ours are untouched: every read answers
        assert kube.get(OUR_METRIC)["items"][0]["value"] == "20"
        time.sleep(0.2)
    jobs.rpush("celery", *range(20))  # and our HPA keeps scaling meanwhile
    ours_scaled = reach(kube, {"celery-worker": 4}, 30)["celery-worker"]
    # KEDA's HPA is refused its metric (and keeps its replicas), as with any metrics server down.
    failing = wait_for(
        lambda: (
            hpa_condition(kube.hpa(NAMESPACE, "keda-hpa-thumbnailer"), "ScalingActive").get("reason")
            == "FailedGetExternalMetric"
        ),
        20,
        "KEDA's HPA fails to get its metric",
    )
    assert failing
    assert kube.replicas(NAMESPACE, "thumbnailer") == 2

    restarting = time.monotonic()
    beside.keda.metrics_server.start()  # returns once it answers /readyz
    ready = time.monotonic() - restarting
    wait_for(lambda: kube.get(KEDA_METRIC)["items"], 30, "KEDA's metric answers again")
    back = time.monotonic() - restarting
    wait_for(lambda: hpa_reads_metric(kube.hpa(NAMESPACE, "keda-hpa-thumbnailer")), 30, "KEDA's HPA reads again")
    hpa_back = time.monotonic() - restarting

    jobs.delete("thumbnails", "celery")
    reach(kube, {"thumbnailer": 0, "celery-worker": 0}, 90)
    timeline.record(
        f"delegate killed: KEDA's metric 503 naming the delegate after {noticed:.2f} s, KEDA's HPA "
        f"ScalingActive=False/FailedGetExternalMetric and kept 2; ours kept answering and our HPA went 2->4 in "
        f"{ours_scaled:.1f} s meanwhile; restarted (ready in {ready:.1f} s): KEDA's metric back at "
        f"{back:.1f} s, its HPA reading again at {hpa_back:.1f} s"
    )
