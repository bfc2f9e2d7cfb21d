"""`zeroscale explain` against the real adapter (`zeroscale serve --config deploy/local/zeroscale.yaml`).

The local example serves the static metric demo-queue-depth: queue=orders 1500, queue=emails 0.5.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from adapter.cli import main
from tests.fixtures.replicas import Process, spawn
from tests.hpa.builders import hpa_document

LOCAL_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "local" / "zeroscale.yaml"


def _start(directory: Path) -> Process:
    """The local example config, its listeners on port 0; returns once it has bound them (ready file)."""
    config = yaml.safe_load(LOCAL_CONFIG.read_text())
    config["server"].update(port=0, metrics_port=0)
    path = directory / "zeroscale.yaml"
    path.write_text(yaml.safe_dump(config))
    adapter = spawn("adapter", "serve", directory, "--config", str(path))
    adapter.wait_ready()
    return adapter


@pytest.fixture(scope="module")
def adapter_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`zeroscale serve` run as a subprocess, like a user would."""
    adapter = _start(tmp_path_factory.mktemp("adapter"))
    try:
        yield f"https://127.0.0.1:{adapter.ports['https']}"
    finally:
        adapter.stop()


def external(name: str, selector: Mapping[str, object], kind: str, quantity: str) -> dict[str, object]:
    field = "value" if kind == "Value" else "averageValue"
    target = {"type": kind, field: quantity}
    return {"type": "External", "external": {"metric": {"name": name, "selector": selector}, "target": target}}


def test_explain_reads_the_running_adapter(
    adapter_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Known answers at 2 replicas, 2 ready (docs/protocols.md#hpa-replica-math):

    - orders, AverageValue 500: ceil(1500 / 500) = 3 (the name is sent lower-cased, docs/protocols.md#em-list-call);
    - orders+emails (1500.5), Value 1000: ratio 1.5005 -> ceil(1.5005 * 2) = 4;
    - an unknown metric: 404 Status -> FailedGetExternalMetric (docs/protocols.md#em-errors), no scaling.
    """
    orders = hpa_document(
        name="orders",
        metrics=[external("Demo-Queue-Depth", {"matchLabels": {"queue": "orders"}}, "AverageValue", "500")],
        behavior={},
    )
    both = {"matchExpressions": [{"key": "queue", "operator": "In", "values": ["orders", "emails"]}]}
    all_queues = hpa_document(name="all", metrics=[external("demo-queue-depth", both, "Value", "1000")], behavior={})
    unknown = hpa_document(name="unknown", metrics=[external("no-such-metric", {}, "Value", "1")], behavior={})
    manifests = tmp_path / "hpa.yaml"
    manifests.write_text(yaml.safe_dump_all([orders, all_queues, unknown]))
    args = [
        "explain",
        "-f",
        str(manifests),
        "--replicas",
        "2",
        "--adapter-url",
        adapter_url,
        "--insecure-skip-tls-verify",
    ]
    assert main([*args, "-o", "json"]) == 0
    first, second, third = json.loads(capsys.readouterr().out)
    assert (first["metrics"][0]["value"], first["recommendation"], first["desiredReplicas"]) == ("1500", 3, 3)
    assert (second["metrics"][0]["value"], second["metrics"][0]["ratio"]) == ("1500500m", 1.5005)
    assert (second["recommendation"], second["desiredReplicas"]) == (4, 4)
    active = next(c for c in third["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetExternalMetric")
    assert active["message"].endswith(
        "unable to fetch metrics from external metrics API: "
        "the server could not find the metric no-such-metric for namespaces"
    )
    assert third["desiredReplicas"] == 2
