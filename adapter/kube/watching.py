"""What every list-and-watch of a collection needs: a task to run it in, and the events applied to a copy."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from adapter.telemetry import kube as telemetry

log = logging.getLogger(__name__)
# After an unexpected error, the watch loop starts again after this long (doubling up to the second).
_RESTART_START, _RESTART_MAX = 1.0, 30.0


class WatchTask:
    """A watch loop (`_run`) in a task of its own: start() once, close() cancels it and waits.

    `_run` handles the errors it expects (KubeError: the API said no or went away). Anything else it
    raises, a malformed object it did not foresee or a bug, would end the task silently and leave its
    readers with what they last saw for ever; instead it is logged, counted and `_run` starts again.
    """

    _task: asyncio.Task[None] | None = None
    # Names the watch in logs and in zeroscale_kube_watch_crashes_total.
    watch_name = "watch"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=self.watch_name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _supervise(self) -> None:
        delay = _RESTART_START
        while True:
            try:
                await self._run()
                return
            except Exception:
                telemetry.WATCH_CRASHES.labels(self.watch_name).inc()
                log.exception("%s stopped on an unexpected error; starting it again in %gs", self.watch_name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESTART_MAX)

    async def _run(self) -> None:
        raise NotImplementedError


def field(obj: object, name: str) -> dict[str, Any]:
    """`obj[name]` when both are JSON objects, else {}: a malformed object reads as one without the field."""
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def items_of(obj: object, name: str) -> list[Any]:
    """`obj[name]` when it is a JSON array, else []."""
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def objects_by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A list answer's items by name; an item without a name (or not an object) is skipped, not fatal."""
    items = listing.get("items")
    named: dict[str, dict[str, Any]] = {}
    for item in items if isinstance(items, list) else ():
        metadata = item.get("metadata") if isinstance(item, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if isinstance(name, str) and name:
            named[name] = item
    return named


def apply_event(objects: dict[str, dict[str, Any]], event: dict[str, Any]) -> bool:
    """Apply one watch event to the objects kept by name; False for events that change nothing (BOOKMARK)
    or that carry no named object."""
    kind = event.get("type")
    obj = event.get("object")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return False
    assert isinstance(obj, dict)
    if kind == "DELETED":
        objects.pop(name, None)
    else:
        objects[name] = obj
    return True
