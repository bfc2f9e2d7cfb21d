"""HorizontalPodAutoscaler manifests (autoscaling/v2 and v2beta2, YAML or JSON) -> HPASpec.

Applies the API server's defaults (minReplicas 1, behavior rules per direction) and the
validation rules that change what the controller may be asked to do (docs/protocols.md#hpa-behavior,
docs/protocols.md#hpa-scale-to-zero), so a manifest the API server would refuse is refused here with the same reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from adapter.hpa.spec import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    Behavior,
    ExternalMetric,
    HPASpec,
    LabelSelector,
    Metric,
    MetricTarget,
    ObjectMetric,
    ObjectReference,
    PolicyType,
    ScalingPolicy,
    ScalingRules,
    SelectorRequirement,
    SelectPolicy,
    TargetType,
    UnsupportedMetric,
)
from adapter.k8s_wire.quantity import QuantityError, parse_quantity, quantity_milli

API_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")


class ManifestError(ValueError):
    """The document is not an HPA this module can read; the message says where and why."""


@dataclass(frozen=True)
class HPAManifest:
    spec: HPASpec
    # status.conditions[type=ScaledToZero] when the manifest carries a status (kubectl get -o yaml).
    scaled_to_zero: bool | None
    source: str


def load_manifests(path: Path, default_namespace: str = "default") -> list[HPAManifest]:
    """Every HPA in a (multi-document) YAML or JSON file; `kind: List` documents are opened."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ManifestError(f"{path}: {err.strerror}") from None
    return parse_manifests(text, str(path), default_namespace)


def parse_manifests(text: str, source: str, default_namespace: str = "default") -> list[HPAManifest]:
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        raise ManifestError(f"{source}: not YAML or JSON: {err}") from None
    found: list[HPAManifest] = []
    for index, document in enumerate(_flatten(documents)):
        where = f"{source}[{index}]"
        if not isinstance(document, Mapping):
            raise ManifestError(f"{where}: a manifest must be a mapping")
        if document.get("kind") != "HorizontalPodAutoscaler":
            continue  # other objects in the same file (Deployments, Services) are not ours
        found.append(_parse_hpa(document, where, default_namespace))
    if not found:
        raise ManifestError(f"{source}: no HorizontalPodAutoscaler in it")
    return found


def _flatten(documents: list[Any]) -> Iterator[Any]:
    for document in documents:
        if isinstance(document, Mapping) and document.get("kind") == "List":
            yield from document.get("items") or []
        else:
            yield document


class _Reader:
    """Typed access to nested fields that names the path of anything missing or wrong."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, message: str) -> ManifestError:
        return ManifestError(f"{self.where}: {path}: {message}")

    def mapping(self, value: object, path: str, required: bool = True) -> Mapping[str, Any]:
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, "Required value" if value is None else "must be a mapping")
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, "Required value")
        return value

    def integer(self, value: object, path: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, "must be an integer")
        if not low <= value <= high:
            raise self.fail(path, f"Invalid value: {value}: must be between {low} and {high}, inclusive")
        return value

    def quantity(self, value: object, path: str) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(path, "Required value")
        try:
            parse_quantity(value)
        except QuantityError as err:
            raise self.fail(path, str(err)) from None
        return str(value)


def _parse_hpa(document: Mapping[str, Any], where: str, default_namespace: str) -> HPAManifest:
    read = _Reader(where)
    if document.get("apiVersion") not in API_VERSIONS:
        raise read.fail("apiVersion", f"{document.get('apiVersion')!r}: use one of {', '.join(API_VERSIONS)}")
    metadata = read.mapping(document.get("metadata"), "metadata")
    name = read.string(metadata.get("name"), "metadata.name")
    namespace = metadata.get("namespace") or default_namespace
    spec = read.mapping(document.get("spec"), "spec")
    ref = read.mapping(spec.get("scaleTargetRef"), "spec.scaleTargetRef")
    target = ObjectReference(
        read.string(ref.get("kind"), "spec.scaleTargetRef.kind"),
        read.string(ref.get("name"), "spec.scaleTargetRef.name"),
        str(ref.get("apiVersion") or ""),
    )
    max_replicas = read.integer(spec.get("maxReplicas"), "spec.maxReplicas", 1, 2**31 - 1)
    raw_min = spec.get("minReplicas")
    min_replicas = 1 if raw_min is None else read.integer(raw_min, "spec.minReplicas", 0, max_replicas)
    raw_metrics = spec.get("metrics")
    if raw_metrics is None:
        # The API server's default: CPU at 80% utilization.
        metrics: tuple[Metric, ...] = (UnsupportedMetric("Resource", "cpu"),)
    elif isinstance(raw_metrics, list):
        metrics = tuple(_metric(read, entry, f"spec.metrics[{i}]") for i, entry in enumerate(raw_metrics))
    else:
        raise read.fail("spec.metrics", "must be a list")
    if min_replicas == 0 and not any(isinstance(m, ExternalMetric | ObjectMetric) for m in metrics):
        raise read.fail(
            "spec.metrics",
            "Forbidden: must specify at least one Object or External metric to support scaling to zero replicas",
        )
    behavior = None if spec.get("behavior") is None else _behavior(read, spec["behavior"])
    hpa = HPASpec(name, namespace, target, min_replicas, max_replicas, metrics, behavior)
    return HPAManifest(hpa, scaled_to_zero_of(document.get("status")), where)


def _metric(read: _Reader, entry: object, path: str) -> Metric:
    entry = read.mapping(entry, path)
    kind = entry.get("type")
    if kind == "External":
        body = read.mapping(entry.get("external"), f"{path}.external")
        metric = read.mapping(body.get("metric"), f"{path}.external.metric")
        return ExternalMetric(
            read.string(metric.get("name"), f"{path}.external.metric.name"),
            _selector(read, metric.get("selector"), f"{path}.external.metric.selector"),
            _target(read, body.get("target"), f"{path}.external.target"),
        )
    if kind == "Object":
        body = read.mapping(entry.get("object"), f"{path}.object")
        metric = read.mapping(body.get("metric"), f"{path}.object.metric")
        described = read.mapping(body.get("describedObject"), f"{path}.object.describedObject")
        return ObjectMetric(
            read.string(metric.get("name"), f"{path}.object.metric.name"),
            ObjectReference(
                read.string(described.get("kind"), f"{path}.object.describedObject.kind"),
                read.string(described.get("name"), f"{path}.object.describedObject.name"),
                str(described.get("apiVersion") or ""),
            ),
            _selector(read, metric.get("selector"), f"{path}.object.metric.selector"),
            _target(read, body.get("target"), f"{path}.object.target"),
        )
    if kind in ("Resource", "ContainerResource", "Pods"):
        body = read.mapping(entry.get(kind[0].lower() + kind[1:]), path, required=False)
        name = body.get("name") or read.mapping(body.get("metric"), path, required=False).get("name") or "?"
        return UnsupportedMetric(kind, str(name))
    raise read.fail(f"{path}.type", f"Unsupported value: {kind!r}: use External or Object")


def _target(read: _Reader, value: object, path: str) -> MetricTarget:
    target = read.mapping(value, path)
    kind = target.get("type")
    if kind == TargetType.VALUE:
        field = "value"
    elif kind == TargetType.AVERAGE_VALUE:
        field = "averageValue"
    else:
        raise read.fail(
            f"{path}.type", f"Unsupported value: {kind!r}: External and Object targets are Value or AverageValue"
        )
    text = read.quantity(target.get(field), f"{path}.{field}")
    milli = quantity_milli(text)
    if parse_quantity(text) <= 0:
        raise read.fail(f"{path}.{field}", "must be positive")
    return MetricTarget(TargetType(kind), milli, text)


def _selector(read: _Reader, value: object, path: str) -> LabelSelector | None:
    if value is None:
        return None
    selector = read.mapping(value, path)
    labels = read.mapping(selector.get("matchLabels"), f"{path}.matchLabels", required=False)
    expressions: list[SelectorRequirement] = []
    for i, raw in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        expression = read.mapping(raw, where)
        operator = expression.get("operator")
        values = tuple(str(v) for v in expression.get("values") or [])
        if operator in ("In", "NotIn") and not values:
            raise read.fail(f"{where}.values", "Required value: must be specified when `operator` is 'In' or 'NotIn'")
        if operator in ("Exists", "DoesNotExist") and values:
            raise read.fail(
                f"{where}.values", "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            )
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise read.fail(f"{where}.operator", f"Unsupported value: {operator!r}")
        expressions.append(SelectorRequirement(read.string(expression.get("key"), f"{where}.key"), operator, values))
    return LabelSelector(tuple((str(k), str(v)) for k, v in labels.items()), tuple(expressions))


def _behavior(read: _Reader, value: object) -> Behavior:
    behavior = read.mapping(value, "spec.behavior")
    return Behavior(
        _rules(read, behavior.get("scaleUp"), "spec.behavior.scaleUp", DEFAULT_SCALE_UP),
        _rules(read, behavior.get("scaleDown"), "spec.behavior.scaleDown", DEFAULT_SCALE_DOWN),
    )


def _rules(read: _Reader, value: object, path: str, default: ScalingRules) -> ScalingRules:
    """copyHPAScalingRules: every field given replaces the default's, the rest stay."""
    if value is None:
        return default
    rules = read.mapping(value, path)
    window = default.stabilization_window_seconds
    if rules.get("stabilizationWindowSeconds") is not None:
        window = read.integer(rules["stabilizationWindowSeconds"], f"{path}.stabilizationWindowSeconds", 0, 3600)
    select = default.select_policy
    if rules.get("selectPolicy") is not None:
        if rules["selectPolicy"] not in tuple(SelectPolicy):
            raise read.fail(
                f"{path}.selectPolicy", f"Unsupported value: {rules['selectPolicy']!r}: Max, Min or Disabled"
            )
        select = SelectPolicy(rules["selectPolicy"])
    policies = default.policies
    if rules.get("policies") is not None:
        if not isinstance(rules["policies"], list) or not rules["policies"]:
            raise read.fail(f"{path}.policies", "Required value: must specify at least one Policy")
        policies = tuple(_policy(read, p, f"{path}.policies[{i}]") for i, p in enumerate(rules["policies"]))
    tolerance = default.tolerance
    if rules.get("tolerance") is not None:
        amount = parse_quantity(read.quantity(rules["tolerance"], f"{path}.tolerance"))
        if amount < 0:
            raise read.fail(f"{path}.tolerance", "must be greater than or equal to 0")
        tolerance = float(amount)  # AsApproximateFloat64
    return ScalingRules(window, select, policies, tolerance)


def _policy(read: _Reader, value: object, path: str) -> ScalingPolicy:
    policy = read.mapping(value, path)
    if policy.get("type") not in tuple(PolicyType):
        raise read.fail(f"{path}.type", f"Unsupported value: {policy.get('type')!r}: Pods or Percent")
    return ScalingPolicy(
        PolicyType(policy["type"]),
        read.integer(policy.get("value"), f"{path}.value", 1, 2**31 - 1),
        read.integer(policy.get("periodSeconds"), f"{path}.periodSeconds", 1, 1800),
    )


def scaled_to_zero_of(status: object) -> bool | None:
    """An HPA status's ScaledToZero condition; None when absent."""
    if not isinstance(status, Mapping):
        return None
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "ScaledToZero":
            return bool(condition.get("status") == "True")
    return None
