"""Short full garbage collections on a big cache: what survives one is frozen, out of the next one's sight.

A full (generation 2) collection walks every object the collector tracks. Ten thousand series are a
few hundred thousand long-lived objects, and walking them took 50-90 ms of CPU each time (more on a
busy machine) while the event loop waited: the benchmark's p99 (perf/scale_bench.py). They live as
long as their series, so after each full collection its survivors are frozen (gc.freeze) and the
next one walks only what is newer. Frozen objects are still freed by reference counting; only a
cycle among them that becomes garbage waits, so once an hour everything is thawed and the next
full collection walks it all once.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

# Seconds between two thaws: how long cyclic garbage among frozen objects may wait to be collected.
THAW_EVERY = 3600.0


def freeze_after_full_collections(clock: Callable[[], float] = time.monotonic) -> Callable[[], None]:
    """From now on, freeze the survivors of each full collection on the running loop; returns the undo."""
    loop = asyncio.get_running_loop()
    thawed = clock()

    def settle() -> None:
        nonlocal thawed
        if clock() - thawed >= THAW_EVERY:
            gc.unfreeze()  # the next full collection walks everything once
            thawed = clock()
        else:
            gc.freeze()

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            # Not inside the collector's callback: freeze between two callbacks of the loop.
            loop.call_soon(settle)

    gc.callbacks.append(on_collection)

    def undo() -> None:
        gc.callbacks.remove(on_collection)

    return undo
