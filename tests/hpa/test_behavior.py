"""Stabilization windows, Pods/Percent policies, selectPolicy, min/max and the legacy path
(docs/protocols.md#hpa-behavior).

AverageValue target 10 unless said otherwise, so usage 10*n proposes n replicas.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapter.hpa.controller import HorizontalController
from adapter.hpa.spec import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, PolicyType, ScalingPolicy, SelectPolicy
from tests.hpa.builders import condition, make_controller, make_spec, sync


def rules(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def pods(value: int, period: int = 15) -> dict[str, Any]:
    return {"type": "Pods", "value": value, "periodSeconds": period}


def percent(value: int, period: int = 15) -> dict[str, Any]:
    return {"type": "Percent", "value": value, "periodSeconds": period}


def test_default_behavior_tables() -> None:
    """docs/protocols.md#hpa-behavior defaults: up 0s window, Pods 4/15s + Percent 100/15s, Max; down nil window,
    Percent 100/15s, Max."""
    assert DEFAULT_SCALE_UP.stabilization_window_seconds == 0
    assert DEFAULT_SCALE_UP.policies == (
        ScalingPolicy(PolicyType.PODS, 4, 15),
        ScalingPolicy(PolicyType.PERCENT, 100, 15),
    )
    assert DEFAULT_SCALE_UP.select_policy is SelectPolicy.MAX
    assert DEFAULT_SCALE_DOWN.stabilization_window_seconds is None
    assert DEFAULT_SCALE_DOWN.policies == (ScalingPolicy(PolicyType.PERCENT, 100, 15),)
    spec = make_spec(behavior={})
    assert spec.behavior is not None
    assert (spec.behavior.scale_up, spec.behavior.scale_down) == (DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)


def test_defaults_fill_only_missing_fields() -> None:
    """docs/protocols.md#hpa-behavior: the apiserver fills each nil field from the defaults (copyHPAScalingRules)."""
    spec = make_spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 60}, "scaleUp": {"policies": [pods(1)]}})
    assert spec.behavior is not None
    assert spec.behavior.scale_down.stabilization_window_seconds == 60
    assert spec.behavior.scale_down.policies == DEFAULT_SCALE_DOWN.policies
    assert spec.behavior.scale_up.policies == (ScalingPolicy(PolicyType.PODS, 1, 15),)
    assert spec.behavior.scale_up.select_policy is SelectPolicy.MAX
    assert make_spec().behavior is None  # no behavior: the legacy path, nothing filled in


def test_scale_down_window_defaults_to_the_controller_flag() -> None:
    """docs/protocols.md#hpa-behavior: scaleDown window nil ->
    --horizontal-pod-autoscaler-downscale-stabilization (300 s).

    The t=0 sample leaves the window once it is exactly 300 s old (Go counts only samples after the cutoff).
    """
    controller = make_controller(behavior={})
    assert sync(controller, 0, 8, "80").desired_replicas == 8
    held = sync(controller, 15, 8, "20")
    assert held.desired_replicas == 8
    assert condition(held, "AbleToScale") == (True, "ScaleDownStabilized")
    assert held.stabilization is not None
    assert held.stabilization.down_ceiling == 8
    assert sync(controller, 285, 8, "20").desired_replicas == 8
    assert sync(controller, 300, 8, "20").desired_replicas == 2


def test_scale_up_window_applies_the_lowest_recent_recommendation() -> None:
    """docs/protocols.md#hpa-behavior: scale-up uses the minimum within the up-window (ScaleUpStabilized), then the
    policies."""
    controller = make_controller(behavior={"scaleUp": {"stabilizationWindowSeconds": 60}})
    assert sync(controller, 0, 2, "20").desired_replicas == 2
    held = sync(controller, 15, 2, "100")
    assert held.desired_replicas == 2
    assert condition(held, "AbleToScale") == (True, "ScaleUpStabilized")
    assert sync(controller, 45, 2, "100").desired_replicas == 2
    up = sync(controller, 61, 2, "100")
    assert up.desired_replicas == 6  # stabilized 10, then Pods 4 -> 6 beats Percent 100 -> 4
    assert condition(up, "ScalingLimited") == (True, "ScaleUpLimit")


def test_pods_policy_counts_changes_within_its_period() -> None:
    """docs/protocols.md#hpa-behavior: Pods policy allows periodStartReplicas + value; the period start excludes older
    events."""
    controller = make_controller(behavior={"scaleUp": {"policies": [pods(1, 60)]}})
    assert sync(controller, 0, 2, "100").desired_replicas == 3
    limited = sync(controller, 15, 3, "100")
    assert limited.desired_replicas == 3
    assert limited.limits is not None
    assert limited.limits.policies[0].period_start == 2
    assert sync(controller, 61, 3, "100").desired_replicas == 4


@pytest.mark.parametrize(
    ("scale_up", "current", "usage", "expected", "fact"),
    [
        (rules(policies=[percent(50, 60)]), 3, "100", 5, "hpa-behavior: Percent up = ceil(3 * 1.5) = 5"),
        (rules(selectPolicy="Max"), 10, "1000", 20, "hpa-behavior: Max of Pods 14 and Percent 20"),
        (rules(selectPolicy="Min"), 10, "1000", 14, "hpa-behavior: Min of Pods 14 and Percent 20"),
        (rules(selectPolicy="Disabled"), 3, "100", 3, "hpa-behavior: selectPolicy Disabled: no scale-up"),
        (rules(), 1, "100", 5, "hpa-behavior: default up from 1: Pods 4 -> 5 beats Percent 100 -> 2"),
        (rules(), 0, "50", 4, "hpa-scale-to-zero: from 0 the defaults allow up to 4"),
        (rules(policies=[percent(100)]), 0, "50", 0, "hpa-behavior: from 0 a Percent-only scale-up allows 0 (stall)"),
    ],
)
def test_scale_up_policies(scale_up: dict[str, Any], current: int, usage: str, expected: int, fact: str) -> None:
    controller = make_controller(min_replicas=0, scaled_to_zero=True, behavior={"scaleUp": scale_up})
    decision = sync(controller, 0, current, usage)
    assert decision.desired_replicas == expected, fact
    limited = decision.limits
    assert limited is not None
    assert condition(decision, "ScalingLimited") == (True, "ScaleUpLimit"), fact


def test_percent_only_scale_up_from_zero_stalls_for_good() -> None:
    """docs/protocols.md#hpa-behavior trap: 0 x (1 + p) = 0, so every sync stays at 0 while the backlog grows."""
    controller = make_controller(
        min_replicas=0, scaled_to_zero=True, behavior={"scaleUp": {"policies": [percent(900)]}}
    )
    for tick in range(10):
        assert sync(controller, tick * 15, 0, str(100 * (tick + 1))).desired_replicas == 0


@pytest.mark.parametrize(
    ("scale_down", "current", "usage", "expected", "reason", "fact"),
    [
        (rules(policies=[pods(1, 60)]), 5, "0", 4, "ScaleDownLimit", "hpa-behavior: Pods down = start - value"),
        (rules(policies=[percent(50)]), 5, "10", 2, "ScaleDownLimit", "hpa-behavior: Percent down truncates 5*0.5"),
        (rules(policies=[pods(1), percent(50)]), 10, "10", 5, "ScaleDownLimit", "Max on scale-down = biggest change"),
        (
            rules(policies=[pods(1), percent(50)], selectPolicy="Min"),
            10,
            "10",
            9,
            "ScaleDownLimit",
            "Min on scale-down = smallest change",
        ),
        (rules(selectPolicy="Disabled"), 5, "0", 5, "ScaleDownLimit", "hpa-behavior: Disabled: no scale-down"),
        (rules(), 5, "10", 1, "DesiredWithinRange", "hpa-behavior: default Percent 100/15s allows all the way down"),
    ],
)
def test_scale_down_policies(
    scale_down: dict[str, Any], current: int, usage: str, expected: int, reason: str, fact: str
) -> None:
    controller = make_controller(
        min_replicas=0, behavior={"scaleDown": {"stabilizationWindowSeconds": 0, **scale_down}}
    )
    decision = sync(controller, 0, current, usage)
    assert decision.desired_replicas == expected, fact
    assert condition(decision, "ScalingLimited")[1] == reason, fact


def test_scale_down_period_remembers_what_was_removed() -> None:
    """docs/protocols.md#hpa-behavior: periodStartReplicas = current - added + removed within the period."""
    controller = make_controller(
        min_replicas=0, behavior={"scaleDown": {"stabilizationWindowSeconds": 0, "policies": [pods(1, 60)]}}
    )
    assert sync(controller, 0, 5, "0").desired_replicas == 4
    assert sync(controller, 15, 4, "0").desired_replicas == 4
    assert sync(controller, 61, 4, "0").desired_replicas == 3


@pytest.mark.parametrize(
    ("min_replicas", "max_replicas", "current", "usage", "expected", "reason", "fact"),
    [
        (1, 5, 4, "100", 5, "TooManyReplicas", "hpa-behavior: clamped to maxReplicas below the rate limit"),
        (3, 10, 5, "10", 3, "TooFewReplicas", "hpa-behavior: clamped to minReplicas above the rate limit"),
        (1, 10, 4, "60", 6, "DesiredWithinRange", "hpa-behavior: nothing to limit"),
    ],
)
def test_min_max_clamp(
    min_replicas: int, max_replicas: int, current: int, usage: str, expected: int, reason: str, fact: str
) -> None:
    controller = make_controller(
        min_replicas=min_replicas, max_replicas=max_replicas, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}
    )
    decision = sync(controller, 0, current, usage)
    assert decision.desired_replicas == expected, fact
    assert condition(decision, "ScalingLimited") == (reason != "DesiredWithinRange", reason), fact


@pytest.mark.parametrize(
    ("current", "max_replicas", "expected", "reason", "fact"),
    [
        (1, 100, 4, "ScaleUpLimit", "hpa-behavior legacy: max(2*1, 4) = 4"),
        (3, 100, 6, "ScaleUpLimit", "hpa-behavior legacy: max(2*3, 4) = 6"),
        (10, 15, 15, "TooManyReplicas", "hpa-behavior legacy: maxReplicas below the limit 20"),
    ],
)
def test_legacy_scale_up_limit(current: int, max_replicas: int, expected: int, reason: str, fact: str) -> None:
    controller = make_controller(max_replicas=max_replicas)  # no behavior: the legacy path
    decision = sync(controller, 0, current, "1000")
    assert decision.desired_replicas == expected, fact
    assert condition(decision, "ScalingLimited") == (True, reason), fact


def test_legacy_downscale_window_comes_from_the_flag() -> None:
    """docs/protocols.md#hpa-behavior legacy: only the downscale window (from the flag), then no rate limit on the way
    down."""
    controller = make_controller()
    sync(controller, 0, 8, "80")
    assert sync(controller, 15, 8, "20").desired_replicas == 8
    assert sync(controller, 300, 8, "20").desired_replicas == 8  # Go's legacy loop counts the sample at the cutoff
    assert sync(controller, 301, 8, "20").desired_replicas == 2
    short = HorizontalController(make_spec(), downscale_stabilization=60)
    sync(short, 0, 8, "80")
    assert sync(short, 61, 8, "20").desired_replicas == 2
