"""A stand-in proxy replica for the count stream: a real gRPC server whose Watch sends what a test scripts.

The real proxy (adapter/proxy/counts_stream.py) only ever sends sane counts at a sane pace; these replicas
are the broken or hostile ones the adapter must not believe: late, lying, flooding.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc

# Given a send function, sends the replica's messages; the stream stays open (with heartbeats) after it returns.
Script = Callable[["Sender"], Any]


class Sender:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.CountsUpdate] = asyncio.Queue()
        self.last = pb.CountsUpdate()
        self.sent = 0

    def send(self, route: str = "default/web", held: int = 0, inflight: int = 0) -> None:
        """One snapshot of one route, keyed as a proxy keys it (`<namespace>/<name>`: route=web read from default)."""
        self.sent += 1
        self.last = pb.CountsUpdate(
            routes=[pb.RouteCounts(route=route, held=held, inflight=inflight)], sequence=self.sent
        )
        self.queue.put_nowait(self.last)


class _Scripted(pb_grpc.PendingCountsServicer):
    def __init__(self, script: Script, heartbeat: float) -> None:
        self._script = script
        self._heartbeat = heartbeat

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.CountsUpdate]:
        sender = Sender()
        running = asyncio.ensure_future(self._script(sender))
        try:
            while True:
                try:
                    async with asyncio.timeout(self._heartbeat):
                        message = await sender.queue.get()
                except TimeoutError:
                    if sender.sent == 0:
                        continue  # nothing said yet: a late replica stays silent
                    message = pb.CountsUpdate(routes=sender.last.routes, heartbeat=True)
                yield message
        finally:
            running.cancel()


async def start_scripted_replica(script: Script, heartbeat: float = 0.1) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_PendingCountsServicer_to_server(_Scripted(script, heartbeat), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def start_garbage_replica() -> tuple[grpc.aio.Server, int]:
    """A replica whose Watch answers bytes that are no CountsUpdate."""

    async def watch(request: Any, context: Any) -> AsyncIterator[bytes]:
        while True:
            yield b"\xff\xff\xff"
            await asyncio.sleep(0.1)

    handler = grpc.method_handlers_generic_handler(
        "zeroscale.proxy.v1.PendingCounts",
        {"Watch": grpc.unary_stream_rpc_method_handler(watch, response_serializer=bytes)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port
