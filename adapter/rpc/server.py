"""One way to run a gRPC server: bounds, keepalive, TLS from files, the grpc.health.v1 service, stream slots."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # no stub for it

from adapter.config.grpc import GRPCServerConfig
from adapter.rpc.latency import LatencyInterceptor
from adapter.rpc.tls import ReloadingServerCredentials
from adapter.telemetry import rpc as telemetry

log = logging.getLogger(__name__)

_GRACE_SECONDS = 1.0

# What a servicer method gets as its second argument.
Context = grpc.aio.ServicerContext[Any, Any]


def server_options(config: GRPCServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_client_ping_interval * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_concurrent_streams", config.max_concurrent_streams),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # Two servers on one port would split the clients between them silently.
        ("grpc.so_reuseport", 0),
    ]


class StreamSlots:
    """At most `limit` long-lived streams at once; `async with slots.hold(context, method) as wake:` around each.

    `wake` is the stream's own event: set when it has something to send, and by `end_all` at shutdown,
    after which `closing` is true and the stream returns (its client sees a clean end and reconnects).
    """

    def __init__(self, server: str, limit: int) -> None:
        self._server = server
        self._limit = limit
        self._wakes: set[asyncio.Event] = set()
        self.closing = False

    @property
    def open(self) -> int:
        return len(self._wakes)

    def end_all(self) -> None:
        """End every open stream now: they never finish on their own, so a graceful stop would only wait."""
        self.closing = True
        for wake in self._wakes:
            wake.set()

    def hold(self, context: Context, method: str) -> _Slot:
        return _Slot(self, context, method)


class _Slot:
    def __init__(self, slots: StreamSlots, context: Context, method: str) -> None:
        self._slots = slots
        self._context = context
        self._method = method
        self._wake = asyncio.Event()

    async def __aenter__(self) -> asyncio.Event:
        slots = self._slots
        if slots.closing:
            await self._context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        if slots.open >= slots._limit:
            telemetry.GRPC_STREAMS_REFUSED.labels(slots._server).inc()
            await self._context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this server already serves {slots.open} streams (grpc.{slots._server}.max_streams)",
            )
        slots._wakes.add(self._wake)
        telemetry.GRPC_STREAMS.labels(slots._server, self._method).inc()
        return self._wake

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._slots._wakes.discard(self._wake)
        telemetry.GRPC_STREAMS.labels(self._slots._server, self._method).dec()


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    slots: StreamSlots
    port: int

    async def stop(self, grace: float = _GRACE_SECONDS) -> None:
        """Tell health watchers NOT_SERVING, end the streams (clients reconnect elsewhere), let unary calls finish."""
        await self.health.enter_graceful_shutdown()
        self.slots.end_all()
        await self.server.stop(grace)


async def start_server(
    config: GRPCServerConfig,
    name: str,
    register: Callable[[grpc.aio.Server], None],
    services: list[str],
    slots: StreamSlots,
) -> RunningServer:
    """Listen on `config.bind:port` with the given services added by `register`; raise OSError if that fails."""
    server = grpc.aio.server(options=server_options(config), interceptors=[LatencyInterceptor(name)])
    register(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for service in ["", *services]:
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    try:
        if config.tls is not None:
            port = server.add_secure_port(config.address, ReloadingServerCredentials(config.tls, name).credentials())
        else:
            port = server.add_insecure_port(config.address)
    except RuntimeError as err:  # grpc's way of saying the address is taken or invalid
        raise OSError(f"grpc.{name}: cannot listen on {config.address}: {err}") from None
    await server.start()
    security = "plaintext" if config.tls is None else "TLS"
    if config.tls is not None and config.tls.client_ca_file is not None:
        security = "mutual TLS"
    log.info("grpc.%s listening on %s:%d (%s)", name, config.bind, port, security)
    return RunningServer(server, health, slots, port)
