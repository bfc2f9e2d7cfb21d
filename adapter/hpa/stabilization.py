"""Stabilization windows over past recommendations (horizontal.go, docs/protocols.md#hpa-behavior).

The history is kept as Go keeps it: a list in which one expired slot is reused per sync,
otherwise appended to, so the same sequence of syncs stabilizes to the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_UP_STABILIZED = "recent recommendations were lower than current one, applying the lowest recent recommendation"
SCALE_DOWN_STABILIZED = (
    "recent recommendations were higher than current one, applying the highest recent recommendation"
)
READY_FOR_NEW_SCALE = "recommended size matches current size"


@dataclass
class _Recommendation:
    replicas: int
    at: float


@dataclass(frozen=True)
class Stabilized:
    """What the windows made of one recommendation."""

    recommendation: int  # the unstabilized (pre-normalized) proposal
    up_window: int | None  # seconds; None on the legacy path, which has no scale-up window
    down_window: int
    up_floor: int | None  # lowest recommendation inside the scale-up window
    down_ceiling: int  # highest recommendation inside the scale-down window
    result: int
    reason: str  # AbleToScale reason
    message: str

    @property
    def changed(self) -> bool:
        return self.result != self.recommendation


class RecommendationHistory:
    def __init__(self) -> None:
        self._items: list[_Recommendation] = []
        self._started = False

    def record_initial(self, current: int, now: float) -> None:
        """recordInitialRecommendation: the first sync seeds the history with the current count,
        so a scale-down right after the controller (re)starts waits out the down window."""
        if not self._started:
            self._items.append(_Recommendation(current, now))
            self._started = True

    def __len__(self) -> int:
        return len(self._items)

    def _record(self, replicas: int, now: float, expired: int | None) -> None:
        if expired is None:
            self._items.append(_Recommendation(replicas, now))
        else:
            self._items[expired] = _Recommendation(replicas, now)

    def stabilize(self, now: float, current: int, desired: int, up_window: int, down_window: int) -> Stabilized:
        """stabilizeRecommendationWithBehaviors: keep `current` unless every recent proposal agrees to move."""
        up_cutoff, down_cutoff = now - up_window, now - down_window
        up_floor = down_ceiling = desired
        expired = None
        for index, item in enumerate(self._items):
            if item.at > up_cutoff:
                up_floor = min(up_floor, item.replicas)
            if item.at > down_cutoff:
                down_ceiling = max(down_ceiling, item.replicas)
            if item.at < up_cutoff and item.at < down_cutoff:
                expired = index
        result = min(max(current, up_floor), down_ceiling)
        self._record(desired, now, expired)
        if result == desired:
            reason, message = "ReadyForNewScale", READY_FOR_NEW_SCALE
        elif desired >= current:
            reason, message = "ScaleUpStabilized", SCALE_UP_STABILIZED
        else:
            reason, message = "ScaleDownStabilized", SCALE_DOWN_STABILIZED
        return Stabilized(desired, up_window, down_window, up_floor, down_ceiling, result, reason, message)

    def stabilize_legacy(self, now: float, desired: int, down_window: int) -> Stabilized:
        """stabilizeRecommendation (`behavior: nil`): the highest proposal of the downscale window."""
        cutoff = now - down_window
        ceiling = desired
        expired = None
        for index, item in enumerate(self._items):
            if item.at < cutoff:
                expired = index
            else:
                ceiling = max(ceiling, item.replicas)
        self._record(desired, now, expired)
        if ceiling == desired:
            reason, message = "ReadyForNewScale", READY_FOR_NEW_SCALE
        else:
            reason, message = "ScaleDownStabilized", SCALE_DOWN_STABILIZED
        return Stabilized(desired, None, down_window, None, ceiling, ceiling, reason, message)
