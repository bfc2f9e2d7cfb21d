"""Per-metric replica proposals for External and Object metrics (replica_calculator.go,
docs/protocols.md#hpa-replica-math, docs/protocols.md#hpa-tolerance).

Everything is in milli-units, as the HPA computes: ratios are float64 like Go's, so the
ceilings land on the same integers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from adapter.hpa.spec import MAX_INT32, MetricTarget, TargetType
from adapter.k8s_wire.quantity import format_quantity

MAX_INT64 = 2**63 - 1


@dataclass(frozen=True)
class Tolerances:
    """KEP-4951: no change while (1 - scaleDown) <= ratio <= (1 + scaleUp)."""

    scale_down: float
    scale_up: float

    @property
    def band(self) -> tuple[float, float]:
        return (1.0 - self.scale_down, 1.0 + self.scale_up)

    def is_within(self, ratio: float) -> bool:
        low, high = self.band
        return low <= ratio <= high  # False for NaN, as in Go


@dataclass(frozen=True)
class Pods:
    """What the HPA's pod lister sees under the scale selector."""

    listed: int
    ready: int  # phase Running and condition Ready


@dataclass(frozen=True)
class Proposal:
    """One metric's replica count, and how it was reached (for the explanation)."""

    replicas: int
    usage_milli: int
    ratio: float
    within_tolerance: bool | None  # None: tolerance not applied (Value target from zero)
    how: str
    current: str | None  # status current value / averageValue as a Quantity


class ReplicaCountError(Exception):
    """The proposal cannot be computed (e.g. no pods listed under the selector)."""


def sum_usage(values_milli: list[int]) -> int:
    """The HPA sums every item's MilliValue; positive overflow is capped at MaxInt64."""
    return min(sum(values_milli), MAX_INT64)


def _ceil_replicas(value: float) -> int:
    if math.isnan(value):
        return 0
    if math.isinf(value):
        return MAX_INT32 if value > 0 else -MAX_INT32 - 1
    return max(min(math.ceil(value), MAX_INT32), -MAX_INT32 - 1)


def _divide(numerator: float, denominator: float) -> float:
    """float64 division as Go does it: x/0 is +-Inf, 0/0 is NaN."""
    if denominator == 0:
        return math.nan if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / denominator


def _quantity_milli(milli: int) -> str:
    return format_quantity(Decimal(milli) / 1000)


def propose(
    target: MetricTarget, usage_milli: int, spec_replicas: int, status_replicas: int, pods: Pods, tolerances: Tolerances
) -> Proposal:
    """Value: Get{External,Object}MetricReplicas; AverageValue: Get{External,Object}PerPodMetricReplicas."""
    if target.type is TargetType.VALUE:
        return _value(target, usage_milli, spec_replicas, pods, tolerances)
    return _average_value(target, usage_milli, status_replicas, tolerances)


def _value(target: MetricTarget, usage: int, current: int, pods: Pods, tolerances: Tolerances) -> Proposal:
    ratio = _divide(usage, target.milli)
    current_text = _quantity_milli(usage)
    if current == 0:
        # Scaling from zero: no tolerance and no pod count (getUsageRatioReplicaCount).
        return Proposal(_ceil_replicas(ratio), usage, ratio, None, f"from zero: ceil(ratio {ratio:.4g})", current_text)
    if tolerances.is_within(ratio):
        return Proposal(current, usage, ratio, True, "within tolerance: keep the current count", current_text)
    if pods.listed == 0:
        raise ReplicaCountError(
            "unable to calculate ready pods: no pods returned by selector while calculating replica count"
        )
    replicas = _ceil_replicas(ratio * pods.ready)
    how = f"ceil(ratio {ratio:.4g} x {pods.ready} ready pod(s))"
    if pods.ready < current:
        how += f": {current - pods.ready} pod(s) not ready count as none"
    return Proposal(replicas, usage, ratio, False, how, current_text)


def _average_value(target: MetricTarget, usage: int, status_replicas: int, tolerances: Tolerances) -> Proposal:
    ratio = _divide(usage, float(target.milli) * status_replicas)
    per_pod = None if status_replicas == 0 else _quantity_milli(math.ceil(usage / status_replicas))
    if tolerances.is_within(ratio):
        how = f"within tolerance: keep status.replicas {status_replicas}"
        return Proposal(status_replicas, usage, ratio, True, how, per_pod)
    replicas = _ceil_replicas(_divide(usage, target.milli))
    how = f"ceil(usage / target) = ceil({usage}m / {target.milli}m)"
    return Proposal(replicas, usage, ratio, False, how, per_pod)
