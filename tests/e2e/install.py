"""Installing Zeroscale into the test control plane the way a user does, from the shipped manifests.

The RBAC is deploy/base's own (adapter, proxy, HPA controller; test_13 adds deploy/overlays/activator's for mode
activator, which deploy/base does not grant) and the APIService is deploy/base's, with
the `caBundle` `zeroscale certs` made. What differs from a real cluster is only what a cluster without
kubelet or kube-proxy forces: the adapter runs here as a process, so its Service is an ExternalName to
`localhost` (the aggregator dials `localhost:PORT` but still checks the certificate against
`zeroscale-adapter.zeroscale.svc`), its identity is a token of its ServiceAccount from the TokenRequest
API (what kubelet mounts), and the test writes the EndpointSlice a kubelet and the EndpointSlice controller would.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ENDPOINTSLICE_API, Kube, wait_for

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
NAMESPACE = "zeroscale"
SERVICE = "zeroscale-adapter"
SERVING_SECRET = "zeroscale-adapter-serving"
APISERVICE = "v1beta1.external.metrics.k8s.io"
APISERVICE_PATH = f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}"
DISCOVERY_PATH = "/apis/external.metrics.k8s.io/v1beta1"
HPA_BINDING = "zeroscale-hpa-external-metrics"
_CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "APIService", "Namespace"}


def shipped(name: str) -> list[dict[str, Any]]:
    """The documents of deploy/base/NAME, in the zeroscale namespace as kustomize would put them."""
    documents = [doc for doc in yaml.safe_load_all((BASE / name).read_text(encoding="utf-8")) if doc]
    for doc in documents:
        if doc["kind"] not in _CLUSTER_SCOPED:
            doc["metadata"].setdefault("namespace", NAMESPACE)
    return documents


def make_certs(out_dir: Path, *dns_names: str) -> Path:
    """`zeroscale certs` for the shipped Service and `dns_names`; returns the directory of ca.crt, tls.crt, tls.key."""
    command = [sys.executable, "-m", "adapter", "certs", "--service", SERVICE, "--namespace", NAMESPACE]
    command += [f"--dns-name={name}" for name in dns_names]
    subprocess.run([*command, "--days", "90", "--out-dir", str(out_dir)], check=True, capture_output=True, timeout=60)
    return out_dir


def install_rbac(kube: Kube) -> None:
    kube.namespace(NAMESPACE)
    kube.apply(shipped("adapter-rbac.yaml") + shipped("proxy-rbac.yaml") + shipped("hpa-rbac.yaml"))


def apiservice(port: int, ca_pem: bytes) -> dict[str, Any]:
    (document,) = shipped("apiservice.yaml")
    document["spec"]["service"]["port"] = port
    document["spec"]["caBundle"] = base64.b64encode(ca_pem).decode()
    return document


def register(kube: Kube, port: int, certs: Path) -> None:
    """Service, serving Secret and APIService for an adapter on 127.0.0.1:PORT.

    No EndpointSlice: the aggregator dials an ExternalName Service's name, and v1.37 refuses loopback
    addresses in EndpointSlices anyway."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": SERVING_SECRET, "namespace": NAMESPACE},
        "data": {
            "tls.crt": base64.b64encode((certs / "tls.crt").read_bytes()).decode(),
            "tls.key": base64.b64encode((certs / "tls.key").read_bytes()).decode(),
        },
    }
    kube.apply([service, secret, apiservice(port, (certs / "ca.crt").read_bytes())])


def endpoint_slice(namespace: str, name: str, service: str, port_name: str, address: str, port: int) -> dict[str, Any]:
    """A ready endpoint, as the EndpointSlice controller writes it once a pod is Ready (not on loopback:
    the apiserver refuses 127.0.0.0/8 there)."""
    return {
        "apiVersion": ENDPOINTSLICE_API,
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def available(kube: Kube) -> dict[str, Any]:
    """The APIService's Available condition."""
    status = kube.get(APISERVICE_PATH).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Available"), {})


def wait_available(kube: Kube, timeout: float = 60.0) -> float:
    """Seconds until the aggregator reports the APIService Available=True and proxies discovery to it.

    Both: the aggregator can report Available a moment before its proxy handler for the group is in place.
    """
    start = time.monotonic()
    wait_for(lambda: available(kube).get("status") == "True", timeout, f"APIService {APISERVICE} Available")
    wait_for(lambda: kube.get(DISCOVERY_PATH).get("kind") == "APIResourceList", timeout, "discovery via the aggregator")
    return time.monotonic() - start


def token_file(kube: Kube, account: str, directory: Path) -> Path:
    """The ServiceAccount's token, written where the process reads it (as a kubelet mounts it)."""
    path = directory / f"{account}.token"
    path.write_text(kube.service_account_token(NAMESPACE, account), encoding="utf-8")
    path.chmod(0o600)
    return path


# Where the chart mounts its Secrets in a pod: the config's paths under it are this 'pod's own files.
MOUNTED_TLS = "/etc/zeroscale/tls/"


def mounted(config: Any, directory: Path) -> Any:
    """The config with the Secret's mount path pointing where this 'pod' has its files."""
    if isinstance(config, dict):
        return {key: mounted(value, directory) for key, value in config.items()}
    if isinstance(config, list):
        return [mounted(item, directory) for item in config]
    if isinstance(config, str) and config.startswith(MOUNTED_TLS):
        return str(directory / config.removeprefix(MOUNTED_TLS))
    return config


def chart_pod(
    kube: Kube, directory: Path, namespace: str, secret: str, config_map: str, account: str
) -> tuple[dict[str, Any], Path]:
    """A pod of the chart as kubelet would run it, in `directory`: its Secret's files, its ConfigMap's config (pointing
    at them) and its ServiceAccount's token; returns the config and the token's file."""
    (directory / "tls").mkdir(parents=True)
    for key, value in kube.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}")["data"].items():
        (directory / "tls" / key).write_bytes(base64.b64decode(value))
    data = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{config_map}")["data"]
    config = mounted(yaml.safe_load(data["config.yaml"]), directory / "tls")
    token = directory / "token"
    token.write_text(kube.service_account_token(namespace, account), encoding="utf-8")
    return config, token
