"""What every list-and-watch of a collection needs: a task to run it in, the loop that lists and watches, and the
events applied to a copy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError, KubeWatchSilent
from adapter.telemetry import kube as telemetry

log = logging.getLogger(__name__)
# After the API said no or went away, list again after this long (doubling up to the second).
_BACKOFF_START, _BACKOFF_MAX = 0.5, 30.0

# Lists a collection: (its path to watch, its objects by name, the list's resourceVersion).
Lister = Callable[[], Awaitable[tuple[str, dict[str, dict[str, Any]], str]]]


class WatchTask:
    """A watch loop (`_run`) in a task of its own: start() once, close() cancels it and waits.

    `_run` handles the errors it expects (KubeError: the API said no or went away). Anything else it
    raises, a malformed object it did not foresee or a bug, would end the task silently and leave its
    readers with what they last saw for ever; instead it is logged, counted and `_run` starts again.
    """

    _task: asyncio.Task[None] | None = None
    # Names the watch in logs and in zeroscale_kube_watch_crashes_total.
    watch_name = "watch"
    # After an unexpected error the loop starts again after the first delay, doubling up to the second; a run that
    # lasted longer than that second one was a recovery, so the next crash waits the first delay again (else,
    # after five crashes in a process's life, every later one would cost the longest delay).
    restart_backoff = (1.0, 30.0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=self.watch_name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        first, longest = self.restart_backoff
        delay = first
        while True:
            started = loop.time()
            try:
                await self._run()
                return
            except Exception:
                if loop.time() - started > longest:
                    delay = first
                telemetry.WATCH_CRASHES.labels(self.watch_name).inc()
                log.exception("%s stopped on an unexpected error; starting it again in %gs", self.watch_name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

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


def name_of(obj: object) -> str | None:
    """An object's metadata.name: how the objects of one namespace's collection are kept."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


def namespaced_name_of(obj: object) -> str | None:
    """`<namespace>/<name>`: how the objects of a collection listed across namespaces are kept (names repeat)."""
    name = name_of(obj)
    namespace = field(obj, "metadata").get("namespace")
    return f"{namespace}/{name}" if name and isinstance(namespace, str) and namespace else None


ObjectKey = Callable[[object], "str | None"]


def objects_by_name(listing: dict[str, Any], key: ObjectKey = name_of) -> dict[str, dict[str, Any]]:
    """A list answer's items by name (or `key`); an item without one (or not an object) is skipped, not fatal."""
    items = listing.get("items")
    named: dict[str, dict[str, Any]] = {}
    for item in items if isinstance(items, list) else ():
        name = key(item)
        if name is not None:
            named[name] = item
    return named


def apply_event(objects: dict[str, dict[str, Any]], event: dict[str, Any], key: ObjectKey = name_of) -> bool:
    """Apply one watch event to the objects kept by name (or `key`); False for events that change nothing
    (BOOKMARK) or that carry no named object."""
    kind = event.get("type")
    obj = event.get("object")
    name = key(obj)
    if name is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return False
    assert isinstance(obj, dict)
    if kind == "DELETED":
        objects.pop(name, None)
    else:
        objects[name] = obj
    return True


def collection_lister(kube: KubeClient, path: str, key: ObjectKey = name_of) -> Lister:
    """The Lister of one collection path (a labelSelector or fieldSelector may be part of it); its objects are
    kept by `key` (`namespaced_name_of` for a collection across namespaces)."""

    async def list_collection() -> tuple[str, dict[str, dict[str, Any]], str]:
        _, listing = await kube.request("GET", path)
        return path, objects_by_name(listing, key), str(field(listing, "metadata").get("resourceVersion", ""))

    return list_collection


class ListWatch(WatchTask):
    """A collection kept current for ever: list it, watch from the list's resourceVersion, list again when the
    watch ends, falls silent (docs/architecture.md#staleness-bounds) or its version is too old (410 Gone), and
    whenever a reader doubts the copy (`relist()`).

    `on_change(objects)` is called with every object by name after the list and after each event that changed
    something. `on_error(err)` is told each time the API said no or went away (the objects last seen stay as
    they were: nothing is made up); it returns True to stop for good.
    """

    def __init__(
        self,
        kube: KubeClient,
        lister: Lister,
        watch_name: str,
        on_change: Callable[[dict[str, dict[str, Any]]], None],
        on_error: Callable[[KubeError], bool],
        key: ObjectKey = name_of,
        shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """`key`: how events' objects are kept, as the lister keeps them. `shape`: what of each object is kept, as it
        arrives (a collection others write, tenants' objects, would otherwise hold whatever they put in it)."""
        self._kube = kube
        self._key = key
        self._shape = shape
        self._lister = lister
        self.watch_name = watch_name
        self._on_change = on_change
        self._on_error = on_error
        self._doubted = asyncio.Event()  # relist() was called since the latest list began
        self._waiters: list[asyncio.Future[None]] = []  # relist() callers waiting for the next list
        self._following: asyncio.Timeout | None = None  # the watch being followed, cut short by relist()
        # While on_change runs: the key of the one object the event changed, or None after a list (any may have).
        # A reader of a large collection updates just that object instead of going over all of them.
        self.changed_key: str | None = None

    async def relist(self) -> None:
        """List the collection again now (and watch from there): a reader that cannot tell a quiet watch from a
        stale one re-reads its inputs this way. Returns once that list has been applied or has failed."""
        if self._task is None or self._task.done():
            return
        done = asyncio.get_running_loop().create_future()
        self._waiters.append(done)
        self._doubted.set()
        if self._following is not None:
            self._following.reschedule(asyncio.get_running_loop().time())
        await done

    async def _run(self) -> None:
        try:
            await self._list_and_watch()
        finally:  # stopped or crashed: nobody is left to answer relist()
            _wake(self._waiters)
            self._waiters = []

    async def _list_and_watch(self) -> None:
        backoff = _BACKOFF_START
        while True:
            waiting, self._waiters = self._waiters, []
            self._doubted.clear()
            try:
                try:
                    path, objects, version = await self._lister()
                    if self._shape is not None:
                        objects = {name: self._shape(obj) for name, obj in objects.items()}
                    self.changed_key = None
                    self._on_change(objects)
                finally:
                    _wake(waiting)
                if not self._doubted.is_set():
                    await self._follow(path, version, objects)
                backoff = _BACKOFF_START
                continue
            except KubeWatchSilent as err:
                log.warning("%s: %s", self.watch_name, err)
                continue  # nothing went wrong that listing again cannot tell: at once
            except KubeAPIError as err:
                if err.status == 410:
                    continue  # our resourceVersion is too old: list again at once
                if self._on_error(err):
                    return
            except KubeError as err:
                if self._on_error(err):
                    return
            with contextlib.suppress(TimeoutError):  # a relist() asked for meanwhile is not put off
                # Jittered: the many watches of one proxy failing together (an API server restarting) must not come
                # back as one wave of lists, and again at every doubling.
                async with asyncio.timeout(backoff * random.uniform(0.5, 1.0)):
                    await self._doubted.wait()
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _follow(self, path: str, version: str, objects: dict[str, dict[str, Any]]) -> None:
        """Apply the watch's events until the watch ends or relist() cuts it short."""
        cut = asyncio.timeout(None)
        try:
            async with cut:
                self._following = cut
                async for event in self._kube.watch(path, version or None):
                    obj = event.get("object")
                    if self._shape is not None and isinstance(obj, dict):
                        event = {**event, "object": self._shape(obj)}
                    if apply_event(objects, event, self._key):
                        self.changed_key = self._key(event.get("object"))
                        self._on_change(objects)
        except TimeoutError:
            if not cut.expired():
                raise
        finally:
            self._following = None


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
