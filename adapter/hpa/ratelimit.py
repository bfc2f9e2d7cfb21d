"""Rate limits: Pods/Percent policies over scale events, selectPolicy, min/max (horizontal.go,
docs/protocols.md#hpa-behavior).

Scale events are kept as Go keeps them: each one records a change in replicas, events
older than the direction's longest policy period are marked outdated when the next event
of that direction is stored, and one outdated slot is then reused. Outdated events still
count until reused, exactly as upstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adapter.hpa.spec import MAX_INT32, Behavior, PolicyType, ScalingPolicy, ScalingRules, SelectPolicy

_UP_LIMIT = ("ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate")
_DOWN_LIMIT = ("ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate")
_TOO_MANY = ("TooManyReplicas", "the desired replica count is more than the maximum replica count")
_TOO_FEW = ("TooFewReplicas", "the desired replica count is less than the minimum replica count")
_WITHIN = ("DesiredWithinRange", "the desired count is within the acceptable range")


@dataclass
class _ScaleEvent:
    change: int
    at: float
    outdated: bool = False


class ScaleEvents:
    """The HPA's scale-up and scale-down history, used by the period-based policies."""

    def __init__(self) -> None:
        self.up: list[_ScaleEvent] = []
        self.down: list[_ScaleEvent] = []

    def store(self, behavior: Behavior | None, now: float, previous: int, new: int) -> None:
        """storeScaleEvent; the legacy path (`behavior: nil`) keeps none."""
        if behavior is None:
            return
        rules, events = (behavior.scale_up, self.up) if new > previous else (behavior.scale_down, self.down)
        cutoff = now - rules.longest_period
        reuse = None
        for index, event in enumerate(events):
            if event.at < cutoff:
                event.outdated = True
            if event.outdated:
                reuse = index
        fresh = _ScaleEvent(abs(new - previous), now)
        if reuse is None:
            events.append(fresh)
        else:
            events[reuse] = fresh


def _changed_within(events: list[_ScaleEvent], now: float, period: int) -> int:
    """getReplicasChangePerPeriod."""
    cutoff = now - period
    return sum(event.change for event in events if event.at > cutoff)


@dataclass(frozen=True)
class PolicyLimit:
    policy: ScalingPolicy
    period_start: int  # replicas at the start of the policy's period
    allowed: int  # the most (up) or least (down) replicas this policy allows now


@dataclass(frozen=True)
class Limited:
    """What rate limits and min/max made of the stabilized recommendation."""

    desired: int  # the stabilized recommendation going in
    direction: str  # "up", "down" or "none"
    select_policy: SelectPolicy | None  # None when no policy applied (no change, or the legacy path)
    policies: tuple[PolicyLimit, ...]
    rate_limit: int | None  # the combined policy bound (or the legacy max(2*current, 4))
    result: int
    reason: str  # ScalingLimited reason
    message: str
    legacy: bool = False

    @property
    def limited(self) -> bool:
        return self.result != self.desired


def _policy_bounds(
    events: ScaleEvents, now: float, current: int, rules: ScalingRules, up: bool
) -> tuple[int | None, tuple[PolicyLimit, ...]]:
    """calculateScaleUpLimitWithScalingRules / calculateScaleDownLimitWithBehaviors; None when Disabled."""
    limits = []
    for policy in rules.policies:
        added = _changed_within(events.up, now, policy.period_seconds)
        removed = _changed_within(events.down, now, policy.period_seconds)
        start = current - added + removed
        if policy.type is PolicyType.PODS:
            allowed = start + policy.value if up else start - policy.value
        elif up:
            # Rounded up so a small percentage still adds a pod; from 0 it adds none (docs/protocols.md#hpa-behavior).
            allowed = min(math.ceil(start * (1 + policy.value / 100)), MAX_INT32)
        else:
            allowed = int(start * (1 - policy.value / 100))  # Go's int32() truncates
        limits.append(PolicyLimit(policy, start, allowed))
    if rules.select_policy is SelectPolicy.DISABLED:
        return None, tuple(limits)
    allowed_values = [limit.allowed for limit in limits]
    # For scaling up, Max picks the largest bound; for scaling down, Max picks the lowest (the biggest change).
    picks_largest = (rules.select_policy is SelectPolicy.MAX) == up
    return (max(allowed_values) if picks_largest else min(allowed_values)), tuple(limits)


def limit_with_behavior(
    events: ScaleEvents, now: float, current: int, desired: int, behavior: Behavior, low: int, high: int
) -> Limited:
    """convertDesiredReplicasWithBehaviorRate."""
    if desired > current:
        bound, limits = _policy_bounds(events, now, current, behavior.scale_up, up=True)
        # Disabled, or already past the limit: do not scale up further until events expire.
        rate = current if bound is None or bound < current else bound
        reason = _UP_LIMIT if high > rate else _TOO_MANY
        ceiling = min(high, rate)
        result = ceiling if desired > ceiling else desired
        select = behavior.scale_up.select_policy
        return _limited(desired, "up", select, limits, rate, result, reason)
    if desired < current:
        bound, limits = _policy_bounds(events, now, current, behavior.scale_down, up=False)
        rate = current if bound is None or bound > current else bound
        reason = _DOWN_LIMIT if low < rate else _TOO_FEW
        floor = max(low, rate)
        result = floor if desired < floor else desired
        select = behavior.scale_down.select_policy
        return _limited(desired, "down", select, limits, rate, result, reason)
    return Limited(desired, "none", None, (), None, desired, *_WITHIN)


def _limited(
    desired: int,
    direction: str,
    select: SelectPolicy,
    limits: tuple[PolicyLimit, ...],
    rate: int,
    result: int,
    reason: tuple[str, str],
) -> Limited:
    final_reason = reason if result != desired else _WITHIN
    return Limited(desired, direction, select, limits, rate, result, *final_reason)


def limit_legacy(current: int, desired: int, low: int, high: int) -> Limited:
    """convertDesiredReplicasWithRules (`behavior: nil`): scale up to at most max(2*current, 4)."""
    rate = int(max(2.0 * current, 4.0))
    reason = _UP_LIMIT if high > rate else _TOO_MANY
    ceiling = min(high, rate)
    direction = "up" if desired > current else "down" if desired < current else "none"
    if desired < low:
        return Limited(desired, direction, None, (), rate, low, *_TOO_FEW, legacy=True)
    if desired > ceiling:
        return Limited(desired, direction, None, (), rate, ceiling, *reason, legacy=True)
    return Limited(desired, direction, None, (), rate, desired, *_WITHIN, legacy=True)
