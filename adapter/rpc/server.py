"""One way to run a gRPC server: bounds, keepalive, TLS from files, the grpc.health.v1 service, stream slots."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # no stub for it

from adapter.config.grpc import GRPCServerConfig
from adapter.rpc.connections import ConnectionWatch
from adapter.rpc.guard import CORE_LIMIT_FACTOR, RequestGuard
from adapter.rpc.latency import LatencyInterceptor
from adapter.rpc.tls import ReloadingServerCredentials
from adapter.telemetry import rpc as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)
_throttle = LogThrottle(10.0)

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
        # RequestGuard refuses what is over max_message_bytes, naming the key; gRPC what is far over.
        ("grpc.max_receive_message_length", config.max_message_bytes * CORE_LIMIT_FACTOR),
        # gRPC closes a connection beyond this at accept: counted from accept, handshake or not.
        ("grpc.max_allowed_incoming_connections", config.max_connections),
        # Accept to the client's HTTP/2 SETTINGS: a connection that says nothing is closed.
        ("grpc.server_handshake_timeout_ms", int(config.handshake_timeout * 1000)),
        ("grpc.max_connection_idle_ms", int(config.idle_timeout * 1000)),
        ("grpc.max_connection_age_ms", int(config.max_connection_age * 1000)),
        ("grpc.max_connection_age_grace_ms", int(config.max_connection_age_grace * 1000)),
        # Two servers on one port would split the clients between them silently.
        ("grpc.so_reuseport", 0),
    ]


def peer_address(peer: str) -> str:
    """What one peer is, by address: an IPv4 address, or the /64 of an IPv6 address (one host's usual
    share: anyone holding a /64 can use as many addresses in it as it likes). gRPC says `ipv4:a.b.c.d:port`
    or `ipv6:[addr]:port`; anything else (a Unix socket) is kept whole."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]")
    try:
        if kind == "ipv6":
            address = ipaddress.IPv6Address(host)
            return str(address.ipv4_mapped or ipaddress.IPv6Network((address, 64), strict=False))
        if kind == "ipv4":
            return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    return peer


def _peer(context: Context) -> tuple[str, str | None]:
    """(the peer's address or IPv6 /64, its verified certificate identity or None)."""
    identities = list(context.peer_identities() or ())
    return peer_address(context.peer() or ""), (identities[0].decode("utf-8", "replace") if identities else None)


class StreamSlots:
    """At most `limit` long-lived streams at once; `async with slots.hold(context, method) as wake:` around each.

    One peer (an address, an IPv6 /64, and with client certificates an identity) holds at most `per_peer` of
    them, so no one client can take the room another subscriber needs. `wake` is the stream's own
    event: set when it has something to send, and by `end_all` at shutdown, after which `closing` is
    true and the stream returns (its client sees a clean end and reconnects).
    """

    def __init__(self, server: str, config: GRPCServerConfig) -> None:
        self._server = server
        self._limit = config.max_streams
        self._per_peer = config.max_streams_per_peer
        self._wakes: set[asyncio.Event] = set()
        self._by_peer: dict[tuple[str, str | None], int] = {}
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

    def _refusal(self, peer: tuple[str, str | None]) -> tuple[str, str] | None:
        """(the limit, the message naming its key) when one more stream for `peer` is too many."""
        key = f"grpc.{self._server}"
        if self.open >= self._limit:
            return "max_streams", f"this server already serves {self.open} streams ({key}.max_streams)"
        if self._by_peer.get(peer, 0) >= self._per_peer:
            return (
                "max_streams_per_peer",
                f"{peer[0]} already holds {self._per_peer} streams ({key}.max_streams_per_peer)",
            )
        return None

    def _take(self, peer: tuple[str, str | None], wake: asyncio.Event) -> None:
        self._wakes.add(wake)
        self._by_peer[peer] = self._by_peer.get(peer, 0) + 1

    def _give_back(self, peer: tuple[str, str | None], wake: asyncio.Event) -> None:
        self._wakes.discard(wake)
        left = self._by_peer[peer] - 1
        if left:
            self._by_peer[peer] = left
        else:
            del self._by_peer[peer]


class _Slot:
    def __init__(self, slots: StreamSlots, context: Context, method: str) -> None:
        self._slots = slots
        self._context = context
        self._method = method
        self._wake = asyncio.Event()
        self._peer = _peer(context)

    async def __aenter__(self) -> asyncio.Event:
        slots = self._slots
        if slots.closing:
            await self._context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        refusal = slots._refusal(self._peer)
        if refusal is not None:
            limit, message = refusal
            telemetry.GRPC_STREAMS_REFUSED.labels(slots._server, limit).inc()
            held = _throttle.allow((slots._server, limit))
            if held is not None:
                log.warning("grpc.%s: %s refused: %s%s", slots._server, self._method, message, held_back(held))
            await self._context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        slots._take(self._peer, self._wake)
        telemetry.GRPC_STREAMS.labels(slots._server, self._method).inc()
        return self._wake

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._slots._give_back(self._peer, self._wake)
        telemetry.GRPC_STREAMS.labels(self._slots._server, self._method).dec()


class _Health(health_aio.HealthServicer):  # type: ignore[misc]  # untyped base
    """grpc.health.v1 whose Watch streams take a slot like every other stream, and end at shutdown."""

    def __init__(self, slots: StreamSlots) -> None:
        super().__init__()
        self._slots = slots

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Context) -> None:
        async with self._slots.hold(context, "Health/Watch") as closing:
            watching = asyncio.ensure_future(super().Watch(request, context))
            ending = asyncio.ensure_future(closing.wait())
            try:
                await asyncio.wait([watching, ending], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (watching, ending):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(watching, ending)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    slots: StreamSlots
    port: int
    connections: ConnectionWatch

    async def stop(self, grace: float = _GRACE_SECONDS) -> None:
        """Tell health watchers NOT_SERVING, end the streams (clients reconnect elsewhere), let unary calls finish."""
        await self.health.enter_graceful_shutdown()
        self.slots.end_all()
        await self.server.stop(grace)
        await self.connections.close()


async def start_server(
    config: GRPCServerConfig,
    name: str,
    register: Callable[[grpc.aio.Server], None],
    services: list[str],
    slots: StreamSlots,
    outer: Sequence[grpc.aio.ServerInterceptor] = (),  # type: ignore[type-arg]
) -> RunningServer:
    """Listen on `config.bind:port` with the given services added by `register`; raise OSError if that fails.
    `outer`: interceptors around the others (tracing, which sees the calls they refuse too)."""
    server = grpc.aio.server(
        options=server_options(config),
        interceptors=[
            *outer,
            RequestGuard(name, config.max_message_bytes, config.client_names),
            LatencyInterceptor(name),
        ],
    )
    register(server)
    health = _Health(slots)
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
    if config.verifies_clients:
        security = "mutual TLS: client certificates required"
        if config.client_names:
            security += f" naming {', '.join(sorted(config.client_names))}"
    log.info("grpc.%s listening on %s:%d (%s)", name, config.bind, port, security)
    if config.allow_unauthenticated and not config.verifies_clients:
        log.warning(
            "grpc.%s: peers without a client certificate may call it (allow_unauthenticated: true); "
            "set grpc.%s.tls.client_ca_file and remove allow_unauthenticated to require one",
            name,
            name,
        )
    return RunningServer(server, health, slots, port, ConnectionWatch(name, port, config.max_connections))
