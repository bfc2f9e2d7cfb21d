"""`zeroscale serve` in-process on uvloop for the API security cases, and raw clients that misbehave on purpose.

The cases run as plain functions around `uvloop.run`: the server's TLS and transports are uvloop's in
production, and these cases are about exactly those (handshakes, stalled bodies, connection counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import uvloop

from adapter.api.http import Limits
from adapter.api.listeners import listener_limits
from adapter.config import ZeroscaleConfig
from adapter.config.server import ServerConfig
from tests.fixtures.adapter_inprocess import DEMO_METRICS, DEMO_SOURCES, start_serving


def api_limits(**overrides: Any) -> Limits:
    """The API listener's bounds from the default `server:` section, with some changed for a test."""
    return dataclasses.replace(listener_limits(ServerConfig(), "api"), **overrides)


def run(scenario: Coroutine[Any, Any, None], seconds: float = 60) -> None:
    """Run one case on a fresh uvloop loop, bounded in time."""
    uvloop.run(asyncio.wait_for(scenario, seconds))


@dataclass(frozen=True)
class Ports:
    api: int
    metrics: int


@contextlib.asynccontextmanager
async def serving(
    server: dict[str, Any], metrics: list[dict[str, Any]] | None = None, sources: list[dict[str, Any]] | None = None
) -> AsyncIterator[Ports]:
    """`serve()` on loopback with authentication off (allowed there), the demo source and `server:` settings."""
    settings = {
        "bind": "127.0.0.1",
        "metrics_bind": "127.0.0.1",
        "port": 0,
        "metrics_port": 0,
        "auth": {"enabled": False},
    }
    config = ZeroscaleConfig(
        server={**settings, **server},
        sources=DEMO_SOURCES if sources is None else sources,
        metrics=DEMO_METRICS if metrics is None else metrics,
    )
    serving = await start_serving(config, "the server")
    try:
        yield Ports(serving.ports["api"], serving.ports["metrics"])
    finally:
        serving.stop.set()
        assert await asyncio.wait_for(serving.task, 10) == 0


def insecure_client() -> ssl.SSLContext:
    """The demo server's certificate is self-signed: these cases are not about its trust."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def connect(port: int, tls: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=insecure_client() if tls else None)


async def read_all(reader: asyncio.StreamReader, seconds: float = 10) -> bytes:
    """Everything the server sends until it closes (a reset counts as a close); TimeoutError if it does not."""
    received = b""
    async with asyncio.timeout(seconds):
        while True:
            try:
                chunk = await reader.read(65536)
            except (ConnectionError, ssl.SSLError):
                return received
            if not chunk:
                return received
            received += chunk
