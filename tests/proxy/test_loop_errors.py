"""The harness's loop-error check: fails a test on its own callbacks' errors, not on an earlier test's closed loop."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fixtures.proxy import from_a_closed_loop


async def _errors_raised_in_callbacks(*callbacks: Any) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        for callback in callbacks:
            loop.call_soon(callback)
        await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    return seen


async def test_a_completion_handed_to_a_closed_loop_is_not_this_tests_error() -> None:
    """As grpc.aio's poller does for a call an earlier test left behind: call_soon_threadsafe on that test's loop."""
    earlier = asyncio.new_event_loop()
    earlier.close()
    [context] = await _errors_raised_in_callbacks(lambda: earlier.call_soon_threadsafe(print))
    assert from_a_closed_loop(context)


async def test_an_error_of_this_tests_own_callbacks_still_fails_it() -> None:
    def broken() -> None:
        raise RuntimeError("the protocol's bug")

    def closed_too_early() -> None:
        raise ConnectionResetError("Event loop is closed")  # the words alone are not the closed-loop case

    contexts = await _errors_raised_in_callbacks(broken, closed_too_early)
    assert [from_a_closed_loop(context) for context in contexts] == [False, False]
