"""One subscription: the pending-count stream of one proxy replica, kept open and reopened when it breaks.

Each message is a whole snapshot of the replica's routes, so nothing is lost when messages are
coalesced or a stream is reopened. A stream that stays silent past `stale_after` (no update and no
heartbeat) is abandoned and reopened; the source decides separately when the replica's counts expire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from adapter.config.http import HTTPSource
from adapter.rpc.generated import proxycounts_pb2 as pb
from adapter.rpc.generated import proxycounts_pb2_grpc as pb_grpc
from adapter.telemetry import rpc as telemetry

log = logging.getLogger(__name__)

# (held, inflight) per route
Counts = dict[str, tuple[int, int]]


class Replica:
    """What one proxy replica last said, and when (monotonic)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.counts: Counts = {}
        self.heard_at: float | None = None
        self.connected = False

    def live(self, now: float, stale_after: float) -> bool:
        return self.heard_at is not None and now - self.heard_at <= stale_after


# Called with the replica and the routes whose counts changed (all of them on its first message).
UpdateListener = Callable[[Replica, set[str]], None]


def _file_bytes(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def _channel(address: str, config: HTTPSource) -> grpc.aio.Channel:
    options: list[tuple[str, int | str]] = [
        ("grpc.keepalive_time_ms", int(config.keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", int(config.reconnect_min * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(config.reconnect_min * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(config.reconnect_max * 1000)),
    ]
    tls = config.tls
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    if config.tls_server_name is not None:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    # Read at each (re)connect, so rotated files are picked up by the next stream.
    credentials = grpc.ssl_channel_credentials(
        _file_bytes(tls.ca_file), _file_bytes(tls.key_file), _file_bytes(tls.cert_file)
    )
    return grpc.aio.secure_channel(address, credentials, options=options)


class Subscription:
    def __init__(self, replica: Replica, config: HTTPSource, on_update: UpdateListener) -> None:
        self.replica = replica
        self._config = config
        self._on_update = on_update
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"counts from {self.replica.address}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        config = self._config
        address = self.replica.address
        backoff = config.reconnect_min
        first = True
        while True:
            if not first:
                telemetry.PROXY_RECONNECTS.labels(config.name).inc()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, config.reconnect_max)
            first = False
            try:
                channel = _channel(address, config)
            except OSError as err:
                log.warning("http source %s: cannot read TLS files for %s: %s", config.name, address, err)
                continue
            try:
                if await self._stream(channel):
                    backoff = config.reconnect_min  # it worked for a while: start over with short waits
            except grpc.aio.AioRpcError as err:
                log.debug("http source %s: stream from %s ended: %s", config.name, address, err.code().name)
            except TimeoutError:
                log.info("http source %s: %s silent for %gs; reconnecting", config.name, address, config.stale_after)
            finally:
                self._set_connected(False)
                await channel.close(grace=None)

    async def _stream(self, channel: grpc.aio.Channel) -> bool:
        """Read one stream until it ends; True if at least one message came."""
        stub = pb_grpc.PendingCountsStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Watch(pb.WatchRequest())
        received = False
        while True:
            async with asyncio.timeout(self._config.stale_after):
                message = await call.read()
            if message is grpc.aio.EOF:  # type: ignore[attr-defined]  # missing from the stubs
                return received
            if not received:
                received = True
                self._set_connected(True)
            self._apply(message)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.replica.connected:
            self.replica.connected = connected
            telemetry.PROXY_SUBSCRIPTIONS.labels(self._config.name).inc(1 if connected else -1)

    def _apply(self, message: pb.CountsUpdate) -> None:
        replica = self.replica
        if message.sent_unix_nanos > 0:
            lag = (time.time_ns() - message.sent_unix_nanos) / 1e9
            telemetry.PROXY_MESSAGE_LAG_SECONDS.labels(self._config.name).observe(max(lag, 0.0))
        counts = {route.route: (route.held, route.inflight) for route in message.routes}
        was_live = replica.live(time.monotonic(), self._config.stale_after)
        previous = replica.counts if was_live else {}
        changed = {route for route in counts.keys() | previous.keys() if counts.get(route) != previous.get(route)}
        replica.counts = counts
        replica.heard_at = time.monotonic()
        if changed or not was_live:
            self._on_update(replica, changed or set(counts))
