"""What one sync decided and why, step by step (the data `explain` prints and the demo logs)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from adapter.hpa.conditions import Condition
from adapter.hpa.ratelimit import Limited
from adapter.hpa.stabilization import Stabilized
from adapter.k8s_wire.quantity import format_quantity


@dataclass(frozen=True)
class MetricResult:
    """One entry of spec.metrics: its reading, target, ratio and proposal, or why it has none."""

    label: str  # for people: "External jobs{queue=a}"
    name: str
    kind: str  # External, Object or the unsupported type
    target_type: str | None = None
    target: str | None = None  # the Quantity as written
    usage_milli: int | None = None
    current: str | None = None  # status current value / averageValue
    ratio: float | None = None
    tolerance_band: tuple[float, float] | None = None  # None when tolerance was not applied
    within_tolerance: bool | None = None
    proposal: int | None = None
    how: str = ""
    error: str | None = None

    @property
    def value(self) -> str | None:
        """The summed usage as a Quantity (what `kubectl get --raw` would show for one item)."""
        return None if self.usage_milli is None else format_quantity(Decimal(self.usage_milli) / 1000)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    hpa: str  # namespace/name
    current_replicas: int
    desired_replicas: int
    rescale: bool
    metrics: tuple[MetricResult, ...]
    proposal: int | None  # the largest metric proposal, before stabilization; None if not computed
    stabilization: Stabilized | None
    limits: Limited | None
    conditions: tuple[Condition, ...]
    events: tuple[Event, ...]
    why: str

    def explanation(self) -> list[str]:
        """The sync as readable steps, one line each."""
        lines = []
        for metric in self.metrics:
            if metric.error is not None:
                lines.append(f"{metric.label}: {metric.error}")
                continue
            band = ""
            if metric.tolerance_band is not None:
                low, high = metric.tolerance_band
                inside = "inside" if metric.within_tolerance else "outside"
                band = f", {inside} tolerance band [{low:.4g}, {high:.4g}]"
            lines.append(
                f"{metric.label}: value {metric.value} vs {metric.target_type} target {metric.target}: "
                f"ratio {_ratio(metric.ratio)}{band} -> {metric.proposal} ({metric.how})"
            )
        if self.proposal is not None:
            lines.append(f"raw recommendation (largest proposal): {self.proposal}")
        if self.stabilization is not None:
            lines.append(stabilization_line(self.stabilization))
        if self.limits is not None:
            lines.extend(limit_lines(self.limits))
        lines.append(f"final: {self.desired_replicas} (current {self.current_replicas}): {self.why}")
        return lines


def _ratio(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.4g}"


def stabilization_line(step: Stabilized) -> str:
    if step.up_window is None:
        windows = f"legacy path: highest recommendation of the last {step.down_window}s is {step.down_ceiling}"
    else:
        windows = (
            f"lowest of the last {step.up_window}s (scale-up window) is {step.up_floor}, "
            f"highest of the last {step.down_window}s (scale-down window) is {step.down_ceiling}"
        )
    effect = f"kept {step.result}" if not step.changed else f"{step.recommendation} -> {step.result} ({step.reason})"
    return f"stabilization: {windows}: {effect}"


def limit_lines(step: Limited) -> list[str]:
    lines = []
    for limit in step.policies:
        lines.append(f"policy {limit.policy}: {limit.period_start} at period start -> allows {limit.allowed}")
    if step.select_policy is not None:
        lines.append(f"selectPolicy {step.select_policy}: rate limit {step.rate_limit}")
    if step.legacy:
        lines.append(f"legacy scale-up limit max(2*current, 4) = {step.rate_limit}")
    effect = f"{step.desired} -> {step.result}" if step.limited else f"kept {step.result}"
    lines.append(f"limits and min/max: {effect} ({step.reason}: {step.message})")
    return lines
