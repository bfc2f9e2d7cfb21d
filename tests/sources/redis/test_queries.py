"""Every query kind against a real standalone redis-server."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from typing import Any

import pytest

from adapter.sources.base import SourceError
from adapter.sources.redis.source import RedisQueues
from adapter.telemetry import redis as telemetry
from tests.fixtures.redis_servers import RedisProcess
from tests.sources.redis.fixtures import Make, query_for, redis_metric


async def value(source: RedisQueues, query: str, selector: str, **fields: object) -> Decimal:
    samples = await source.query(query_for(redis_metric(query, **fields), selector))
    return sum((s.value for s in samples), Decimal(0))


@pytest.fixture
def source(server: RedisProcess, make_source: Make) -> RedisQueues:
    return make_source(url=f"redis://{server.address}")


async def test_length_counts_each_type_and_a_missing_key_is_zero(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    r.rpush("jobs", "a", "b", "c")
    r.zadd("delayed", {"x": 1, "y": 2})
    r.sadd("members", "p", "q", "r", "s")
    r.hset("by-id", mapping={"1": "a", "2": "b", "3": "c", "4": "d", "5": "e"})
    r.xadd("events", {"f": "v"})
    assert await value(source, "length", "key=jobs") == 3
    assert await value(source, "length", "key=delayed") == 2
    assert await value(source, "length", "key=members") == 4
    assert await value(source, "length", "key=by-id") == 5
    assert await value(source, "length", "key=events") == 1
    assert await value(source, "length", "key=nothing-here") == 0


async def test_length_sums_the_keys_of_an_in_selector(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    r.rpush("high", *range(4))
    r.rpush("low", *range(6))
    assert await value(source, "length", "key in (high,low,absent)") == 10


async def test_length_follows_a_key_that_changes_type(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    r.rpush("jobs", "a")
    assert await value(source, "length", "key=jobs") == 1
    r.delete("jobs")
    r.zadd("jobs", {"a": 1, "b": 2, "c": 3})
    assert await value(source, "length", "key=jobs") == 3


async def test_length_of_a_string_is_a_wrongtype_error(server: RedisProcess, source: RedisQueues) -> None:
    server.client().set("jobs", "not a queue")
    with pytest.raises(SourceError, match=r"WRONGTYPE.*'jobs'.*string"):
        await value(source, "length", "key=jobs")


async def test_wrongtype_from_redis_names_the_command_and_key(server: RedisProcess, source: RedisQueues) -> None:
    server.client().rpush("events", "a")
    with pytest.raises(SourceError, match=r"WRONGTYPE: XLEN cannot read key 'events'"):
        await value(source, "stream_length", "key=events")


async def test_key_template_adds_a_prefix_labels_cannot_hold(server: RedisProcess, source: RedisQueues) -> None:
    server.client().rpush("rq:queue:default", "a", "b")
    assert await value(source, "length", "key=default", redis_key="rq:queue:${key}") == 2


async def test_a_template_takes_the_asking_namespace(server: RedisProcess, source: RedisQueues) -> None:
    """`${namespace}` is the HPA's namespace, never a selector's value: each team reads its own keys and groups."""
    r = server.client()
    r.rpush("team-a:jobs:default", "a", "b")
    r.rpush("team-b:jobs:default", "a", "b", "c")
    r.xadd("team-a:events", {"f": "v"})
    r.xgroup_create("team-a:events", "team-a.workers", id="0")
    metric = redis_metric("length", redis_key="${namespace}:jobs:${key}")
    assert sum(s.value for s in await source.query(query_for(metric, "key=default", "team-a"))) == 2
    assert sum(s.value for s in await source.query(query_for(metric, "key=default", "team-b"))) == 3
    grouped = redis_metric("stream_lag", redis_key="${namespace}:events", group="${namespace}.workers", labels={})
    [sample] = await source.query(query_for(grouped, "", "team-a"))
    assert (sample.value, dict(sample.labels)) == (Decimal(1), {"key": "team-a:events", "group": "team-a.workers"})


async def test_zset_due_counts_members_due_now(server: RedisProcess, source: RedisQueues) -> None:
    now = time.time()
    r = server.client()
    r.zadd("schedule", {"past-1": now - 100, "past-2": now - 1, "future": now + 3600})
    r.zadd("schedule-ms", {"past": (now - 5) * 1000, "future-1": (now + 60) * 1000, "future-2": (now + 90) * 1000})
    assert await value(source, "zset_due", "key=schedule") == 2
    assert await value(source, "zset_due", "key=schedule-ms", score_unit="milliseconds") == 1
    assert await value(source, "zset_due", "key=missing") == 0


async def test_stream_length_and_missing_stream(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    for i in range(7):
        r.xadd("events", {"n": i})
    assert await value(source, "stream_length", "key=events") == 7
    assert await value(source, "stream_length", "key=no-stream") == 0


def stream_with_group(server: RedisProcess, entries: int, delivered: int, acked: int) -> None:
    """`entries` in stream `events`; group `workers` has been delivered `delivered` and acknowledged `acked`."""
    r = server.client()
    for i in range(entries):
        r.xadd("events", {"n": i})
    r.xgroup_create("events", "workers", id="0")
    if delivered:
        read: Any = r.xreadgroup("workers", "c1", {"events": ">"}, count=delivered)
        ids = [entry_id for _, messages in read for entry_id, _ in messages]
        if acked:
            r.xack("events", "workers", *ids[:acked])


async def test_stream_pending_counts_unacknowledged(server: RedisProcess, source: RedisQueues) -> None:
    stream_with_group(server, entries=10, delivered=6, acked=2)
    assert await value(source, "stream_pending", "key=events,group=workers") == 4


async def test_stream_lag_and_backlog(server: RedisProcess, source: RedisQueues) -> None:
    stream_with_group(server, entries=10, delivered=6, acked=2)
    assert await value(source, "stream_lag", "key=events,group=workers") == 4  # never delivered
    assert await value(source, "stream_backlog", "key=events,group=workers") == 8  # lag 4 + pending 4


@pytest.mark.parametrize("query", ["stream_pending", "stream_lag", "stream_backlog"])
async def test_missing_group_reports_the_stream_length(server: RedisProcess, source: RedisQueues, query: str) -> None:
    stream_with_group(server, entries=5, delivered=0, acked=0)
    assert await value(source, query, "key=events,group=not-created-yet") == 5


@pytest.mark.parametrize("query", ["stream_pending", "stream_lag", "stream_backlog"])
async def test_missing_stream_is_zero(source: RedisQueues, query: str) -> None:
    assert await value(source, query, "key=no-stream,group=workers") == 0


async def test_null_lag_falls_back_to_an_estimate_and_is_counted(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    ids = [r.xadd("events", {"n": i}) for i in range(10)]
    # A group created at an arbitrary ID (not 0, not the first or last entry): Redis cannot know its lag.
    r.xgroup_create("events", "workers", id=ids[3])
    assert r.xinfo_groups("events")[0]["lag"] is None
    counter = telemetry.LAG_ESTIMATED.labels("q", "redis-stream_lag")
    before = counter._value.get()
    lag = await value(source, "stream_lag", "key=events,group=workers")
    # An upper bound of the 6 undelivered entries, never 0 or -1.
    assert 6 <= lag <= 10
    assert counter._value.get() == before + 1


async def test_null_lag_after_deletion_uses_the_read_counter(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    ids = [r.xadd("events", {"n": i}) for i in range(10)]
    r.xgroup_create("events", "workers", id="0")
    r.xreadgroup("workers", "c1", {"events": ">"}, count=4)
    r.xdel("events", ids[6])  # a tombstone between last-delivered and the end makes lag NULL
    assert r.xinfo_groups("events")[0]["lag"] is None
    # 5 entries remain undelivered; the bound is min(XLEN 9, entries-added 10 - entries-read 4) = 6.
    assert await value(source, "stream_lag", "key=events,group=workers") == 6
    assert await value(source, "stream_backlog", "key=events,group=workers") == 10  # + 4 pending


async def test_concurrent_reads_share_one_pipeline(server: RedisProcess, source: RedisQueues) -> None:
    r = server.client()
    for i in range(50):
        r.rpush(f"q{i}", *range(i + 1))
    metric = redis_metric("length")
    queries = [query_for(metric, f"key=q{i}") for i in range(50)]
    await value(source, "length", "key=q0")  # learn nothing but warm the connection
    trips = telemetry.ROUND_TRIPS.labels("q")
    before = trips._value.get()
    results = await asyncio.gather(*(source.query(q) for q in queries))
    assert [int(s[0].value) for s in results] == [i + 1 for i in range(50)]
    assert trips._value.get() == before + 1


async def test_database_index(server: RedisProcess, make_source: Make) -> None:
    server.client(db=3).rpush("jobs", "a", "b", "c")
    server.client(db=0).rpush("jobs", "a")
    source = make_source(name="db3", url=f"redis://{server.address}", db=3)
    assert await value(source, "length", "key=jobs") == 3


async def test_one_failing_command_leaves_the_rest_of_its_batch_standing(
    server: RedisProcess, source: RedisQueues
) -> None:
    r = server.client()
    r.rpush("jobs", 1, 2)
    r.set("text", "x")
    r.hset("table", mapping={"a": 1, "b": 2, "c": 3})
    metric = redis_metric("length")
    results = await asyncio.gather(
        *(source.query(query_for(metric, f"key={k}")) for k in ("jobs", "text", "table", "none")),
        return_exceptions=True,
    )
    jobs, text, table, none = results
    assert isinstance(text, SourceError)
    assert "WRONGTYPE" in str(text)
    assert [int(s[0].value) for s in (jobs, table, none) if not isinstance(s, BaseException)] == [2, 3, 0]


async def test_a_connection_the_server_dropped_is_reopened_within_the_read(
    server: RedisProcess, source: RedisQueues
) -> None:
    r = server.client()
    r.rpush("jobs", 1, 2, 3)
    assert await value(source, "length", "key=jobs") == 3
    r.client_kill_filter(_type="normal", skipme=True)  # every connection of the source
    r.rpush("jobs", 4)
    assert await value(source, "length", "key=jobs") == 4


async def test_a_timed_out_batch_leaves_no_reply_behind_for_the_next(server: RedisProcess, make_source: Make) -> None:
    r = server.client()
    r.rpush("short", 1)
    r.rpush("long", 1, 2, 3)
    source = make_source(url=f"redis://{server.address}", timeout=0.2, max_connections=2)
    assert await value(source, "length", "key=short") == 1
    r.client_pause(400)  # the server holds every reply
    with pytest.raises(SourceError, match="did not answer in time"):
        await value(source, "length", "key=short")
    await asyncio.sleep(0.3)
    assert await value(source, "length", "key=long") == 3  # not the late reply of `short`
