"""The proxy's pending-count stream: whole snapshots, sent at once, coalesced under bursts, heartbeats when idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from tests.fixtures.grpc_servers import Routes, StartCounts


@pytest.fixture
async def watch() -> AsyncIterator[Any]:
    """Open a Watch stream on a port; every stream is closed after the test."""
    channels: list[grpc.aio.Channel] = []

    async def open_stream(port: int) -> Any:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        stub = pb_grpc.PendingCountsStub(channel)  # type: ignore[no-untyped-call]
        return stub.Watch(pb.WatchRequest())

    yield open_stream
    for channel in channels:
        await channel.close(None)


def counts(message: pb.CountsUpdate) -> dict[str, tuple[int, int]]:
    return {route.route: (route.held, route.inflight) for route in message.routes}


async def test_snapshot_then_changes_then_heartbeats(start_counts: StartCounts, watch: Any) -> None:
    routes = Routes("web", "api")
    routes.add("api", inflight=4)
    # Longer than a loaded machine stalls the loop between the first message and the change: a heartbeat
    # would come between them.
    server = await start_counts(routes, heartbeat_interval=3)
    stream = await watch(server.port)
    first = await asyncio.wait_for(stream.read(), 5)
    assert counts(first) == {"default/api": (0, 4)}  # every busy route by its key, at once; web is idle
    assert (first.sequence, first.heartbeat) == (0, False)
    assert abs(first.sent_unix_nanos - time.time_ns()) < 5e9
    routes.add("web", held=1)
    change = await asyncio.wait_for(stream.read(), 10)
    assert counts(change) == {"default/web": (1, 0), "default/api": (0, 4)}
    assert (change.sequence, change.heartbeat) == (1, False)
    started = time.monotonic()
    idle = await asyncio.wait_for(stream.read(), 10)
    assert idle.heartbeat
    assert idle.sequence == 2
    assert counts(idle) == counts(change)
    assert time.monotonic() - started > 1


async def test_bursts_are_coalesced(start_counts: StartCounts, watch: Any) -> None:
    routes = Routes("web")
    # A window longer than a loaded machine stalls the loop: with 50 ms, the 40 changes spanned as many windows as
    # the stalls between them made.
    server = await start_counts(routes, coalesce=2.0, heartbeat_interval=30)
    stream = await watch(server.port)
    await asyncio.wait_for(stream.read(), 5)
    for _ in range(20):  # 40 changes over about 100 ms
        routes.add("web", held=1)
        routes.add("web", inflight=1)
        await asyncio.sleep(0.005)
    messages: list[pb.CountsUpdate] = []
    while not messages or counts(messages[-1]) != {"default/web": (20, 20)}:
        messages.append(await asyncio.wait_for(stream.read(), 10))
    assert len(messages) <= 6, f"{len(messages)} messages for 40 changes in ~100 ms with coalesce 2 s"


async def test_a_change_after_a_quiet_spell_goes_out_at_once(start_counts: StartCounts, watch: Any) -> None:
    """Not an edge from zero (held 1 to 2, which the edge rule would send at once too): the quiet spell alone. The
    window (4 s) is longer than a loaded machine stalls the loop, so "at once" is told from "at the window's end"
    by 2 s."""
    routes = Routes("web")
    routes.add("web", held=1)
    server = await start_counts(routes, coalesce=4.0, heartbeat_interval=30)
    stream = await watch(server.port)
    await asyncio.wait_for(stream.read(), 5)
    routes.add("web", inflight=1)  # the hub's first send: opens a window
    assert counts(await asyncio.wait_for(stream.read(), 10)) == {"default/web": (1, 1)}
    await asyncio.sleep(4.5)  # longer than the coalescing window since the last send
    routes.add("web", held=1)
    started = time.monotonic()
    message = await asyncio.wait_for(stream.read(), 10)
    assert counts(message) == {"default/web": (2, 1)}
    assert time.monotonic() - started < 2  # not held back for the 4 s window


async def test_the_edge_from_zero_goes_out_at_once_within_the_window(start_counts: StartCounts, watch: Any) -> None:
    """A route lifted from the 0 last sent is not coalesced with the change sent just before (5 s window here,
    opened by the first change after the quiet start); before, it waited for the window's end. Changes that lift
    nothing from 0 keep their coalescing, and so does a second edge within one window, of any route; the next
    window's first edge goes at once again."""
    routes = Routes("web", "api", "db")
    server = await start_counts(routes, coalesce=5.0, heartbeat_interval=30)
    stream = await watch(server.port)
    await asyncio.wait_for(stream.read(), 5)
    routes.add("api", held=1)  # after a quiet spell: at once, and opens the window
    assert counts(await asyncio.wait_for(stream.read(), 2.5)) == {"default/api": (1, 0)}
    routes.add("web", held=1)  # lifted from 0: at once
    message = await asyncio.wait_for(stream.read(), 2.5)  # far less than the window, even on a loaded machine
    assert counts(message) == {"default/web": (1, 0), "default/api": (1, 0)}
    started = time.monotonic()
    routes.add("db", held=1)  # the window's second edge: with the coalesced message at its end
    routes.add("api", held=1)  # lifts nothing from 0
    message = await asyncio.wait_for(stream.read(), 10)
    assert counts(message) == {"default/web": (1, 0), "default/api": (2, 0), "default/db": (1, 0)}
    assert time.monotonic() - started > 4  # the window's end (5 s after the early message)
    routes.add("web", held=-1)  # lifts nothing: coalesced
    routes.add("web", inflight=1)  # the first edge of the window that message opened: at once, with it
    message = await asyncio.wait_for(stream.read(), 2.5)
    assert counts(message) == {"default/web": (0, 1), "default/api": (2, 0), "default/db": (1, 0)}


async def test_edges_of_many_routes_within_one_window_make_two_messages(start_counts: StartCounts, watch: Any) -> None:
    """Clients lifting one idle route after another: each message is a snapshot of every route, and one early
    message per route made a message of all the routes per request (40 lifted in 0.4 s here: 40 messages;
    with 1,000 routes, 0.6 ms each per stream). The first lift goes out at once (a quiet spell before it) and
    opens a window (5 s here); the window's first edge goes out at once too, the rest with the coalesced message
    at the window's end."""
    names = [f"r{index}" for index in range(40)]
    routes = Routes(*names)
    server = await start_counts(routes, coalesce=5.0, heartbeat_interval=30)
    stream = await watch(server.port)
    await asyncio.wait_for(stream.read(), 5)
    messages: list[pb.CountsUpdate] = []

    async def read_all() -> None:
        while True:
            messages.append(await stream.read())

    reader = asyncio.create_task(read_all())
    try:
        for name in names:
            routes.add(name, held=1)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        # The window's edge (two if the machine was so slow that the window ended before the first).
        assert len(messages) <= 2, [counts(message) for message in messages]
        lifted = {f"default/{name}": (1, 0) for name in names}
        async with asyncio.timeout(10):
            while not messages or counts(messages[-1]) != lifted:  # noqa: ASYNC110 - a list
                await asyncio.sleep(0.05)
        assert len(messages) <= 3
    finally:
        reader.cancel()


async def test_a_route_back_at_zero_leaves_the_snapshot_and_its_next_lift_is_an_edge(
    start_counts: StartCounts, watch: Any
) -> None:
    """A proxy creates and deletes routes live (up to 10,000), and the adapter refuses a snapshot of more than its
    max_routes (1,000): a route holding and forwarding nothing is no entry at all, which the adapter reads as 0.
    Gone from the snapshot, its next lift is still an edge from zero, sent at once (5 s window here)."""
    routes = Routes("web")
    server = await start_counts(routes, coalesce=5.0, heartbeat_interval=30)
    stream = await watch(server.port)
    assert counts(await asyncio.wait_for(stream.read(), 5)) == {}  # its first report, at 0, is no entry
    routes.add("web", held=1)  # lifted from 0: at once
    assert counts(await asyncio.wait_for(stream.read(), 2.5)) == {"default/web": (1, 0)}
    started = time.monotonic()
    routes.add("web", held=-1)  # back to 0: no edge, coalesced to the window's end
    assert counts(await asyncio.wait_for(stream.read(), 10)) == {}
    assert time.monotonic() - started > 4
    routes.add("web", held=1)  # the first edge of the window that message opened: at once
    assert counts(await asyncio.wait_for(stream.read(), 2.5)) == {"default/web": (1, 0)}


async def test_idle_routes_cost_the_snapshot_nothing(start_counts: StartCounts, watch: Any) -> None:
    names = [f"r{index}" for index in range(2000)]
    routes = Routes(*names)
    routes.add("r7", inflight=2)
    server = await start_counts(routes, heartbeat_interval=30)
    stream = await watch(server.port)
    assert counts(await asyncio.wait_for(stream.read(), 5)) == {"default/r7": (0, 2)}


async def test_health_service(start_counts: StartCounts) -> None:
    server = await start_counts(Routes("web"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service="zeroscale.proxy.v1.PendingCounts"))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await health.Check(health_pb2.HealthCheckRequest(service="nothing.Here"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_stop_ends_streams_cleanly(start_counts: StartCounts, watch: Any) -> None:
    server = await start_counts(Routes("web"), heartbeat_interval=10)
    stream = await watch(server.port)
    await asyncio.wait_for(stream.read(), 5)
    started = time.monotonic()
    await server.running.stop(grace=30)
    assert time.monotonic() - started < 10  # no waiting out the grace period (30 s) for streams that never end
    await server.stop()
    assert await asyncio.wait_for(stream.read(), 2) is grpc.aio.EOF  # type: ignore[attr-defined]
