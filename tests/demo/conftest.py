"""Fixtures of the demo tests: `zeroscale demo` run as a real command, and local workloads of tiny processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from adapter.demo.processes import Supervisor
from adapter.demo.workloads import LocalWorkload

# A replica that says it is ready and then waits to be stopped; argv[1] tags it, to find it in /proc.
SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"]


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


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(tmp_path / "logs")
    yield supervisor
    await supervisor.stop_all()


@pytest.fixture
def tag(tmp_path: Path) -> str:
    """A string only this test's processes carry on their command line."""
    return f"zeroscale-demo-test-{tmp_path.name}"


@pytest.fixture
async def sleeper(supervisor: Supervisor, tag: str) -> AsyncIterator[LocalWorkload]:
    workload = LocalWorkload("sleeper", lambda index: [*SLEEPER, tag], supervisor)
    yield workload
    await workload.close()
