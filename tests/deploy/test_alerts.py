"""Zeroscale's alerting rules (deploy/helm/zeroscale/files/prometheus-rules.yaml): valid for promtool, each alert
proven by `promtool test rules` (tests/deploy/prometheus-rules.test.yaml) to fire on what should page someone and
not on what should not; shipped by the chart as a PrometheusRule, off by default, holding that file as it is, and
by kustomize's monitoring overlay as a generated copy."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_manifests import validate
from tests.fixtures.manifests import CHART, RELEASE_NAMESPACE, Objects, helm_render

RULES = CHART / "files" / "prometheus-rules.yaml"
CASES = Path(__file__).with_name("prometheus-rules.test.yaml")
TEMPLATE = "templates/prometheusrule.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, cwd=CASES.parent)


def alerts() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}


def test_the_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_the_alerts_fire_as_their_cases_say() -> None:
    done = promtool("test", "rules", CASES.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_case_that_no_longer_holds_fails(tmp_path: Path) -> None:
    """The cases can fail: with a threshold raised beyond the inputs, the firing ones do."""
    raised = RULES.read_text().replace("< 14 * 86400", "< 0")
    (tmp_path / "rules.yaml").write_text(raised)
    cases = yaml.safe_load(CASES.read_text())
    cases["rule_files"] = [str(tmp_path / "rules.yaml")]
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(cases))
    done = promtool("test", "rules", str(tmp_path / "cases.yaml"))
    assert done.returncode != 0
    assert "alertname: ZeroscaleCertificateExpiresSoon" in done.stdout + done.stderr


def _covered(series: str, expected: list[dict[str, Any]]) -> bool:
    """Whether an input series is one an expected alert stands for (its labels carry all of the alert's)."""
    labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
    return any(
        all(labels.get(key) == value for key, value in alert["exp_labels"].items() if key != "severity")
        for alert in expected
    )


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_has_a_case_that_fires_and_one_that_does_not(name: str) -> None:
    """Firing: an expected alert. Not firing: an input series of the alert's metrics no expected alert stands for
    (promtool compares the alerts whole, so that series was proven not to fire)."""
    metrics = set(re.findall(r"zeroscale_\w+", alerts()[name]["expr"]))
    fires = quiet = False
    for case in yaml.safe_load(CASES.read_text())["tests"]:
        expected = [a for test in case["alert_rule_test"] if test["alertname"] == name for a in test["exp_alerts"]]
        if not any(test["alertname"] == name for test in case["alert_rule_test"]):
            continue
        fires = fires or bool(expected)
        inputs = [s["series"] for s in case["input_series"] if s["series"].split("{")[0] in metrics]
        quiet = quiet or any(not _covered(series, expected) for series in inputs)
    assert fires, f"{name}: no case where it fires"
    assert quiet, f"{name}: no input where it must not fire"


def test_every_alert_says_what_to_check() -> None:
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description"} <= rule["annotations"].keys(), name
        assert rule["for"], f"{name}: a single bad scrape must not page"


@pytest.fixture(scope="module")
def chart_rule(helm: Path) -> list[dict[str, Any]]:
    options = "prometheusRule.enabled=true,prometheusRule.namespace=monitoring,prometheusRule.labels.release=prom"
    return helm_render(helm, "--set", options, "--show-only", TEMPLATE)


def test_the_chart_has_no_prometheus_rule_by_default(chart_default: list[dict[str, Any]]) -> None:
    assert [obj for obj in chart_default if obj["kind"] == "PrometheusRule"] == []


def test_the_charts_prometheus_rule_holds_the_rules_file(chart_rule: list[dict[str, Any]]) -> None:
    (rule,) = chart_rule
    validate(rule)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "zeroscale"


def test_the_monitoring_overlay_installs_the_same_rules(rendered: dict[str, Objects]) -> None:
    """kustomize's copy (generated by scripts/helm/generate.py, its --check run by tests/deploy/test_helm.py)."""
    (rule,) = [obj for obj in rendered["monitoring"] if obj["kind"] == "PrometheusRule"]
    validate(rule)
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["namespace"] == "zeroscale"


def test_the_prometheus_rule_is_in_the_release_namespace_unless_told(helm: Path) -> None:
    (rule,) = helm_render(helm, "--set", "prometheusRule.enabled=true", "--show-only", TEMPLATE)
    assert rule["metadata"]["namespace"] == RELEASE_NAMESPACE
