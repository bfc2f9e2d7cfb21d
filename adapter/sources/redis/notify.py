"""Keyspace notifications for the keys a source reads, so a push refreshes the series at once.

One subscriber connection per node (the server, the Sentinel-managed master, or each Cluster
primary: a node only announces changes to the keys it owns) listens on
`__keyspace@<db>__:<key>` for every watched key. Polling never stops: a notification only makes
the cache refresh early. When the server does not publish keyspace events
(`notify-keyspace-events` lacks `K`), the watcher says so once and leaves the source polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from adapter.telemetry import redis as telemetry

log = logging.getLogger(__name__)

# Event classes that change a queue's depth: generic (del, rename, expire), lists, sets, sorted
# sets, hashes, streams, expired, evicted; `A` is the alias for all of them.
_DEPTH_CLASSES = set("Ag$lszhtxe")
_RETRY_SECONDS = 1.0
_RECHECK_SECONDS = 60.0

# The clients to subscribe on, by node name: one for a server or Sentinel master, one per Cluster primary.
NodeClients = Callable[[], Awaitable[dict[str, Redis]]]


def publishes_keyspace_events(flags: str) -> bool:
    return "K" in flags and bool(_DEPTH_CLASSES & set(flags))


class _NodeListener:
    """One subscriber connection and the task that reads it."""

    def __init__(self, client: Redis, on_message: Callable[[str], None]) -> None:
        self.client = client
        self.pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)
        self.channels: set[str] = set()
        self._on_message = on_message
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def sync(self, wanted: set[str]) -> None:
        added, removed = wanted - self.channels, self.channels - wanted
        if added:
            await self.pubsub.subscribe(*added)
        if removed:
            await self.pubsub.unsubscribe(*removed)
        self.channels = set(wanted)
        if self._reader is None and self.channels:
            self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while not self._closed:
            try:
                message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (RedisError, OSError) as err:
                # redis-py reconnects (to the current master under Sentinel) and resubscribes on the next read.
                log.debug("keyspace subscriber: %s; reconnecting", err)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            if message is not None and message.get("type") == "message":
                self._on_message(str(message["channel"]))

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(RedisError, OSError):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]


class KeyspaceWatcher:
    def __init__(self, nodes: NodeClients, db: int, source: str, on_change: Callable[[str], None]) -> None:
        self._nodes = nodes
        self._prefix = f"__keyspace@{db}__:"
        self._source = source
        self._on_change = on_change
        self._keys: Counter[str] = Counter()
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listeners: dict[str, _NodeListener] = {}
        # redis-py may swallow a cancellation arriving mid-command, so the loops also check this flag.
        self._closed = False
        self._said: set[str] = set()
        self._backoff = _RETRY_SECONDS  # doubles while subscribing fails, back to 1s once it works
        telemetry.NOTIFICATIONS_ACTIVE.labels(source).set(0)

    def add(self, key: str) -> None:
        self._keys[key] += 1
        if self._keys[key] == 1:
            self._dirty.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"redis keyspace watcher {self._source}")

    def remove(self, key: str) -> None:
        self._keys[key] -= 1
        if self._keys[key] <= 0:
            del self._keys[key]
            self._dirty.set()

    def _message(self, channel: str) -> None:
        if channel.startswith(self._prefix):
            telemetry.NOTIFICATIONS.labels(self._source).inc()
            self._on_change(channel[len(self._prefix) :])

    def _say_once(self, level: int, message: str) -> None:
        """Log a condition the first time it is seen: retries every second must not flood the log."""
        if message not in self._said:
            self._said.add(message)
            log.log(level, "source %s: %s", self._source, message)

    async def _run(self) -> None:
        while not self._closed:
            try:
                clients = await self._nodes()
                flags = await self._flags(next(iter(clients.values())))
                if flags is not None and not publishes_keyspace_events(flags):
                    self._say_once(
                        logging.WARNING,
                        f"the server does not publish keyspace events (notify-keyspace-events={flags!r}); polling "
                        "every interval instead (notify-keyspace-events 'Kl' or more refreshes at once)",
                    )
                    await asyncio.sleep(_RECHECK_SECONDS)
                    continue
                await self._follow(clients)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                telemetry.NOTIFICATIONS_ACTIVE.labels(self._source).set(0)
                self._say_once(logging.WARNING, f"keyspace notifications: {err}; polling meanwhile, retrying")
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, _RECHECK_SECONDS)

    async def _flags(self, client: Redis) -> str | None:
        """The server's notify-keyspace-events, or None when it will not say (CONFIG denied or renamed)."""
        try:
            reply = await client.config_get("notify-keyspace-events")
        except RedisError as err:
            self._say_once(logging.INFO, f"cannot read notify-keyspace-events ({err}); subscribing anyway")
            return None
        return str(reply.get("notify-keyspace-events", ""))

    async def _follow(self, clients: dict[str, Redis]) -> None:
        """Keep one listener per node subscribed to the watched keys until the node set changes."""
        for name in set(self._listeners) - set(clients):
            await self._listeners.pop(name).close()
        for name, client in clients.items():
            if name not in self._listeners:
                self._listeners[name] = _NodeListener(client, self._message)
        self._dirty.set()
        telemetry.NOTIFICATIONS_ACTIVE.labels(self._source).set(1)
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RECHECK_SECONDS):
                    await self._dirty.wait()
            self._dirty.clear()
            wanted = {self._prefix + key for key in self._keys}
            for listener in self._listeners.values():
                await listener.sync(wanted)
            self._backoff = _RETRY_SECONDS
            if set(await self._nodes()) != set(clients):
                return  # Cluster topology changed: rebuild the listeners

    async def close(self) -> None:
        self._closed = True
        self._dirty.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for listener in self._listeners.values():
            await listener.close()
        self._listeners.clear()
