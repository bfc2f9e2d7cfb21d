"""A debug probe of event-loop stalls and garbage-collector pauses, on when ZEROSCALE_LOOP_PROBE names a file.

Answers "where does a slow answer's time go" from inside the process (perf/scale_bench.py sets it):
a timer re-armed every `_PERIOD` measures how late it fires, which is how long something held the
loop (any loop, uvloop's included; no asyncio debug mode needed), with the CPU time the thread got
meanwhile (a stall with little CPU is the machine's: the process was not running), and gc.callbacks
time each collection. When a file named as the probe's with `.census` added appears, it writes once
what the collector tracks, by type (what a full collection walks). Every stall or pause of at least
`_RECORD_FROM` is kept with its wall-clock time, so a benchmark can pick those of its measured
window; the file is rewritten (JSON) once a second.
Off by default: it costs a wakeup every 10 ms.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

ENV = "ZEROSCALE_LOOP_PROBE"
_PERIOD = 0.01
_RECORD_FROM = 0.001  # stalls and pauses shorter than this are only counted
_WRITE_EVERY = 1.0
_KEEP = 20_000  # events kept, the latest


class Probe:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._stalls: list[tuple[float, float, float]] = []  # (wall time, seconds late, CPU seconds meanwhile)
        # (wall time, seconds, generation, objects collected, CPU seconds of the thread meanwhile)
        self._pauses: list[tuple[float, float, int, int, float]] = []
        self._ticks = 0
        self._collections = [0, 0, 0]
        self._gc_started = 0.0
        self._gc_cpu = 0.0
        self._written = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expected = 0.0
        self._cpu = 0.0
        self._tracked: list[tuple[str, int]] = []

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        gc.callbacks.append(self._on_gc)
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._write()

    def _census(self) -> None:
        kinds: dict[str, int] = {}
        for thing in gc.get_objects():
            kind = type(thing).__qualname__
            kinds[kind] = kinds.get(kind, 0) + 1
        self._tracked = sorted(kinds.items(), key=lambda item: -item[1])[:15]

    def _arm(self) -> None:
        assert self._loop is not None
        self._expected = self._loop.time() + _PERIOD
        self._cpu = time.thread_time()
        self._timer = self._loop.call_later(_PERIOD, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        late = self._loop.time() - self._expected
        self._ticks += 1
        now = time.time()
        if late >= _RECORD_FROM:
            self._stalls.append((now - late, late, time.thread_time() - self._cpu))
            del self._stalls[:-_KEEP]
        if now - self._written >= _WRITE_EVERY:
            self._write()
        self._arm()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            self._gc_cpu = time.thread_time()
            return
        took = time.perf_counter() - self._gc_started
        generation = int(info["generation"])
        self._collections[generation] += 1
        if took >= _RECORD_FROM:
            cpu = time.thread_time() - self._gc_cpu
            self._pauses.append((time.time() - took, took, generation, int(info["collected"]), cpu))
            del self._pauses[:-_KEEP]

    def _write(self) -> None:
        self._written = time.time()
        ask = self._path.with_name(self._path.name + ".census")
        if ask.exists():
            ask.unlink()
            self._census()
        state = {
            "ticks": self._ticks,
            "period": _PERIOD,
            "collections": self._collections,
            "stalls": self._stalls,
            "gc_pauses": self._pauses,
            "tracked": self._tracked,
        }
        partial = self._path.with_suffix(".tmp")
        partial.write_text(json.dumps(state))
        partial.replace(self._path)


def start_probe() -> Probe | None:
    """Start the probe on the running loop when ZEROSCALE_LOOP_PROBE is set; None otherwise."""
    target = os.environ.get(ENV)
    if not target:
        return None
    probe = Probe(Path(target))
    probe.start()
    return probe
