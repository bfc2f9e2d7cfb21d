"""Rate-limited logging: one line per key per interval, with a count of the lines held back.

A peer that makes the same thing fail thousands of times a second must not turn the log into
its amplifier (nor cost a core formatting lines nobody reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

# Keys remembered at most; past it the oldest are forgotten (their next line is simply logged).
_MAX_KEYS = 4096


class LogThrottle:
    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._last: dict[Hashable, tuple[float, int]] = {}  # key -> (time logged, lines held back since)

    def allow(self, key: Hashable) -> int | None:
        """None: stay quiet (counted). A number: log now, mentioning that many lines held back since the last."""
        now = self._clock()
        entry = self._last.get(key)
        if entry is not None and now - entry[0] < self._interval:
            self._last[key] = (entry[0], entry[1] + 1)
            return None
        if entry is None and len(self._last) >= _MAX_KEYS:
            del self._last[next(iter(self._last))]
        self._last.pop(key, None)
        self._last[key] = (now, 0)
        return entry[1] if entry is not None else 0


def held_back(count: int) -> str:
    """The suffix of a throttled line: empty, or how many similar lines were not written."""
    return f" ({count} similar lines suppressed)" if count else ""
