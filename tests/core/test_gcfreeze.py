"""Survivors of full collections are frozen, and thawed once an hour so cyclic garbage among them goes."""

from __future__ import annotations

import asyncio
import gc
import weakref

from adapter.gcfreeze import THAW_EVERY, freeze_after_full_collections


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


async def full_collection() -> None:
    gc.collect()
    await asyncio.sleep(0)  # the freeze (or thaw) runs as the loop's next callback


async def test_survivors_are_frozen_and_a_thaw_lets_their_cycles_be_collected() -> None:
    now = [0.0]
    undo = freeze_after_full_collections(lambda: now[0])
    try:
        before = gc.get_freeze_count()
        long_lived = [[] for _ in range(1000)]  # type: ignore[var-annotated]
        await full_collection()
        assert gc.get_freeze_count() >= before + len(long_lived)

        node = Node()
        ref = weakref.ref(node)
        await full_collection()  # node survives it: frozen
        del node
        await full_collection()
        assert ref() is not None  # out of the collector's sight while frozen

        now[0] = THAW_EVERY
        await full_collection()  # after this one, everything is thawed
        gc.collect()
        assert ref() is None
    finally:
        undo()
        gc.unfreeze()
