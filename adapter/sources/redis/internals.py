"""The one place that uses redis-py's non-public API: a pipeline without the Pipeline object.

Why: docs/architecture.md#hot-redis-pack (one write per batch, at a fraction of Pipeline's per-command
cost). What it relies on, none of it documented: `ConnectionPool.get_connection()` without arguments and
`ConnectionPool.release()` (both coroutines), a connection's `retry.call_with_retry`, `disconnect`,
`send_packed_command` and `read_response`, and the client's `response_callbacks` table (command name ->
the callable that shapes a raw reply, possibly returning an awaitable). tests/sources/redis/test_internals.py
checks each of these and compares the result with redis-py's own pipeline, so an upgrade that changes
them fails there, loudly, rather than in production. pyproject.toml pins the range.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rx
from redis.asyncio import Redis

# The redis-py releases this module was checked with (the test asserts the installed one is among them).
CHECKED_VERSIONS = ("8.1.0",)

# Replies parsed between two yields to the event loop.
_YIELD_EVERY = 64


async def send_packed(client: Redis, packed: bytes, commands: Sequence[tuple[str, ...]]) -> list[Any]:
    """Write `packed` (the RESP of `commands`) on one pooled connection and read one reply per command.

    Checked with redis-py 8.1.0. Each reply is shaped by redis-py's callback for its command, or is the
    `ResponseError` of that command's error reply, as `pipeline(transaction=False).execute(raise_on_error=False)`
    gives them. The connection's retry policy applies (a retry disconnects first), as in Pipeline.execute.
    """
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        results: list[Any] = await connection.retry.call_with_retry(
            lambda: _exchange(client, connection, packed, commands),
            lambda _error: connection.disconnect(),
        )
        return results
    finally:
        await pool.release(connection)


async def _exchange(client: Redis, connection: Any, packed: bytes, commands: Sequence[tuple[str, ...]]) -> list[Any]:
    await connection.send_packed_command(packed)
    return await read_replies(client, connection, commands)


async def read_replies(client: Redis, connection: Any, commands: Sequence[tuple[str, ...]]) -> list[Any]:
    """The replies of `commands`, already sent on `connection`, each through its redis-py callback.

    Replies already buffered are parsed without awaiting the socket, so the loop yields by itself every
    `_YIELD_EVERY` replies: a few thousand would otherwise hold every other request for milliseconds.
    """
    read = connection.read_response
    callbacks = client.response_callbacks
    parse: dict[str, Any] = {}  # command name -> its redis-py reply callback, or None
    results: list[Any] = []
    for count, command in enumerate(commands, 1):
        if count % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        name = command[0]
        try:
            reply = await read()
        except rx.ResponseError as err:  # an error reply: that command failed, the others stand
            results.append(err)
            continue
        if name not in parse:
            parse[name] = callbacks.get(name)
        callback = parse[name]
        if callback is not None:
            reply = callback(reply)
            if inspect.isawaitable(reply):
                reply = await reply
        results.append(reply)
    return results
