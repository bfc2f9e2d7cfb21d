"""Coalesce the reads of one source into one pipeline (one round trip per node).

The cache refreshes each series on its own timer, so the reads of one interval arrive as many
separate `query()` calls a few microseconds to milliseconds apart. Each call hands its commands
to the batcher; the first call of a batch arms a short timer (`batch_window`), and when it fires
every command collected so far goes out in one pipeline, duplicates merged. Every caller of a
batch gets back the same table of its results, command -> a value or the exception that command
raised, and looks up its own commands there.

Standalone and Sentinel batches skip redis-py's Pipeline object: the commands are packed by
hiredis into one write on one pooled connection and the replies read back one by one
(`internals.send_packed`, the one user of redis-py's non-public API), at a fraction of its
per-command cost. Cluster batches keep redis-py's ClusterPipeline,
which splits them per node and follows MOVED/ASK.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import hiredis
from opentelemetry.trace import Span
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from adapter.sources.base import SourceError
from adapter.sources.redis.errors import connection_error
from adapter.sources.redis.internals import send_packed
from adapter.telemetry import reads as spans
from adapter.telemetry import redis as telemetry
from adapter.telemetry import tracing

# Commands in one pipeline at most; a larger batch goes as several, one after another on its connection.
# One pipeline of ten thousand commands holds Redis (single-threaded) for its whole length and makes
# it buffer every reply; this many answer in well under a millisecond of Redis time.
MAX_PIPELINE_COMMANDS = 500

# (command name, key, further arguments): the key is always the second element.
Command = tuple[str, ...]
# Command -> its value or the exception it raised; a caller may find other callers' commands in it too.
Results = Mapping[Command, Any]
# One caller of a batch: its commands, the future its results go to, and its span (tracing on).
_Waiter = tuple[Sequence[Command], "asyncio.Future[Results]", Span | None]


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

    def run(self, commands: Sequence[Command]) -> asyncio.Future[Results]:
        """Send `commands` with what else arrives in this window; the future fails with SourceError if the trip fails.

        A plain function returning the future, not a coroutine: one frame less for each of a
        batch's thousand callers to enter and resume (docs/architecture.md#hot-batch-future).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Results] = loop.create_future()
        self._waiting.append((commands, future, spans.caller()))
        if self._timer is None:
            self._timer = loop.call_later(self._window, self._flush)
        return future

    def _flush(self) -> None:
        batch, self._waiting, self._timer = self._waiting, [], None
        task = asyncio.create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Waiter]) -> None:
        live = [waiter for waiter in batch if not waiter[1].done()]  # a caller that timed out is gone
        unique = list(dict.fromkeys([c for commands, _, _ in live for c in commands]))
        if not unique:
            return
        span = None if tracing.TRACER is None else self._span(live, len(unique))
        async with self._slots:
            started = time.perf_counter()
            try:
                results: list[Any] = []
                async with asyncio.timeout(self._timeout):  # the whole batch, however many pipelines
                    for at in range(0, len(unique), MAX_PIPELINE_COMMANDS):
                        results += await self._pipeline(unique[at : at + MAX_PIPELINE_COMMANDS])
            except Exception as err:
                self._fail(live, str(connection_error(err, self._target)), span)
                return
            except asyncio.CancelledError:
                self._fail(live, "the source is closing", span)
                raise
            finally:
                telemetry.PIPELINE_SECONDS.labels(self._source).observe(time.perf_counter() - started)
                if span is not None:
                    span.end()
        # One table for the whole batch, shared by its callers: each looks up its own commands.
        table = dict(zip(unique, results, strict=True))
        for _, future, _ in live:
            if not future.done():
                future.set_result(table)

    def _span(self, live: list[_Waiter], commands: int) -> Span | None:
        """The batch's span, shared by its callers (adapter/telemetry/reads.py)."""
        attributes: dict[str, str | int] = {
            tracing.DB_SYSTEM: "redis",
            tracing.DB_BATCH_SIZE: commands,
            tracing.SOURCE: self._source,
        }
        return spans.start_shared(tracing.REDIS_PIPELINE, [caller for _, _, caller in live], attributes)

    @staticmethod
    def _fail(waiters: list[_Waiter], message: str, span: Span | None = None) -> None:
        if span is not None:
            spans.failed(span, message)
        for _, future, _ in waiters:
            if not future.done():
                future.set_exception(SourceError(message))  # one exception object per caller

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        telemetry.PIPELINE_COMMANDS.labels(self._source).observe(len(commands))
        telemetry.ROUND_TRIPS.labels(self._source).inc(self._nodes(commands))
        if isinstance(self._client, RedisCluster):
            async with self._client.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                results: list[Any] = await pipe.execute(raise_on_error=False)
            return results
        return await send_packed(self._client, _pack(commands), commands)

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


def _pack(commands: list[Command]) -> bytes:
    """The RESP of all commands, as redis-py's pack_commands makes it ("XINFO GROUPS" is two words).

    One write per batch, no Pipeline object: docs/architecture.md#hot-redis-pack."""
    pack: Any = hiredis.pack_command  # its stub types the argument as a 1-tuple
    return b"".join(
        [pack((*command[0].split(), *command[1:]) if " " in command[0] else command) for command in commands]
    )


# What a source gives the readers: send commands, get results (see Batcher.run).
Send = Callable[[Sequence[Command]], Awaitable[Results]]
