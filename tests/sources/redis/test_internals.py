"""The redis-py internals the `redis` source relies on (adapter/sources/redis/internals.py), checked against
the installed redis-py and a real redis-server, so an upgrade that changes them fails here, loudly."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import hiredis
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool

from adapter.sources.redis.internals import CHECKED_VERSIONS, send_packed
from tests.fixtures.redis_servers import RedisProcess

RECHECK = "redis-py changed: re-check adapter/sources/redis/internals.py and its CHECKED_VERSIONS"


def test_the_installed_redis_py_is_one_the_fence_was_checked_with() -> None:
    assert version("redis") in CHECKED_VERSIONS, RECHECK


def test_the_non_public_calls_keep_their_shapes() -> None:
    get_connection = inspect.signature(ConnectionPool.get_connection)
    assert all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self"
        for p in get_connection.parameters.values()
    ), RECHECK  # callable without arguments
    for method in (
        ConnectionPool.get_connection,
        ConnectionPool.release,
        AbstractConnection.send_packed_command,
        AbstractConnection.read_response,
        AbstractConnection.disconnect,
    ):
        assert inspect.iscoroutinefunction(method), (method, RECHECK)


async def test_a_packed_write_reads_back_what_redis_pys_pipeline_does(server: RedisProcess) -> None:
    sync = server.client()
    sync.rpush("list", "a", "b")
    sync.xadd("stream", {"f": "v"})
    sync.xgroup_create("stream", "group", id="0")
    # A plain reply, a reply redis-py reshapes with a callback (XINFO GROUPS), and an error reply (LLEN of a stream).
    commands = [("LLEN", "list"), ("XINFO GROUPS", "stream"), ("LLEN", "stream"), ("EXISTS", "missing")]
    packed = b"".join(hiredis.pack_command((*c[0].split(), *c[1:])) for c in commands)  # type: ignore[arg-type]
    client = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    try:
        ours = await send_packed(client, packed, commands)
        async with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            theirs = await pipe.execute(raise_on_error=False)
    finally:
        await client.aclose()
    assert isinstance(ours[2], rx.ResponseError), RECHECK
    assert isinstance(theirs[2], rx.ResponseError), RECHECK
    assert str(ours[2]) == str(theirs[2]), RECHECK
    assert [ours[i] for i in (0, 1, 3)] == [theirs[i] for i in (0, 1, 3)], RECHECK
    assert ours[1][0]["name"] == "group", RECHECK  # the callback ran: a list of dicts, not raw pairs
