"""What every list-and-watch of a collection needs: a task to run it in, and the events applied to a copy."""

from __future__ import annotations

import asyncio
from typing import Any


class WatchTask:
    """A watch loop (`_run`) in a task of its own: start() once, close() cancels it and waits."""

    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        raise NotImplementedError


def apply_event(objects: dict[str, dict[str, Any]], event: dict[str, Any]) -> bool:
    """Apply one watch event to the objects kept by name; False for events that change nothing (BOOKMARK)."""
    kind = event.get("type")
    obj = event.get("object") or {}
    name = (obj.get("metadata") or {}).get("name")
    if not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return False
    if kind == "DELETED":
        objects.pop(name, None)
    else:
        objects[name] = obj
    return True
