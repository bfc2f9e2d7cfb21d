"""Coalesce the reads of one source into one pipeline (one round trip per node).

The cache refreshes each series on its own timer, so the reads of one interval arrive as many
separate `query()` calls a few microseconds to milliseconds apart. Each call hands its commands
to the batcher; the first call of a batch arms a short timer (`batch_window`), and when it fires
every command collected so far goes out in one pipeline, duplicates merged. Each caller gets back
the results of its own commands, each a value or the exception that command raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from adapter.sources.base import SourceError
from adapter.sources.redis_errors import connection_error
from adapter.telemetry import redis as telemetry

# (command name, key, further arguments): the key is always the second element.
Command = tuple[str, ...]
Results = dict[Command, Any]


@dataclass
class _Waiter:
    commands: Sequence[Command]
    future: asyncio.Future[Results]


class Batcher:
    def __init__(
        self,
        client: Redis | RedisCluster,
        source: str,
        target: str,
        window: float,
        timeout: float,
        max_in_flight: int,
    ) -> None:
        self._client = client
        self._source = source
        self._target = target
        self._window = window
        self._timeout = timeout
        self._waiting: list[_Waiter] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()
        # Batches in flight at once, each on its own pooled connection: a slow batch must not
        # hold up the next interval's, but the pool must not be exhausted either.
        self._slots = asyncio.Semaphore(max_in_flight)

    async def run(self, commands: Sequence[Command]) -> Results:
        """Send `commands` with whatever else arrives in this window; raise SourceError if the round trip fails."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(commands, loop.create_future())
        self._waiting.append(waiter)
        if self._timer is None:
            self._timer = loop.call_later(self._window, self._flush)
        return await waiter.future

    def _flush(self) -> None:
        batch, self._waiting, self._timer = self._waiting, [], None
        task = asyncio.create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Waiter]) -> None:
        live = [w for w in batch if not w.future.done()]  # a caller that timed out is gone
        unique = list(dict.fromkeys(c for waiter in live for c in waiter.commands))
        if not unique:
            return
        async with self._slots:
            started = time.perf_counter()
            try:
                results = await self._pipeline(unique)
            except Exception as err:
                self._fail(live, str(connection_error(err, self._target)))
                return
            except asyncio.CancelledError:
                self._fail(live, "the source is closing")
                raise
            finally:
                telemetry.PIPELINE_SECONDS.labels(self._source).observe(time.perf_counter() - started)
        table = dict(zip(unique, results, strict=True))
        for waiter in live:
            if not waiter.future.done():
                waiter.future.set_result({c: table[c] for c in waiter.commands})

    @staticmethod
    def _fail(waiters: list[_Waiter], message: str) -> None:
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(SourceError(message))  # one exception object per caller

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        telemetry.PIPELINE_COMMANDS.labels(self._source).observe(len(commands))
        telemetry.ROUND_TRIPS.labels(self._source).inc(self._nodes(commands))
        async with asyncio.timeout(self._timeout), self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    def _nodes(self, commands: list[Command]) -> int:
        """Round trips this pipeline costs: one, or one per Cluster node that owns some of its keys."""
        if not isinstance(self._client, RedisCluster):
            return 1
        try:
            nodes = {self._client.get_node_from_key(c[1]) for c in commands}
        except Exception:  # topology not loaded yet: the pipeline loads it and then fans out
            return 1
        return len({node.name for node in nodes if node is not None}) or 1

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fail(self._waiting, "the source is closing")
        self._waiting = []
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)


# What a source gives the readers: send commands, get results (see Batcher.run).
Send = Callable[[Sequence[Command]], Awaitable[Results]]
