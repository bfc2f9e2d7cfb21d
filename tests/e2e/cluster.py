"""The real control plane scripts/k8s builds (kube-apiserver + aggregator, kube-controller-manager), as tests use it.

`ControlPlane` starts it with scripts/k8s/up and stops it with down; `Kube` talks to it as the
cluster admin: `kubectl apply` for manifests, plain HTTPS (the admin's client certificate) for the many small
reads a test polls with, so a poll costs milliseconds rather than a kubectl start.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from http.client import HTTPSConnection
from pathlib import Path
from typing import Any, TypeVar

K8S_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "k8s"
HOME = Path(os.environ.get("ZS_K8S_HOME", Path.home() / ".cache" / "zeroscale-k8s"))
API_PORT = int(os.environ.get("ZS_K8S_PORT", "16443"))
# What every supported release (v1.33+) serves.
HPA_API = "autoscaling/v2"
ENDPOINTSLICE_API = "discovery.k8s.io/v1"
SCALED_TO_ZERO_MINOR = 37

T = TypeVar("T")


class ControlPlane:
    """Paths of the running control plane's state, and its start and stop."""

    def __init__(self, home: Path = HOME) -> None:
        self.home = home
        self.run_dir = home / "run"
        self.pki = self.run_dir / "pki"
        self.url = f"https://127.0.0.1:{API_PORT}"
        self.started_here = False

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    def running(self) -> bool:
        pid_file = self.run_dir / "apiserver.pid"
        if not pid_file.exists():
            return False
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
        except (OSError, ValueError):
            return False
        return True

    def up(self) -> None:
        """Start it unless it runs already (then the one who started it stops it)."""
        if self.running():
            return
        done = subprocess.run([K8S_SCRIPTS / "up"], capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/k8s/up failed (is it built? `make e2e` builds it): {done.stderr.strip()}")
        self.started_here = True

    def down(self) -> None:
        if self.started_here:
            subprocess.run([K8S_SCRIPTS / "down"], check=False, capture_output=True, timeout=60)
            self.started_here = False


class KubeError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class Kube:
    """The cluster as its admin (system:masters)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self._tls = ssl.create_default_context(cafile=str(plane.pki / "ca.crt"))
        self._tls.load_cert_chain(str(plane.pki / "admin.crt"), str(plane.pki / "admin.key"))
        self._minor: int | None = None

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.plane.admin_kubeconfig)}
        done = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=env, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def apply(self, objects: Iterable[dict[str, Any]]) -> None:
        items = list(objects)
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> Any:
        connection = self.connection()
        try:
            data = None if body is None else json.dumps(body).encode()
            sent = {"Content-Type": content_type, "Accept": "application/json", **(headers or {})}
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw.decode(errors="replace")}
        if response.status >= 400:
            raise KubeError(response.status, decoded if isinstance(decoded, dict) else {"message": raw.decode()})
        return decoded

    def connection(self, timeout: float | None = 15) -> HTTPSConnection:
        """A connection to the API server as the admin (`timeout` None: a watch, which may be silent for long)."""
        return HTTPSConnection("127.0.0.1", API_PORT, context=self._tls, timeout=timeout)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except KubeError as err:
            if err.status != 404:
                raise

    def replicas(self, namespace: str, deployment: str) -> int:
        """spec.replicas of the Deployment (omitted, i.e. 0, at zero)."""
        scale = self.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale")
        return int(scale.get("spec", {}).get("replicas", 0))

    def hpa(self, namespace: str, name: str) -> dict[str, Any]:
        hpa: dict[str, Any] = self.get(f"/apis/{HPA_API}/namespaces/{namespace}/horizontalpodautoscalers/{name}")
        return hpa

    def namespace(self, name: str) -> None:
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bound token for the ServiceAccount from the TokenRequest API, as kubelet mounts one (an hour)."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        return str(self.request("POST", path, request)["status"]["token"])

    def server_minor(self) -> int:
        """The apiserver's minor version (37 for v1.37.2)."""
        if self._minor is None:
            self._minor = int(str(self.get("/version")["minor"]).rstrip("+"))
        return self._minor

    def records_scaled_to_zero(self) -> bool:
        """v1.37+: the HPA records ScaledToZero and wakes only what it scaled to zero; before, with the alpha
        gate on, it computes from zero whenever minReplicas is 0 (`make e2e K8S_VERSION=1.3x.y`)."""
        return self.server_minor() >= SCALED_TO_ZERO_MINOR


class Watch:
    """A collection listed, then watched from the list's resourceVersion by a thread of its own, as a controller
    follows it: `on_event(type, object, at)` for every listed object (ADDED) and every event after, `at` being the
    wall-clock time it arrived. A watch the server ends is resumed from the last version seen. close() stops it
    and raises what `on_event` raised, if anything, so a broken observer fails its test rather than going quiet.
    """

    def __init__(self, kube: Kube, path: str, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        self._kube = kube
        self._path = path
        self._on_event = on_event
        self._closed = False
        self._failure: BaseException | None = None
        self._connection: HTTPSConnection | None = None
        listing = kube.get(path)
        for obj in listing["items"]:
            on_event("ADDED", obj, time.time())
        self._version = str(listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")
        self._thread.start()

    def _run(self) -> None:
        separator = "&" if "?" in self._path else "?"
        try:
            while not self._closed:
                self._connection = connection = self._kube.connection(timeout=None)
                connection.request("GET", f"{self._path}{separator}watch=1&resourceVersion={self._version}")
                response = connection.getresponse()
                if response.status != 200:
                    raise KubeError(response.status, {"message": response.read().decode(errors="replace")})
                while line := response.readline():
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise KubeError(int(event["object"].get("code", 0)), event["object"])
                    self._version = str(event["object"]["metadata"]["resourceVersion"])
                    self._on_event(event["type"], event["object"], time.time())
                connection.close()
        except BaseException as err:
            if not self._closed:
                self._failure = err

    def close(self) -> None:
        self._closed = True
        connection = self._connection
        if connection is not None and connection.sock is not None:
            with suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        if self._failure is not None:
            raise RuntimeError(f"the watch of {self._path} failed") from self._failure


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll until `condition` returns something other than None/False; its value is returned."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value is not None and value is not False:
                return value
        except (KubeError, OSError) as err:
            last_error = err
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"{what}: not within {timeout:g} s{suffix}")
        time.sleep(interval)


def wait_replicas(kube: Kube, namespace: str, deployment: str, want: int, timeout: float = 40.0) -> float:
    """Seconds until the Deployment's spec.replicas reads `want`."""
    start = time.monotonic()
    wait_for(lambda: kube.replicas(namespace, deployment) == want, timeout, f"{namespace}/{deployment} at {want}")
    return time.monotonic() - start


def deployment(namespace: str, name: str, replicas: int = 0) -> dict[str, Any]:
    """A Deployment no kubelet will ever run: the controllers and the scale subresource are what count here."""
    labels = {"app": name}
    container = {"name": "app", "image": "registry.invalid/zeroscale-e2e:never-pulled"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def external_hpa(
    namespace: str,
    name: str,
    metric: str,
    selector: dict[str, str],
    average_value: int,
    max_replicas: int,
) -> dict[str, Any]:
    """An HPA on one External metric with minReplicas 0 and no stabilization, so a test takes seconds."""
    immediate = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max"}
    return {
        "apiVersion": HPA_API,
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 0,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": metric, "selector": {"matchLabels": selector}},
                        "target": {"type": "AverageValue", "averageValue": str(average_value)},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {**immediate, "policies": [{"type": "Pods", "value": 100, "periodSeconds": 1}]},
                "scaleDown": {**immediate, "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}]},
            },
        },
    }


def hpa_metric_total(hpa: dict[str, Any]) -> float | None:
    """The External metric's total the HPA controller last read, when its status can tell.

    With an AverageValue target v1.20 reports only the average (value stays 0), and at 0 replicas that
    average is value / 0 (the int64 minimum): the total is average x replicas, known only above 0.
    """
    status = hpa.get("status") or {}
    replicas = int(status.get("currentReplicas") or 0)
    for metric in status.get("currentMetrics") or []:
        average = ((metric.get("external") or {}).get("current") or {}).get("averageValue")
        if average is not None and replicas > 0:
            return parse_quantity(str(average)) * replicas
    return None


def hpa_reads_metric(hpa: dict[str, Any]) -> bool:
    """The controller's last sync fetched the metric (ScalingActive=True, ValidMetricFound)."""
    active = hpa_condition(hpa, "ScalingActive")
    return active.get("status") == "True" and active.get("reason") == "ValidMetricFound"


def start_at_zero(kube: Kube, hpa: dict[str, Any], what: str, *others: dict[str, Any]) -> None:
    """Apply the Deployment `hpa` scales (at 1 replica), `others` and `hpa`, with the metric at 0; return once
    the HPA has scaled it to 0 itself (ScaledToZero=True) and reads its metric there (`what`, within 30 s).

    At 1 first: v1.37 scales from zero only a workload its HPA took to zero; one found at zero it leaves alone
    (ScalingActive=False, ScalingDisabled), as it does a workload a person scaled to zero.
    """
    namespace, name = hpa["metadata"]["namespace"], hpa["metadata"]["name"]
    kube.apply([deployment(namespace, name, replicas=1), *others, hpa])
    wait_replicas(kube, namespace, name, 0)

    def scaled_to_zero_and_reading() -> bool:
        status = kube.hpa(namespace, name)
        scaled = hpa_condition(status, "ScaledToZero").get("status") == "True" or not kube.records_scaled_to_zero()
        return scaled and hpa_reads_metric(status)

    wait_for(scaled_to_zero_and_reading, 30, what)


def wait_hpa_total(kube: Kube, namespace: str, name: str, total: float, timeout: float, what: str) -> None:
    """Wait until the HPA's status shows it read `total` (see hpa_metric_total)."""
    wait_for(lambda: hpa_metric_total(kube.hpa(namespace, name)) == total, timeout, what)


def wait_scaled_to_zero(kube: Kube, namespace: str, name: str, status: str) -> str:
    """Wait (10 s) for the HPA's ScaledToZero condition to read `status` ("True"/"False"); returns its reason
    (before v1.37, which has no such condition, says so at once)."""
    if not kube.records_scaled_to_zero():
        return "none before v1.37"

    def reason() -> str | None:
        condition = hpa_condition(kube.hpa(namespace, name), "ScaledToZero")
        return str(condition["reason"]) if condition.get("status") == status else None

    return wait_for(reason, 10, f"{namespace}/{name}: ScaledToZero={status}")


def hpa_condition(hpa: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in (hpa.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def parse_quantity(text: str) -> float:
    """The few Quantity forms an HPA status shows (`3`, `1500m`, `2k`)."""
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    if text and text[-1] in suffixes:
        return float(text[:-1]) * suffixes[text[-1]]
    return float(text)
