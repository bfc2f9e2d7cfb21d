"""Warnings a peer can trigger at will: one line per key per interval, carrying how many were held back."""

from __future__ import annotations

import logging
import time


class ThrottledLog:
    """`warn(key, message, *args)` logs at most once per `interval` seconds for each key (keys are few and fixed)."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._logger = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            self._logger.warning(message + " (and %d more like it in the last %gs)", *args, held, self._interval)
        else:
            self._logger.warning(message, *args)
