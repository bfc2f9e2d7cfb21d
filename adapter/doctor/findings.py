"""What a check found: a level, the thing checked, and plain words (with what to do about it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    message: str
    hint: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"level": self.level, "check": self.check, "message": self.message, "hint": self.hint}
