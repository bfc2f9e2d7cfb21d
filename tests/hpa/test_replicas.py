"""Per-metric proposals (docs/protocols.md#hpa-replica-math) and tolerance (docs/protocols.md#hpa-tolerance),
table-driven; each row names the fact it checks."""

from __future__ import annotations

import math

import pytest

from adapter.hpa.replicas import MAX_INT64, Pods, ReplicaCountError, Tolerances, propose, sum_usage
from adapter.hpa.spec import MetricTarget, TargetType
from adapter.k8s_wire.quantity import quantity_milli

DEFAULT = Tolerances(0.1, 0.1)


def target(kind: str, text: str) -> MetricTarget:
    return MetricTarget(TargetType(kind), quantity_milli(text), text)


@pytest.mark.parametrize(
    ("kind", "target_text", "usage", "spec_replicas", "status_replicas", "pods", "expected", "fact"),
    [
        ("Value", "100", "105", 3, 3, Pods(3, 3), 3, "hpa-replica-math: Value within tolerance keeps currentReplicas"),
        ("Value", "100", "250", 3, 3, Pods(3, 3), 8, "hpa-replica-math: Value -> ceil(ratio * ready) = ceil(2.5*3)"),
        ("Value", "100", "250", 3, 3, Pods(3, 2), 5, "hpa-replica-math: Value counts Running+Ready pods: ceil(2.5*2)"),
        ("Value", "100", "105", 0, 0, Pods(0, 0), 2, "hpa-tolerance: no tolerance for Value from zero: ceil(1.05) = 2"),
        ("Value", "100", "0", 0, 0, Pods(0, 0), 0, "hpa-scale-to-zero: Value from zero with usage 0 -> 0"),
        ("Value", "100", "500", 1, 1, Pods(1, 0), 0, "hpa-replica-math trap: Value + not-yet-ready pod -> proposal 0"),
        ("Value", "10", "0", 4, 4, Pods(4, 4), 0, "hpa-scale-to-zero: metric drops to 0 -> ceil(0*ready) = 0"),
        ("AverageValue", "5", "23", 2, 2, Pods(2, 2), 5, "hpa-replica-math: AverageValue -> ceil(23/5) = ceil(4.6)"),
        (
            "AverageValue",
            "5",
            "21",
            4,
            4,
            Pods(4, 4),
            4,
            "hpa-replica-math: AverageValue within tolerance keeps statusReplicas",
        ),
        ("AverageValue", "5", "21", 9, 4, Pods(4, 4), 4, "hpa-replica-math: AverageValue reads status.replicas"),
        (
            "AverageValue",
            "5",
            "1",
            0,
            0,
            Pods(0, 0),
            1,
            "hpa-replica-math: AverageValue from 0 with usage>0 -> ceil(usage/target)",
        ),
        ("AverageValue", "5", "0", 0, 0, Pods(0, 0), 0, "hpa-replica-math: AverageValue, 0 replicas, usage 0 -> 0"),
        ("AverageValue", "5", "50", 3, 3, Pods(3, 0), 10, "hpa-replica-math: AverageValue never looks at readiness"),
        ("AverageValue", "500m", "1n", 1, 1, Pods(1, 1), 1, "quantity-precision: 1n reads as 1m, ceil(1/500) = 1"),
        ("AverageValue", "1", "1e10", 1, 1, Pods(1, 1), 2**31 - 1, "hpa-replica-math: proposals capped at MaxInt32"),
    ],
)
def test_proposal(
    kind: str,
    target_text: str,
    usage: str,
    spec_replicas: int,
    status_replicas: int,
    pods: Pods,
    expected: int,
    fact: str,
) -> None:
    got = propose(target(kind, target_text), quantity_milli(usage), spec_replicas, status_replicas, pods, DEFAULT)
    assert got.replicas == expected, fact


def test_value_with_no_pods_listed_is_an_error() -> None:
    """docs/protocols.md#hpa-replica-math: readyPods 'error if 0 pods listed' (outside tolerance, current != 0)."""
    with pytest.raises(ReplicaCountError, match="no pods returned by selector"):
        propose(target("Value", "10"), 50_000, 2, 2, Pods(0, 0), DEFAULT)


def test_ratio_and_current_status() -> None:
    """docs/protocols.md#hpa-replica-math: status current.value = usage; current.averageValue = usage /
    statusReplicas."""
    value = propose(target("Value", "10"), 25_000, 2, 2, Pods(2, 2), DEFAULT)
    assert (value.ratio, value.current) == (2.5, "25")
    average = propose(target("AverageValue", "10"), 25_000, 2, 2, Pods(2, 2), DEFAULT)
    assert (average.ratio, average.current) == (1.25, "12500m")
    from_zero = propose(target("AverageValue", "10"), 25_000, 0, 0, Pods(0, 0), DEFAULT)
    assert math.isinf(from_zero.ratio)
    assert from_zero.current is None


# docs/protocols.md#hpa-tolerance API doc example: a 100Mi target with 5% down / 1% up tolerance scales below 95Mi or
# above 101Mi.
@pytest.mark.parametrize(
    ("usage", "within"),
    [("94Mi", False), ("95Mi", True), ("100Mi", True), ("101Mi", True), ("101.5Mi", False)],
)
def test_per_direction_tolerance_api_doc_example(usage: str, within: bool) -> None:
    tolerances = Tolerances(scale_down=0.05, scale_up=0.01)
    got = propose(target("Value", "100Mi"), quantity_milli(usage), 100, 100, Pods(100, 100), tolerances)
    assert got.within_tolerance is within
    assert (got.replicas == 100) is within


@pytest.mark.parametrize(
    ("ratio", "within", "fact"),
    [
        (0.9, True, "hpa-tolerance: the band is inclusive at 1 - 0.1"),
        (1.1, True, "hpa-tolerance: the band is inclusive at 1 + 0.1"),
        (0.8999, False, "hpa-tolerance: below the band"),
        (1.1001, False, "hpa-tolerance: above the band"),
        (math.nan, False, "hpa-replica-math: a NaN ratio is never within tolerance"),
        (math.inf, False, "hpa-replica-math: +Inf is never within tolerance"),
    ],
)
def test_default_tolerance(ratio: float, within: bool, fact: str) -> None:
    assert DEFAULT.is_within(ratio) is within, fact


def test_usage_sum_caps_at_max_int64() -> None:
    """docs/protocols.md#hpa-replica-math: usage = sum of MilliValue; positive overflow is capped at MaxInt64."""
    assert sum_usage([1500, 500]) == 2000
    assert sum_usage([MAX_INT64, 1]) == MAX_INT64
