"""Builders for HPA specs and controllers used across the hpa tests."""

from __future__ import annotations

from typing import Any

import yaml

from adapter.hpa import Decision, HorizontalController, HPASpec, parse_manifests
from adapter.k8s_wire.quantity import quantity_milli


def hpa_document(
    *,
    target: tuple[str, str] = ("AverageValue", "10"),
    min_replicas: int | None = 1,
    max_replicas: int = 100,
    behavior: dict[str, Any] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    name: str = "web",
) -> dict[str, Any]:
    """An autoscaling/v2 HPA manifest with one External metric `queue` (unless `metrics` is given)."""
    kind, quantity = target
    field = "value" if kind == "Value" else "averageValue"
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "maxReplicas": max_replicas,
        "metrics": metrics
        if metrics is not None
        else [
            {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": kind, field: quantity}}}
        ],
    }
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    if behavior is not None:
        spec["behavior"] = behavior
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name}, "spec": spec}


def make_spec(**options: Any) -> HPASpec:
    """Parsed through the manifest reader, so every test also checks the defaults it relies on."""
    return parse_manifests(yaml.safe_dump(hpa_document(**options)), "test")[0].spec


def make_controller(scaled_to_zero: bool | None = None, **options: Any) -> HorizontalController:
    return HorizontalController(make_spec(**options), scaled_to_zero=scaled_to_zero)


def sync(
    controller: HorizontalController, now: float, current: int, usage: int | str, ready: int | None = None
) -> Decision:
    """One sync with one metric reading; `usage` in units (a Quantity string) or milli-units (int)."""
    milli = usage if isinstance(usage, int) else quantity_milli(usage)
    return controller.sync(now, current, current, current if ready is None else ready, [milli])


def follow(controller: HorizontalController, now: float, current: int, usage: int | str) -> tuple[Decision, int]:
    """Sync and apply the decision, as the demo's driver does; returns the new replica count too."""
    decision = sync(controller, now, current, usage)
    return decision, decision.desired_replicas


def condition(decision: Decision, kind: str) -> tuple[bool, str]:
    for found in decision.conditions:
        if found.type == kind:
            return found.status, found.reason
    raise AssertionError(f"no {kind} condition in {decision.conditions}")
