"""Fixtures of the demo tests: `zeroscale demo` run as a real command, and local workloads of tiny processes."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapter.demo.processes import Supervisor
from adapter.demo.workloads import LocalWorkload

# A replica that says it is ready and then waits to be stopped; argv[1] tags it, to find it in /proc.
SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"]


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
