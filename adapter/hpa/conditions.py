"""HPA status conditions (docs/protocols.md#hpa-behavior reason strings, docs/protocols.md#hpa-scale-to-zero), kept like
`status.conditions`."""

from __future__ import annotations

from dataclasses import dataclass

ABLE_TO_SCALE = "AbleToScale"
SCALING_ACTIVE = "ScalingActive"
SCALING_LIMITED = "ScalingLimited"
SCALED_TO_ZERO = "ScaledToZero"
_ORDER = (ABLE_TO_SCALE, SCALING_ACTIVE, SCALING_LIMITED, SCALED_TO_ZERO)


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str
    last_transition: float  # the `now` of the sync that last flipped `status`

    @property
    def status_text(self) -> str:
        return "True" if self.status else "False"


class Conditions:
    """setCondition: a new status moves lastTransitionTime; the same status only updates reason and message."""

    def __init__(self) -> None:
        self._by_type: dict[str, Condition] = {}

    def set(self, kind: str, status: bool, reason: str, message: str, now: float) -> None:
        previous = self._by_type.get(kind)
        since = previous.last_transition if previous is not None and previous.status == status else now
        self._by_type[kind] = Condition(kind, status, reason, message, since)

    def get(self, kind: str) -> Condition | None:
        return self._by_type.get(kind)

    def is_true(self, kind: str) -> bool:
        condition = self._by_type.get(kind)
        return condition is not None and condition.status

    def snapshot(self) -> tuple[Condition, ...]:
        return tuple(self._by_type[kind] for kind in _ORDER if kind in self._by_type)
