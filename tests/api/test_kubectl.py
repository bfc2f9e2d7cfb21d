"""The "done when" check: `zeroscale serve --config deploy/local/zeroscale.yaml` and kubectl against it."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.replicas import Process, spawn

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "local" / "zeroscale.yaml"
METRIC = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/demo-queue-depth"
GROUP_VERSION = {"groupVersion": "external.metrics.k8s.io/v1beta1", "version": "v1beta1"}


class Served:
    def __init__(self, adapter: Process) -> None:
        self.process = adapter.process
        self.log = adapter.log
        self.port = adapter.ports["https"]
        self.metrics_port = adapter.ports["metrics"]

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        # A token, so kubectl does not prompt for a username; authentication is off in this config.
        command = ["kubectl", "--server", f"https://127.0.0.1:{self.port}", "--insecure-skip-tls-verify"]
        return subprocess.run(
            [*command, "--token", "unused", *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "KUBECONFIG": "/dev/null"},
            check=False,
        )

    def raw(self, path: str) -> object:
        result = self.kubectl("get", "--raw", path)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    ports = {"ZEROSCALE_SERVER__PORT": "0", "ZEROSCALE_SERVER__METRICS_PORT": "0"}
    adapter = spawn("adapter", "serve", tmp_path_factory.mktemp("kubectl"), "--config", str(CONFIG), env=ports)
    try:
        yield Served(adapter)
    finally:
        adapter.stop()


def test_discovery_documents(served: Served) -> None:
    group = {"name": "external.metrics.k8s.io", "versions": [GROUP_VERSION], "preferredVersion": GROUP_VERSION}
    assert served.raw("/apis") == {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    assert served.raw("/apis/external.metrics.k8s.io") == {"kind": "APIGroup", "apiVersion": "v1", **group}
    assert served.raw("/apis/external.metrics.k8s.io/v1beta1") == {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "external.metrics.k8s.io/v1beta1",
        "resources": [
            {
                "name": "demo-queue-depth",
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
        ],
    }


def test_kubectl_api_resources(served: Served) -> None:
    result = served.kubectl("api-resources", "--api-group=external.metrics.k8s.io", "--no-headers")
    assert result.returncode == 0, result.stderr
    name, version, namespaced, kind = result.stdout.split()
    assert (name, version, namespaced, kind) == (
        "demo-queue-depth",
        "external.metrics.k8s.io/v1beta1",
        "true",
        "ExternalMetricValueList",
    )


def test_metric_value_is_a_canonical_quantity(served: Served) -> None:
    listing = served.raw(METRIC)
    assert isinstance(listing, dict)
    assert listing["kind"] == "ExternalMetricValueList"
    assert listing["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    (item,) = listing["items"]
    assert item["metricName"] == "demo-queue-depth"
    assert item["metricLabels"] == {}
    assert item["value"] == "1500500m"  # 1500 + 0.5, Go's canonical form
    assert item["timestamp"].endswith("Z")
    assert len(item["timestamp"]) == len("2020-04-28T10:48:44Z")

    selected = served.raw(f"{METRIC}?labelSelector=queue%3Dorders")
    assert isinstance(selected, dict)
    assert selected["items"][0]["value"] == "1500"
    assert selected["items"][0]["metricLabels"] == {"queue": "orders"}


def test_upper_case_metric_name_works(served: Served) -> None:
    listing = served.raw(METRIC.replace("demo-queue-depth", "DEMO-Queue-Depth"))
    assert isinstance(listing, dict)
    assert listing["items"][0]["value"] == "1500500m"


def test_unknown_metric_is_a_404_status(served: Served) -> None:
    result = served.kubectl("get", "--raw", METRIC.replace("demo-queue-depth", "no-such-metric"))
    assert result.returncode != 0
    assert "NotFound" in result.stderr
    assert "the server could not find the metric no-such-metric" in result.stderr
    status = _https_json(served.port, METRIC.replace("demo-queue-depth", "no-such-metric"))
    assert status == (
        404,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server could not find the metric no-such-metric for namespaces",
            "reason": "NotFound",
            "code": 404,
        },
    )


def test_malformed_selector_is_a_400_status(served: Served) -> None:
    result = served.kubectl("get", "--raw", f"{METRIC}?labelSelector=queue+in+%28orders")
    assert result.returncode != 0
    assert "BadRequest" in result.stderr
    code, status = _https_json(served.port, f"{METRIC}?labelSelector=queue+in+%28orders")
    assert code == 400
    assert status["reason"] == "BadRequest"
    assert status["code"] == 400


def test_openapi_and_health(served: Served) -> None:
    assert _https_json(served.port, "/openapi/v2")[0] == 404
    assert _https_json(served.port, "/openapi/v3")[0] == 404
    result = served.kubectl("get", "--raw", "/healthz")
    assert (result.returncode, result.stdout) == (0, "ok")


def test_prometheus_metrics_count_requests(served: Served) -> None:
    served.raw(METRIC)
    with urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'zeroscale_api_requests_total{code="200",route="list"}' in text
    assert "zeroscale_api_request_duration_seconds_bucket" in text


def test_sigterm_stops_cleanly(served: Served) -> None:
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(10) == 0
    assert "AUTHENTICATION IS OFF" in served.log.read_text()


def test_auth_off_is_refused_off_loopback(tmp_path: Path) -> None:
    env = {"ZEROSCALE_SERVER__BIND": "0.0.0.0", "ZEROSCALE_SERVER__PORT": "0"}
    adapter = spawn("adapter", "serve", tmp_path, "--config", str(CONFIG), env=env)
    assert adapter.process.wait(30) == 2
    output = adapter.log.read_text()
    assert "server.auth.enabled is false" in output
    assert "bind='0.0.0.0'" in output


def test_auth_that_cannot_reach_the_kubernetes_api_stops_the_start(tmp_path: Path) -> None:
    """Authentication asks the Kubernetes API (TokenReview, SubjectAccessReview): no API, no start (exit 2)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")  # readable, and names no cluster
    env = {
        "ZEROSCALE_SERVER__PORT": "0",
        "ZEROSCALE_SERVER__AUTH__ENABLED": "true",
        "ZEROSCALE_SERVER__AUTH__KUBERNETES__KUBECONFIG": str(kubeconfig),
    }
    adapter = spawn("adapter", "serve", tmp_path, "--config", str(CONFIG), env=env)
    assert adapter.process.wait(30) == 2
    output = adapter.log.read_text()
    assert "authentication needs the Kubernetes API" in output, output
    assert "(server.auth.kubernetes)" in output


def _https_json(port: int, path: str) -> tuple[int, dict[str, object]]:
    """Status code and JSON body; error answers must be JSON too."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        code, content_type, body = err.code, err.headers["Content-Type"], err.read()
    assert content_type == "application/json"
    return code, json.loads(body)
