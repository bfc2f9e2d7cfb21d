"""`zeroscale explain` end to end: manifests with known answers, via --set, a stand-in metrics API and --kubeconfig."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.cli import main
from tests.fixtures.kube_standin import Reply, StandInRequest, status_body
from tests.hpa.builders import hpa_document
from tests.hpa.fixtures import MetricsStandIn

WORKER = hpa_document(
    name="worker",
    min_replicas=0,
    max_replicas=10,
    behavior={},
    metrics=[
        {
            "type": "External",
            "external": {
                "metric": {"name": "S0-Jobs", "selector": {"matchLabels": {"queue": "jobs"}}},
                "target": {"type": "AverageValue", "averageValue": "1"},
            },
        }
    ],
)
WEB = hpa_document(name="web", target=("Value", "10"), max_replicas=20)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "hpa.yaml"
    path.write_text(yaml.safe_dump_all([WORKER, WEB]))
    return path


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["explain", *args, "-o", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if code == 0 else []


def from_standin(manifests: Path, metrics_standin: MetricsStandIn, replicas: int, *extra: str) -> list[str]:
    """explain's arguments: the manifests with queue=10 at `replicas`, the metric read from the stand-in."""
    kube = metrics_standin.kube
    return [
        "-f",
        str(manifests),
        "--set",
        "queue=10",
        "--replicas",
        str(replicas),
        "--adapter-url",
        kube.url,
        "--token-file",
        str(kube.token_file),
        *extra,
    ]


def condition(result: dict[str, Any], kind: str) -> tuple[str, str, str]:
    found = next(c for c in result["conditions"] if c["type"] == kind)
    return found["status"], found["reason"], found["message"]


def test_what_if_from_the_command_line(manifests: Path) -> None:
    """docs/protocols.md#hpa-scale-to-zero from zero with --scaled-to-zero: AverageValue ceil(35/1) = 35, limited by the
    default Pods 4 to 4.

    The Value HPA at 2 replicas (2 ready): ratio 45/10 = 4.5 -> ceil(4.5*2) = 9, legacy limit max(2*2, 4) = 4.
    Runs the installed entry point in a subprocess, as a user would.
    """
    command = [sys.executable, "-m", "adapter", "explain", "-f", str(manifests), "--set", "s0-jobs=35"]
    command += ["--set", "queue=45", "--replicas", "0", "--scaled-to-zero", "-o", "json"]
    worker_only = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert worker_only.returncode == 0, worker_only.stderr
    worker, web = json.loads(worker_only.stdout)
    assert (worker["currentReplicas"], worker["recommendation"], worker["desiredReplicas"]) == (0, 35, 4)
    assert worker["limits"]["reason"] == "ScaleUpLimit"
    assert condition(worker, "ScaledToZero")[:2] == ("False", "NotScaledToZero")
    # minReplicas 1 and replicas 0: a paused workload, metrics not even read (docs/protocols.md#hpa-scale-to-zero).
    assert (web["desiredReplicas"], condition(web, "ScalingActive")[1]) == (0, "ScalingDisabled")


def test_value_target_uses_ready_pods(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/protocols.md#hpa-replica-math: Value -> ceil(4.5 * readyPods); with 1 of 2 pods ready, ceil(4.5) = 5."""
    code, results = explain_json(
        capsys, "-f", str(manifests), "--set", "queue=45", "--set", "s0-jobs=0", "--replicas", "2", "--ready-pods", "1"
    )
    web = results[1]
    assert code == 0
    assert web["metrics"][0]["ratio"] == 4.5
    assert web["metrics"][0]["toleranceBand"] == [0.9, 1.1]
    assert (web["recommendation"], web["desiredReplicas"]) == (5, 4)  # legacy limit max(2*2, 4)


def test_table_names_every_step(
    manifests: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["explain", "-f", str(manifests), "--set", "s0-jobs=3", "--set", "queue=10", "--replicas", "2"]) == 0
    out = capsys.readouterr().out
    for piece in (
        "default/worker -> Deployment/worker: 2 -> 3 replicas",
        "AverageValue",
        "[0.9, 1.1] outside",
        "raw recommendation",
        "stabilization",
        "policy Pods 4 pods per 15s",
        "why",
        "no change: the metrics ask for the current 2 replica(s)",
        "MatchLabels:map[string]string",
    ):
        assert piece in out


def test_reads_the_adapter_over_https(
    manifests: Path, metrics_standin: MetricsStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/protocols.md#em-list-call, docs/protocols.md#em-response, docs/protocols.md#hpa-calls: lower-cased name,
    encoded selector, items' MilliValue summed (1500m + 2 = 3.5 -> 4)."""
    metrics_standin.values["s0-jobs"] = ["1500m", "2"]
    kube = metrics_standin.kube
    code, results = explain_json(capsys, *from_standin(manifests, metrics_standin, 1, "--ca-file", str(kube.ca_file)))
    assert code == 0
    worker = results[0]
    assert worker["metrics"][0]["value"] == "3500m"
    assert (worker["recommendation"], worker["desiredReplicas"]) == (4, 4)
    assert metrics_standin.calls == [("default", "s0-jobs", "queue=jobs")]
    assert any(headers.get("authorization") == f"Bearer {kube.token}" for _, _, headers in kube.requests)


def test_insecure_skip_tls_verify(
    manifests: Path, metrics_standin: MetricsStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics_standin.values["s0-jobs"] = ["2"]
    common = from_standin(manifests, metrics_standin, 1)
    code, results = explain_json(capsys, *common, "--insecure-skip-tls-verify")
    assert (code, results[0]["desiredReplicas"]) == (0, 2)
    # Without it (and without --ca-file) the certificate is refused: shown as the HPA would show a failed fetch.
    code, results = explain_json(capsys, *common)
    assert code == 0
    status, reason, message = condition(results[0], "ScalingActive")
    assert (status, reason) == ("False", "FailedGetExternalMetric")
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert results[0]["desiredReplicas"] == 1


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("missing", "unable to fetch metrics from external metrics API: the server could not find the metric s0-jobs"),
        (
            "forbidden",
            "unable to fetch metrics from external metrics API: s0-jobs.external.metrics.k8s.io is forbidden",
        ),
        ("empty", "no metrics returned from external metrics API"),
    ],
)
def test_errors_are_shown_as_the_hpa_would(
    response: str, expected: str, manifests: Path, metrics_standin: MetricsStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/protocols.md#em-response, docs/protocols.md#em-errors: Status errors and empty lists -> ScalingActive=False
    FailedGetExternalMetric, no scaling."""
    if response == "forbidden":
        metrics_standin.errors["s0-jobs"] = (403, "Forbidden", 's0-jobs.external.metrics.k8s.io is forbidden: User "u"')
    elif response == "empty":
        metrics_standin.values["s0-jobs"] = []
    ca_file = str(metrics_standin.kube.ca_file)
    code, results = explain_json(capsys, *from_standin(manifests, metrics_standin, 3, "--ca-file", ca_file))
    assert code == 0
    worker = results[0]
    status, reason, message = condition(worker, "ScalingActive")
    assert (status, reason) == ("False", "FailedGetExternalMetric")
    prefix = (
        "the HPA was unable to compute the replica count: unable to get external metric default/S0-Jobs/&LabelSelector{"
    )
    assert message.startswith(prefix)
    assert expected in message
    assert (worker["desiredReplicas"], worker["rescale"]) == (3, False)
    assert [e["reason"] for e in worker["events"]] == ["FailedGetExternalMetric", "FailedComputeMetricsReplicas"]


def write_kubeconfig(path: Path, metrics_standin: MetricsStandIn) -> Path:
    kube = metrics_standin.kube
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": kube.url, "certificate-authority": str(kube.ca_file)}}],
        "users": [{"name": "me", "user": {"tokenFile": str(kube.token_file)}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def pod(name: str, ready: bool) -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "metadata": {"name": name},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": status}]},
    }


def test_reads_scale_pods_and_metrics_through_a_kubeconfig(
    tmp_path: Path, metrics_standin: MetricsStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/protocols.md#scale-subresource scale (spec.replicas omitted at 0), pods Running+Ready, metrics via the
    apiserver path."""
    kube = metrics_standin.kube
    selectors: list[str | None] = []

    def scale(_request: StandInRequest, match: re.Match[str]) -> Reply:
        replicas = {"web": 2, "worker": 0}[match.group(1)]
        spec = {"replicas": replicas} if replicas else {}
        status = {"replicas": replicas, "selector": f"app={match.group(1)}"}
        return Reply(200, {"kind": "Scale", "apiVersion": "autoscaling/v1", "spec": spec, "status": status})

    def pods(request: StandInRequest, _match: re.Match[str]) -> Reply:
        selectors.append(request.param("labelSelector"))
        items = [pod("a", True), pod("b", False)] if request.param("labelSelector") == "app=web" else []
        return Reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})

    def hpa(_request: StandInRequest, match: re.Match[str]) -> Reply:
        if match.group(1) == "worker":
            conditions = [{"type": "ScaledToZero", "status": "True", "reason": "ScaledToZero"}]
            return Reply(200, {"kind": "HorizontalPodAutoscaler", "status": {"conditions": conditions}})
        return Reply(404, status_body(404, "NotFound", "not found"))

    kube.add_route("GET", r"/apis/apps/v1/namespaces/default/deployments/([a-z]+)/scale", scale)
    kube.add_route("GET", r"/api/v1/namespaces/default/pods", pods)
    kube.add_route("GET", r"/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/([a-z]+)", hpa)
    metrics_standin.values["s0-jobs"] = ["3"]
    metrics_standin.values["queue"] = ["30"]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", metrics_standin)
    (tmp_path / "hpa.yaml").write_text(yaml.safe_dump_all([WORKER, WEB]))
    code, results = explain_json(capsys, "-f", str(tmp_path / "hpa.yaml"), "--kubeconfig", str(kubeconfig))
    assert code == 0
    worker, web = results
    # The live HPA says it scaled the worker to zero, so it wakes: ceil(3/1) = 3.
    assert (worker["currentReplicas"], worker["desiredReplicas"]) == (0, 3)
    # web: 2 replicas, 1 ready; Value 30/10 = 3 -> ceil(3 * 1) = 3.
    assert (web["currentReplicas"], web["metrics"][0]["proposal"], web["desiredReplicas"]) == (2, 3, 3)
    assert selectors == ["app=worker", "app=web"]  # listed with each scale's status.selector
    assert {call[1] for call in metrics_standin.calls} == {"s0-jobs", "queue"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "s0-jobs=1", "--set", "queue=1"], "give --replicas N, or --kubeconfig"),
        (["--replicas", "1", "--set", "queue=1"], "no value for External S0-Jobs{queue=jobs}"),
        (["--replicas", "1", "--set", "s0-jobs"], "use METRIC=VALUE"),
        (["--replicas", "1", "--set", "s0-jobs=1K"], "unknown suffix"),
    ],
)
def test_usage_errors(args: list[str], message: str, manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(manifests), *args]) == 2
    assert message in capsys.readouterr().err


def test_reads_stdin_and_several_files(
    manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-f - reads stdin; -f repeats; answers come in file order."""
    other = tmp_path / "other.json"
    other.write_text(json.dumps(hpa_document(name="other")))
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(hpa_document(name="piped"))))
    code, results = explain_json(
        capsys,
        "-f",
        "-",
        "-f",
        str(manifests),
        "-f",
        str(other),
        "--set",
        "queue=10",
        "--set",
        "s0-jobs=1",
        "--replicas",
        "1",
    )
    assert code == 0
    assert [r["hpa"] for r in results] == ["default/piped", "default/worker", "default/web", "default/other"]
