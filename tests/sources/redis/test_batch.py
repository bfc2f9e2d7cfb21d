"""The Redis batcher against a real redis-server: big batches are split and never hold the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from adapter.sources.redis.batch import MAX_PIPELINE_COMMANDS, Batcher, Command, _pack
from adapter.sources.redis.internals import read_replies
from tests.fixtures.redis_servers import RedisProcess

KEYS = 2000


@pytest.fixture
async def client(server: RedisProcess) -> AsyncIterator[Redis]:
    sync = server.client()
    pipe = sync.pipeline(transaction=False)
    for i in range(KEYS):
        pipe.rpush(f"b{i}", *range(i % 7 + 1))
    pipe.execute()
    redis = Redis.from_url(f"redis://{server.address}")
    yield redis
    await redis.aclose()


def lengths() -> list[Command]:
    return [("LLEN", f"b{i}") for i in range(KEYS)]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"source": "batch", **labels}) or 0.0


async def test_a_batch_larger_than_the_cap_goes_as_several_pipelines(client: Redis) -> None:
    batcher = Batcher(client, "batch", "test", window=0.001, timeout=10, max_in_flight=2)
    trips = sample("zeroscale_redis_round_trips_total")
    within_cap = sample("zeroscale_redis_pipeline_commands_bucket", le=str(float(MAX_PIPELINE_COMMANDS)))
    pipelines = sample("zeroscale_redis_pipeline_commands_count")
    try:
        table = await batcher.run(lengths())
    finally:
        await batcher.close()
    assert [table[c] for c in lengths()] == [i % 7 + 1 for i in range(KEYS)]
    expected = -(-KEYS // MAX_PIPELINE_COMMANDS)
    assert sample("zeroscale_redis_round_trips_total") - trips == expected
    assert sample("zeroscale_redis_pipeline_commands_count") - pipelines == expected
    # Every pipeline within the cap.
    assert (
        sample("zeroscale_redis_pipeline_commands_bucket", le=str(float(MAX_PIPELINE_COMMANDS))) - within_cap
        == expected
    )


async def test_parsing_buffered_replies_gives_the_loop_back(client: Redis) -> None:
    """Replies already read from the socket are parsed without awaiting it: the parse must yield by itself."""
    commands = lengths()
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(_pack(commands))
        # Let every reply arrive into the connection's buffer (if some had not, the parse would
        # await the socket, and the loop would run more often: the assertion below only gets easier).
        await asyncio.sleep(0.5)
        parse = asyncio.create_task(read_replies(client, connection, commands))
        turns = 0
        while not parse.done():
            turns += 1  # another callback of the loop ran while the parse was under way
            await asyncio.sleep(0)
        results = await parse
    finally:
        await pool.release(connection)
    assert results == [i % 7 + 1 for i in range(KEYS)]
    assert turns >= KEYS // 64 // 2
