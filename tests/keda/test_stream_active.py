"""StreamIsActive (KEDA's `external-push` trigger) on the `http` source: pushed by cache updates, with reconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from adapter.children import port_outside_ephemeral
from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc
from tests.fixtures.grpc_servers import Routes, StartAdapter, StartCounts, ref, scaler_stub


def http_config(*ports: int) -> dict[str, Any]:
    return {
        "sources": [
            {
                "name": "proxies",
                "type": "http",
                "proxies": [f"127.0.0.1:{port}" for port in ports],
                "stale_after": 2,
                "reconnect_max": 0.2,
            }
        ],
        "metrics": [{"name": "http-requests-pending", "type": "http", "source": "proxies"}],
    }


WEB = ref(metric="http-requests-pending", selector="route=web")


async def next_result(call: Any, within: float = 3.0) -> bool:
    message = await asyncio.wait_for(call.read(), within)
    assert message is not grpc.aio.EOF  # type: ignore[attr-defined]
    result: bool = message.result
    return result


async def test_activity_changes_are_pushed(start_adapter: StartAdapter, start_counts: StartCounts) -> None:
    routes = Routes("web")
    counts = await start_counts(routes)
    # The cache interval is 60 s and the heartbeat 30 s: only the push path can deliver within the waits below.
    adapter = await start_adapter(**http_config(counts.port), heartbeat_interval=30)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        call = scaler_stub(channel).StreamIsActive(WEB)
        assert await next_result(call) is False  # the state now, at once
        routes.add("web", held=1)
        assert await next_result(call, 10) is True
        routes.add("web", inflight=1, held=-1)  # still one pending: no flip, no message
        routes.add("web", inflight=-1)
        assert await next_result(call, 10) is False
        call.cancel()


async def test_heartbeat_repeats_the_state(start_adapter: StartAdapter, start_counts: StartCounts) -> None:
    routes = Routes("web")
    counts = await start_counts(routes)
    routes.add("web", held=2)
    adapter = await start_adapter(**http_config(counts.port), heartbeat_interval=0.2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        call = scaler_stub(channel).StreamIsActive(WEB)
        assert [await next_result(call) for _ in range(4)] == [True] * 4
        call.cancel()


async def keda_push_client(stub_channel: str, seen: asyncio.Queue[bool], backoff: float) -> None:
    """What KEDA's external-push scaler does: read the stream; on any error wait, then open it again."""
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async with grpc.aio.insecure_channel(stub_channel) as channel:
                stub: pb_grpc.ExternalScalerStub = scaler_stub(channel)
                async for message in stub.StreamIsActive(WEB):
                    seen.put_nowait(message.result)
        await asyncio.sleep(backoff)


@contextlib.asynccontextmanager
async def running(task: asyncio.Task[None]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_client_reconnects_after_the_adapter_restarts(
    start_adapter: StartAdapter, start_counts: StartCounts
) -> None:
    routes = Routes("web")
    counts = await start_counts(routes)
    # Restarted on its port below: outside the ephemeral range, so no outgoing connection takes it meanwhile.
    scaler_port = port_outside_ephemeral()
    adapter = await start_adapter(**http_config(counts.port), grpc_port=scaler_port, heartbeat_interval=30)
    seen: asyncio.Queue[bool] = asyncio.Queue()
    client = asyncio.create_task(keda_push_client(f"127.0.0.1:{adapter.grpc_port}", seen, backoff=0.1))
    async with running(client):
        assert await asyncio.wait_for(seen.get(), 5) is False
        await adapter.stop()
        routes.add("web", held=3)  # changes while no adapter runs
        again = await start_adapter(**http_config(counts.port), grpc_port=adapter.grpc_port, heartbeat_interval=30)
        assert again.grpc_port == adapter.grpc_port
        assert await asyncio.wait_for(seen.get(), 10) is True  # the reopened stream starts with the state now
        routes.add("web", held=-3)
        assert await asyncio.wait_for(seen.get(), 3) is False


async def test_no_value_means_no_message(start_adapter: StartAdapter, start_counts: StartCounts) -> None:
    """While no proxy has reported, the stream stays silent (no made-up 'inactive'); the first count is pushed."""
    port = port_outside_ephemeral()  # the count stream starts there later; nothing listens meanwhile
    adapter = await start_adapter(**http_config(port), heartbeat_interval=0.2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        call = scaler_stub(channel).StreamIsActive(WEB)
        first = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({first}, timeout=2.5)
        assert not done
        routes = Routes("web")
        routes.add("web", held=1)
        await start_counts(routes, port=port)
        assert (await asyncio.wait_for(first, 5)).result is True
        call.cancel()


async def test_the_edge_from_zero_is_pushed_at_once_right_after_another_change(
    start_adapter: StartAdapter, start_counts: StartCounts
) -> None:
    """Inactive -> active never waits for cache.push_interval (30 s here): the stream's first value was read
    with the proxy's first counts, a pushed change (read right after it), and the request comes at once.
    Before, it waited out push_interval after that read (the benchmark's first round: 230-240 ms)."""
    routes = Routes("web")
    counts = await start_counts(routes)
    adapter = await start_adapter(**http_config(counts.port), cache={"push_interval": 30}, heartbeat_interval=60)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        call = scaler_stub(channel).StreamIsActive(WEB)
        assert await next_result(call) is False
        routes.add("web", held=1)
        assert (
            await next_result(call, 10) is True
        )  # far less than push_interval and the heartbeat, even on a loaded machine
        call.cancel()
