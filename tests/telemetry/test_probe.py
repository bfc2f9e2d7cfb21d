"""The loop probe (ZEROSCALE_LOOP_PROBE) records what holds the event loop, and only when asked to."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import pytest

from adapter.telemetry.probe import ENV, start_probe


async def test_off_unless_the_variable_names_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert start_probe() is None


async def test_a_held_loop_and_a_collection_are_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "probe.json"
    monkeypatch.setenv(ENV, str(target))
    probe = start_probe()
    assert probe is not None
    try:
        await asyncio.sleep(0.05)
        held = time.thread_time()
        while time.thread_time() - held < 0.1:  # the loop held by 100 ms of work on the CPU
            pass
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # noqa: ASYNC251  the loop held without using the CPU (as when the process is not scheduled)
        await asyncio.sleep(0.05)
        gc.collect()
        target.with_name(target.name + ".census").touch()
        await asyncio.sleep(1.1)  # the next write takes the census
    finally:
        probe.stop()
    state = json.loads(target.read_text())
    # The machine is shared: other stalls may show up, but these two must be there, told apart (the
    # timer is armed up to one 10 ms period before a stall begins: it is late by 90 ms or more).
    stalls = [(late, cpu) for _, late, cpu in state["stalls"]]
    assert any(late >= 0.08 and cpu >= 0.09 for late, cpu in stalls), stalls
    assert any(late >= 0.08 and cpu < 0.05 for late, cpu in stalls), stalls
    assert state["collections"][2] >= 1
    assert state["tracked"]
