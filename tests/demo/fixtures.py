"""Helpers of the demo tests: polling, finding processes by their command line, skipping without redis-server."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


async def until(condition: Callable[[], bool], within: float = 20.0) -> None:
    """Poll until `condition()` holds (TimeoutError after `within` seconds)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - no event to wait on: the state is plain attributes and /proc
            await asyncio.sleep(0.02)


def require_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (to find orphans)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry))
    return found
