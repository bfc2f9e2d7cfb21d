"""`helm install` of deploy/helm/zeroscale into the real control plane: the APIService Available, an HPA on a Redis
metric 0 -> 3 -> 0, a `helm upgrade` that rolls the adapter while the HPA keeps reading, and a `helm uninstall`
that leaves nothing behind.

The chart's own objects are installed (RBAC, ServiceAccounts, the generated CA and certificates, the ConfigMap,
Deployments, PDBs, NetworkPolicies, the APIService with its caBundle). What a plane without kubelet and
kube-proxy cannot do, the test does in their place, from what the chart put in the cluster: it runs each
adapter "pod" as a process with the chart's ConfigMap and Secret as a kubelet would mount them (paths, and
ports on this one machine, rewritten) and a token of the chart's ServiceAccount; a post-renderer makes the
adapter's Service an ExternalName (tests/e2e/helm_post_render.py); a stand-in kube-proxy forwards that
Service's port to the ready pod (tests/e2e/service_proxy.py).
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.children import port_outside_ephemeral
from tests.e2e import install
from tests.e2e.cluster import (
    HPA_API,
    ControlPlane,
    Kube,
    KubeError,
    external_hpa,
    hpa_condition,
    start_at_zero,
    wait_for,
    wait_replicas,
)
from tests.e2e.fixtures import Timeline, kube_api
from tests.e2e.processes import Zeroscale
from tests.e2e.service_proxy import ServiceProxy
from tests.fixtures.manifests import CHART, build_helm
from tests.fixtures.redis_servers import RedisProcess

RELEASE = NAMESPACE = "zeroscale-e2e"
ADAPTER = f"{RELEASE}-adapter"
WORKLOADS, NAME, KEY = "e2e-helm", "worker", "e2e-helm-jobs"
POST_RENDER = Path(__file__).with_name("helm_post_render.py")
SYNC = float(os.environ.get("ZS_K8S_SYNC", "2s").rstrip("s"))
# Where objects labelled with the release could remain after `helm uninstall` (every namespace).
LABELLED = (
    "/apis/apps/v1/replicasets",
    "/apis/apps/v1/deployments",
    "/api/v1/secrets",
    "/api/v1/configmaps",
    "/api/v1/services",
    "/api/v1/serviceaccounts",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    "/apis/apiregistration.k8s.io/v1/apiservices",
    "/apis/networking.k8s.io/v1/networkpolicies",
    "/apis/policy/v1/poddisruptionbudgets",
)


class Helm:
    def __init__(self, plane: ControlPlane, workdir: Path, service_port: int) -> None:
        self.binary = build_helm()
        self.env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig), "HELM_CACHE_HOME": str(workdir / "helm")}
        # Helm runs a post-renderer as an executable: this one runs our script with the test's interpreter.
        self.post_renderer = workdir / "post-render"
        self.post_renderer.write_text(f'#!/bin/sh\nexec {sys.executable} {POST_RENDER} "$@"\n', encoding="utf-8")
        self.post_renderer.chmod(0o755)
        self.service_port = service_port

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.binary), *args, "--namespace", NAMESPACE]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=180)

    def __call__(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
        return done.stdout

    def chart_args(self, command: str, values: Path, *options: str) -> list[str]:
        render = ["--post-renderer", str(self.post_renderer), "--post-renderer-args", str(self.service_port)]
        return [command, RELEASE, str(CHART), "--values", str(values), *render, "--create-namespace", *options]

    def deploy(self, command: str, values: Path, *options: str) -> float:
        start = time.monotonic()
        self(*self.chart_args(command, values, *options))
        return time.monotonic() - start


def values_file(directory: Path, redis: RedisProcess, interval: float) -> Path:
    """The chart's values for this cluster: a Redis source and metric, the cache interval the upgrade changes."""
    label = {"pattern": "[a-z0-9][-a-z0-9.]*", "required": True}
    config = {
        "cache": {"interval": interval, "max_staleness": 10},
        "sources": [{"name": "redis", "type": "redis", "url": f"redis://{redis.address}"}],
        "metrics": [
            {"name": "redis-jobs", "type": "redis", "source": "redis", "query": "length", "labels": {"key": label}}
        ],
    }
    path = directory / f"values-{interval}.yaml"
    path.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    return path


@dataclass
class Pod:
    process: Zeroscale
    port: int
    config: dict[str, Any]


def start_pod(kube: Kube, plane: ControlPlane, workdir: Path, name: str) -> Pod:
    """An adapter pod as kubelet would run it: the chart's ConfigMap and Secret mounted, its ServiceAccount's token."""
    directory = workdir / name
    config, token = install.chart_pod(kube, directory, NAMESPACE, f"{ADAPTER}-serving", f"{RELEASE}-config", ADAPTER)
    port = port_outside_ephemeral()
    # One machine for every pod: loopback and a free port each, where a pod has its own network namespace.
    config["server"] |= {
        "bind": "127.0.0.1",
        "port": port,
        "metrics_bind": "127.0.0.1",
        "metrics_port": port_outside_ephemeral(),
    }
    config["server"]["auth"] = {"kubernetes": kube_api(plane, token)}
    config["grpc"]["scaler"] |= {"bind": "127.0.0.1", "port": port_outside_ephemeral()}
    process = Zeroscale("serve", directory, config, port, log_level="DEBUG").start()
    wait_for(lambda: ready(port), 30, f"{name} ready (/readyz)")
    return Pod(process, port, config)


def ready(port: int) -> bool:
    """The kubelet's readiness probe: HTTPS without verifying the certificate, no credentials."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    finally:
        connection.close()


@dataclass
class Watch:
    """Samples, every 0.1 s, the APIService's Available status, the workload's replicas (spec) and the HPA's
    ScalingActive reason (ValidMetricFound while each sync reads the metric)."""

    kube: Kube
    samples: list[tuple[float, str, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                hpa = self.kube.hpa(WORKLOADS, NAME)
                sample = (
                    time.monotonic(),
                    str(install.available(self.kube).get("status")),
                    self.kube.replicas(WORKLOADS, NAME),
                    str(hpa_condition(hpa, "ScalingActive").get("reason")),
                )
            except (KubeError, OSError) as err:
                sample = (time.monotonic(), f"error: {err}", -1, "")
            self.samples.append(sample)
            time.sleep(0.1)

    def longest_unavailable(self) -> float:
        longest, since = 0.0, None
        for moment, available, _, _ in self.samples:
            if available != "True":
                since = moment if since is None else since
                longest = max(longest, moment - since)
            else:
                since = None
        return longest


def release_objects(helm: Helm) -> list[tuple[str, str, str, str]]:
    """(apiVersion, kind, namespace, name) of every object of the release's manifest."""
    objects = []
    for doc in yaml.safe_load_all(helm("get", "manifest", RELEASE)):
        if doc:
            meta = doc["metadata"]
            objects.append((doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]))
    return objects


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    plural = {"NetworkPolicy": "networkpolicies", "APIService": "apiservices"}.get(kind, kind.lower() + "s")
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}/{name}" if namespace else f"{prefix}/{plural}/{name}"


def gone(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except KubeError as err:
        return err.status == 404
    return False


@pytest.fixture
def apiservice_set_aside(kube: Kube) -> Iterator[None]:
    """The session's registration (if an earlier scenario made one) is set aside for the release and put back."""
    try:
        saved: dict[str, Any] | None = kube.get(install.APISERVICE_PATH)
    except KubeError:
        saved = None
    kube.delete(install.APISERVICE_PATH)
    yield
    if saved is not None and gone(kube, install.APISERVICE_PATH):
        meta = {key: saved["metadata"][key] for key in ("name", "labels", "annotations") if key in saved["metadata"]}
        kube.apply([{"apiVersion": saved["apiVersion"], "kind": "APIService", "metadata": meta, "spec": saved["spec"]}])
        install.wait_available(kube)


def test_helm_install_scale_upgrade_uninstall(
    apiservice_set_aside: None,
    plane: ControlPlane,
    kube: Kube,
    redis_server: RedisProcess,
    workdir: Path,
    timeline: Timeline,
) -> None:
    directory = workdir / "helm"
    directory.mkdir()
    service = ServiceProxy(0, target=0)
    helm = Helm(plane, directory, service.port)
    pods: list[Pod] = []
    installed = False
    jobs = redis_server.client()
    jobs.delete(KEY)
    try:
        # Another server owns the external metrics API: the install stops, saying whose it is and what to do.
        foreign = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": install.APISERVICE},
            "spec": {
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443},
                "insecureSkipTLSVerify": True,
            },
        }
        kube.apply([foreign])
        refused = helm.run(*helm.chart_args("install", values_file(directory, redis_server, 0.5)))
        assert refused.returncode != 0
        assert "serves keda/keda-operator-metrics-apiserver" in refused.stderr, refused.stderr
        assert "apiService.enabled=false" in refused.stderr
        assert gone(kube, f"/api/v1/namespaces/{NAMESPACE}/configmaps/{RELEASE}-config"), (
            "a refused install made objects"
        )
        kube.delete(install.APISERVICE_PATH)
        wait_for(lambda: gone(kube, install.APISERVICE_PATH), 10, "the foreign APIService removed")

        took = helm.deploy("install", values_file(directory, redis_server, 0.5))
        installed = True
        pods.append(start_pod(kube, plane, directory, "adapter-a"))
        service.route_to(pods[0].port)
        # The aggregator retries a failed first check with a backoff: its wait depends on when the pod came up.
        available_after = install.wait_available(kube, timeout=120)

        kube.namespace(WORKLOADS)
        hpa = external_hpa(WORKLOADS, NAME, "redis-jobs", {"key": KEY}, 10, 5)
        start_at_zero(kube, hpa, "the HPA reads an empty queue through the chart's adapter")
        jobs.rpush(KEY, *range(30))
        up = wait_replicas(kube, WORKLOADS, NAME, 3)

        # helm upgrade with a changed value: the ConfigMap changes, so the Deployment's pod template does.
        template = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{ADAPTER}")["spec"]["template"]
        ca_bundle = kube.get(install.APISERVICE_PATH)["spec"]["caBundle"]
        serving = kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ADAPTER}-serving")["data"]
        with Watch(kube) as watch:
            upgraded = helm.deploy("upgrade", values_file(directory, redis_server, 1.0))
            after = kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{ADAPTER}")["spec"]["template"]
            assert after["metadata"]["annotations"] != template["metadata"]["annotations"], "the upgrade rolls pods"
            # The generated CA and certificates are read back (`lookup`), not made anew: the old pod's certificate
            # stays trusted, and the new pod mounts the same one.
            assert kube.get(install.APISERVICE_PATH)["spec"]["caBundle"] == ca_bundle, "the upgrade changed the CA"
            assert kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ADAPTER}-serving")["data"] == serving
            selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=zeroscale-adapter"
            wait_for(
                lambda: (
                    len(kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets?labelSelector={selector}")["items"])
                    == 2
                ),
                20,
                "a second ReplicaSet for the new pod template",
            )
            # The rollout as maxSurge 1 / maxUnavailable 0 makes it: the new pod Ready, then the old one goes.
            pods.append(start_pod(kube, plane, directory, "adapter-b"))
            assert pods[1].config["cache"]["interval"] == 1.0, "the new pod reads the upgraded config"
            service.route_to(pods[1].port)
            pods[0].process.stop()
            wait_for(lambda: "external.metrics.k8s.io" in pods[1].process.log_file.read_text(), 20, "the HPA reads B")
            time.sleep(3 * SYNC)  # three more syncs served by the new pod alone
        outage = watch.longest_unavailable()
        replicas_seen = {replicas for _, _, replicas, _ in watch.samples}
        reasons = {reason for _, _, _, reason in watch.samples}
        assert outage < SYNC, f"the APIService was not Available for {outage:.1f} s (one HPA sync is {SYNC:g} s)"
        assert replicas_seen == {3}, f"the HPA moved during the rollout: {replicas_seen}"
        assert reasons == {"ValidMetricFound"}, f"the HPA failed to read its metric during the rollout: {reasons}"

        jobs.delete(KEY)
        down = wait_replicas(kube, WORKLOADS, NAME, 0)
        kube.delete(f"/apis/{HPA_API}/namespaces/{WORKLOADS}/horizontalpodautoscalers/{NAME}")

        # A leaf certificate near its expiry (here: renewDays longer than its validity) is reissued by an upgrade
        # from the same CA: the caBundle, and the certificate the running pod serves, stay trusted.
        helm.deploy(
            "upgrade", values_file(directory, redis_server, 1.0), "--set", "certificates.generate.renewDays=400"
        )
        renewed = kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ADAPTER}-serving")["data"]
        assert renewed["tls.crt"] != serving["tls.crt"], "the leaf was not reissued"
        assert renewed["ca.crt"] == serving["ca.crt"]
        assert kube.get(install.APISERVICE_PATH)["spec"]["caBundle"] == ca_bundle
        assert install.available(kube).get("status") == "True"

        objects = release_objects(helm)
        start = time.monotonic()
        helm("uninstall", RELEASE, "--wait", "--timeout", "60s")
        installed = False
        uninstalled = time.monotonic() - start
        for obj in objects:
            path = object_path(*obj)
            wait_for(lambda path=path: gone(kube, path), 10, f"{obj[1]} {obj[3]} removed")  # type: ignore[misc]
        # Nor anything the release's objects made (its Deployments' ReplicaSets: the garbage collector's work).
        label = f"app.kubernetes.io/instance={RELEASE}"

        def nothing_labelled() -> bool:
            return not any(kube.get(f"{path}?labelSelector={label}")["items"] for path in LABELLED)

        wait_for(nothing_labelled, 30, "no object labelled with the release anywhere")
        assert gone(kube, install.APISERVICE_PATH)
        kinds = sorted({f"{kind}" for _, kind, _, _ in objects})
        timeline.record(
            "helm: install refused while keda/keda-operator-metrics-apiserver owned the APIService (named in the "
            f"error); install {took:.1f} s, APIService Available {available_after:.1f} s after the pod was ready; "
            f"HPA 1->0, 0->3 in {up:.1f} s; upgrade (config.cache.interval 0.5 -> 1) {upgraded:.1f} s, new "
            f"ReplicaSet, adapter rolled A->B: APIService unavailable at most {outage:.1f} s of {len(watch.samples)} "
            f"samples, HPA at 3 reading its metric throughout; 3->0 in {down:.1f} s through B; an upgrade within "
            "renewDays reissued the adapter's certificate from the same CA (caBundle unchanged); uninstall "
            f"{uninstalled:.1f} s removed all {len(objects)} objects ({', '.join(kinds)}), APIService included; "
            "nothing labelled with the release left (ReplicaSets collected)"
        )
    finally:
        for pod in pods:
            pod.process.stop()
        service.close()
        if installed:
            subprocess.run(
                [str(helm.binary), "uninstall", RELEASE, "--namespace", NAMESPACE],
                env=helm.env,
                capture_output=True,
                timeout=120,
                check=False,
            )
