"""Reading HPA manifests: defaults, validation and selectors as the API server and client-go treat them."""

from __future__ import annotations

import json

import pytest
import yaml

from adapter.hpa import ManifestError, parse_manifests
from adapter.hpa.fetch import external_metric_path
from adapter.hpa.spec import ExternalMetric, UnsupportedMetric
from tests.hpa.builders import hpa_document

SELECTOR = {
    "matchLabels": {"queue": "jobs"},
    "matchExpressions": [
        {"key": "env", "operator": "In", "values": ["b", "a"]},
        {"key": "legacy", "operator": "DoesNotExist"},
        {"key": "tier", "operator": "Exists"},
    ],
}


def external(name: str = "queue", selector: object = None, target: object = None) -> dict[str, object]:
    metric: dict[str, object] = {"name": name}
    if selector is not None:
        metric["selector"] = selector
    return {
        "type": "External",
        "external": {"metric": metric, "target": target or {"type": "AverageValue", "averageValue": "10"}},
    }


def parse_one(document: dict[str, object]) -> ExternalMetric:
    spec = parse_manifests(yaml.safe_dump(document), "test")[0].spec
    metric = spec.metrics[0]
    assert isinstance(metric, ExternalMetric)
    return metric


def test_selector_serialized_like_client_go() -> None:
    """docs/protocols.md#em-list-call: requirements sorted by key and comma-joined; In values sorted; path name
    lower-cased."""
    metric = parse_one(hpa_document(metrics=[external("S0-Jobs", SELECTOR)]))
    assert metric.selector is not None
    assert metric.selector.query() == "env in (a,b),!legacy,queue=jobs,tier"
    assert external_metric_path("ns", metric) == (
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/ns/s0-jobs"
        "?labelSelector=env+in+%28a%2Cb%29%2C%21legacy%2Cqueue%3Djobs%2Ctier"
    )


@pytest.mark.parametrize("selector", [None, {}], ids=["nil", "empty"])
def test_nil_and_empty_selectors_send_no_parameter(selector: object) -> None:
    """docs/protocols.md#em-list-call: a nil and an empty {} selector both give no labelSelector parameter."""
    metric = parse_one(hpa_document(metrics=[external(selector=selector)]))
    assert "?" not in external_metric_path("ns", metric)


def test_selector_in_error_messages_is_go_formatted() -> None:
    """docs/protocols.md#em-errors: the HPA prints the selector with %+v inside 'unable to get external metric
    ns/name/<selector>'."""
    metric = parse_one(hpa_document(metrics=[external(selector={"matchLabels": {"queue": "jobs"}})]))
    assert metric.label == (
        "external metric queue(&LabelSelector{MatchLabels:map[string]string{queue: jobs,},"
        "MatchExpressions:[]LabelSelectorRequirement{},})"
    )
    assert parse_one(hpa_document()).label == "external metric queue(nil)"


def test_json_lists_and_other_kinds() -> None:
    """kubectl get -o json gives a List; Deployments in the same file are skipped; v2beta2 is read too."""
    beta = hpa_document(name="beta")
    beta["apiVersion"] = "autoscaling/v2beta2"
    listing = {"kind": "List", "apiVersion": "v1", "items": [hpa_document(name="a"), beta]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"}}
    text = json.dumps(listing) + "\n---\n" + json.dumps(deployment)
    assert [m.spec.name for m in parse_manifests(text, "test")] == ["a", "beta"]


def test_defaults() -> None:
    """v2 defaults: minReplicas 1; no metrics -> CPU 80% (a Resource metric, not computed here); namespace."""
    document = hpa_document(min_replicas=None)
    del document["spec"]["metrics"]
    manifest = parse_manifests(yaml.safe_dump(document), "test", default_namespace="jobs")[0]
    assert (manifest.spec.min_replicas, manifest.spec.namespace) == (1, "jobs")
    assert manifest.spec.metrics == (UnsupportedMetric("Resource", "cpu"),)


def test_tolerance_and_status() -> None:
    """docs/protocols.md#hpa-tolerance: tolerance is a Quantity ('50m' = 0.05); a manifest's status gives ScaledToZero
    (docs/protocols.md#hpa-scale-to-zero)."""
    document = hpa_document(
        min_replicas=0, behavior={"scaleDown": {"tolerance": "50m"}, "scaleUp": {"tolerance": 0.01}}
    )
    document["status"] = {"conditions": [{"type": "ScaledToZero", "status": "True", "reason": "ScaledToZero"}]}
    manifest = parse_manifests(yaml.safe_dump(document), "test")[0]
    assert manifest.spec.behavior is not None
    assert (manifest.spec.behavior.scale_down.tolerance, manifest.spec.behavior.scale_up.tolerance) == (0.05, 0.01)
    assert manifest.scaled_to_zero is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"minReplicas": 0, "metrics": [{"type": "Resource", "resource": {"name": "cpu"}}]},
            "must specify at least one Object or External metric to support scaling to zero replicas",
        ),
        ({"minReplicas": 5, "maxReplicas": 3}, "spec.minReplicas"),
        ({"metrics": [external(target={"type": "Value", "value": "0"})]}, "must be positive"),
        ({"metrics": [external(target={"type": "Utilization", "averageUtilization": 50})]}, "Value or AverageValue"),
        ({"metrics": [external(target={"type": "Value", "value": "1K"})]}, "unknown suffix"),
        ({"behavior": {"scaleUp": {"policies": []}}}, "must specify at least one Policy"),
        ({"behavior": {"scaleUp": {"selectPolicy": "Fastest"}}}, "selectPolicy"),
        ({"behavior": {"scaleDown": {"tolerance": "-1"}}}, "greater than or equal to 0"),
        ({"behavior": {"scaleDown": {"stabilizationWindowSeconds": 3601}}}, "between 0 and 3600"),
        (
            {"metrics": [external(selector={"matchExpressions": [{"key": "a", "operator": "In"}]})]},
            "must be specified when `operator` is 'In' or 'NotIn'",
        ),
    ],
)
def test_validation(change: dict[str, object], message: str) -> None:
    document = hpa_document()
    document["spec"].update(change)
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_manifests(yaml.safe_dump(document), "test")


def test_refuses_other_api_versions_and_empty_files() -> None:
    document = hpa_document()
    document["apiVersion"] = "autoscaling/v1"
    with pytest.raises(ManifestError, match="autoscaling/v2"):
        parse_manifests(yaml.safe_dump(document), "test")
    with pytest.raises(ManifestError, match="no HorizontalPodAutoscaler"):
        parse_manifests("kind: Service\n", "test")
