"""The cache's schedule: one timer for every series, earliest time wins, long ticks give the loop back."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapter.metrics.schedule import Schedule


class Item:
    def __init__(self) -> None:
        self.due: float | None = None


async def test_a_tick_with_ten_thousand_due_items_gives_the_event_loop_back() -> None:
    visited: list[Item] = []

    def visit(item: Item, now: float) -> None:
        end = time.perf_counter() + 0.00002  # a refresh's Python work, about 20 us
        while time.perf_counter() < end:
            pass
        visited.append(item)

    schedule: Schedule[Item] = Schedule(time.monotonic, visit, 1.0)
    items = [Item() for _ in range(10_000)]
    now = time.monotonic()
    for item in items:
        schedule.at(item, now)
    seen_by_others: list[int] = []

    async def other_work() -> None:  # an API request waiting for its turn
        while len(visited) < len(items):
            seen_by_others.append(len(visited))
            await asyncio.sleep(0)

    await asyncio.wait_for(other_work(), 30)
    assert len(visited) == len(items)
    assert len(set(visited)) == len(items)  # each once
    # The other work ran between chunks all along, not once after 200 ms of visits.
    assert len(set(seen_by_others)) > 20
    schedule.close()


async def test_the_earliest_time_stands_and_a_later_one_is_ignored() -> None:
    calls: list[Item] = []
    schedule: Schedule[Item] = Schedule(time.monotonic, lambda item, _now: calls.append(item), 1.0)
    item = Item()
    now = time.monotonic()
    schedule.at(item, now + 0.5)
    schedule.at(item, now)  # earlier: moves it
    schedule.at(item, now + 0.2)  # later: ignored
    await asyncio.sleep(0.1)
    assert calls == [item]
    await asyncio.sleep(0.6)
    assert calls == [item]  # the replaced entries are not visits
    schedule.cancel(item)
    schedule.close()


async def test_a_failing_visit_is_logged_and_the_others_still_happen(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[Item] = []
    broken = Item()

    def visit(item: Item, _now: float) -> None:
        if item is broken:
            raise RuntimeError("a bug")
        calls.append(item)

    schedule: Schedule[Item] = Schedule(time.monotonic, visit, 1.0)
    items = [Item(), broken, Item()]
    for item in items:
        schedule.at(item, time.monotonic())
    await asyncio.sleep(0.05)
    assert calls == [items[0], items[2]]
    assert "visit of" in caplog.text
    later = Item()
    schedule.at(later, time.monotonic())  # the timer still runs
    await asyncio.sleep(0.05)
    assert calls[-1] is later
    schedule.close()
