"""The `redis` source: queue depths from lists, sorted sets and streams (see reads for the commands)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from adapter.config.redis import RedisSource
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.sources.redis.batch import Batcher
from adapter.sources.redis.connect import connect, node_client
from adapter.sources.redis.errors import connection_error
from adapter.sources.redis.notify import KeyspaceWatcher
from adapter.sources.redis.reads import QueueReader


class RedisQueues(Source):
    def __init__(self, config: RedisSource) -> None:
        super().__init__()
        self._config = config
        self._connection = connect(config)
        # Keep one pooled connection free for the keyspace subscriber.
        in_flight = max(1, config.max_connections - 1)
        self._batcher = Batcher(
            self._connection.client,
            config.name,
            self._connection.target,
            config.batch_window,
            config.timeout,
            in_flight,
        )
        self._reader = QueueReader(self._batcher.run, config.name)
        self._watchers: dict[str, set[SourceQuery]] = {}  # key -> the watched queries that read it
        self._node_clients: dict[str, Redis] = {}
        self._keyspace = (
            KeyspaceWatcher(self._nodes, config.db, config.name, self._key_changed) if config.notifications else None
        )

    def query(self, query: SourceQuery) -> Coroutine[Any, Any, list[Sample]]:
        # The reader's coroutine itself, not one wrapping it: a refresh of 1,000 series enters
        # and resumes 1,000 frames fewer. Creating it cannot raise; awaiting it may.
        # (docs/architecture.md#hot-query-coroutine)
        return self._reader.read(query)

    async def check(self) -> None:
        try:
            async with asyncio.timeout(self._config.timeout):
                await self._connection.client.ping()
        except Exception as err:
            raise connection_error(err, self._connection.target) from None

    def watch(self, query: SourceQuery) -> None:
        if self._keyspace is None:
            return
        for key in self._keys(query):
            self._watchers.setdefault(key, set()).add(query)
            self._keyspace.add(key)

    def unwatch(self, query: SourceQuery) -> None:
        if self._keyspace is None:
            return
        for key in self._keys(query):
            queries = self._watchers.get(key)
            if queries is None or query not in queries:
                continue
            queries.discard(query)
            if not queries:
                del self._watchers[key]
            self._keyspace.remove(key)

    def _keys(self, query: SourceQuery) -> list[str]:
        try:
            return self._reader.keys_of(query)
        except SourceError:
            return []  # the read itself reports the missing selector value

    def _key_changed(self, key: str) -> None:
        for query in list(self._watchers.get(key, ())):
            self.changed(query)

    async def _nodes(self) -> dict[str, Redis]:
        """Where to subscribe: the client itself, or a client per Cluster primary."""
        client = self._connection.client
        if not isinstance(client, RedisCluster):
            return {"server": client}
        await client.initialize()
        primaries = {node.name: node for node in client.get_primaries()}
        for name in set(self._node_clients) - set(primaries):
            await self._node_clients.pop(name).aclose()
        for name, node in primaries.items():
            if name not in self._node_clients:
                self._node_clients[name] = node_client(self._config, node.host, int(node.port))
        return dict(self._node_clients)

    async def close(self) -> None:
        if self._keyspace is not None:
            await self._keyspace.close()
        await self._batcher.close()
        for client in self._node_clients.values():
            await client.aclose()
        await self._connection.close()
