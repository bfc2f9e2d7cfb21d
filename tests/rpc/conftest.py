"""Fixtures of the gRPC tests: the adapter and count-stream servers in-process on uvloop, KEDA-like clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import grpc
import pytest
import uvloop

from adapter.config import ZeroscaleConfig
from adapter.config.grpc import CountsServerConfig
from adapter.config.http import HTTPMetric, HTTPSource
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.proxy.counts import CountsListener, RouteCounts
from adapter.proxy.counts_stream import CountsServer, start_counts_server
from adapter.rpc.generated import externalscaler_pb2 as pb
from adapter.rpc.generated import externalscaler_pb2_grpc as pb_grpc
from adapter.serve import serve
from adapter.sources.proxy_counts.source import ProxyCounts
from tests.adapter_inprocess import DEMO_METRICS as API_METRICS
from tests.adapter_inprocess import DEMO_SOURCES, wait_listening
from tests.netutil import free_port


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Both servers run on uvloop in production; so do their tests."""
    return {"uvloop": uvloop.new_event_loop}


DEMO_METRICS = [*API_METRICS, {"name": "team-depth", "type": "static", "source": "demo", "namespaces": ["team"]}]


@dataclass
class Adapter:
    port: int
    grpc_port: int
    config: ZeroscaleConfig
    stop_event: asyncio.Event
    task: asyncio.Task[int]

    async def stop(self) -> None:
        self.stop_event.set()
        assert await asyncio.wait_for(self.task, 10) == 0


StartAdapter = Callable[..., Awaitable[Adapter]]


def adapter_config(grpc_port: int, sources: list[Any], metrics: list[Any], **scaler: Any) -> ZeroscaleConfig:
    return ZeroscaleConfig(
        server={
            "bind": "127.0.0.1",
            "metrics_bind": "127.0.0.1",
            "port": free_port(),
            "metrics_port": free_port(),
            "auth": {"enabled": False},
        },
        grpc={"scaler": {"enabled": True, "bind": "127.0.0.1", "port": grpc_port, **scaler}},
        # Long enough that only pushes (never the interval) can explain a quick change.
        cache={"interval": 60},
        sources=sources,
        metrics=metrics,
    )


@pytest.fixture
async def start_adapter() -> AsyncIterator[StartAdapter]:
    """Run `serve()` (metrics API + KEDA scaler) in this loop; `adapter.stop()` ends one early, the rest end after."""
    running: list[Adapter] = []

    async def start(
        sources: list[Any] = DEMO_SOURCES, metrics: list[Any] = DEMO_METRICS, grpc_port: int = 0, **scaler: Any
    ) -> Adapter:
        config = adapter_config(grpc_port or free_port(), sources, metrics, **scaler)
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop))
        port = config.grpc.scaler.port
        await wait_listening(task, port, "the adapter's gRPC server")
        adapter = Adapter(config.server.port, port, config, stop, task)
        running.append(adapter)
        return adapter

    yield start
    for adapter in running:
        if not adapter.task.done():
            await adapter.stop()


@pytest.fixture
async def scaler_channel(start_adapter: StartAdapter) -> AsyncIterator[pb_grpc.ExternalScalerStub]:
    adapter = await start_adapter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        yield scaler_stub(channel)


def scaler_stub(channel: grpc.aio.Channel) -> pb_grpc.ExternalScalerStub:
    return pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]  # protoc's stub is untyped


def ref(metric: str = "demo-queue-depth", selector: str = "queue=orders", **extra: str) -> pb.ScaledObjectRef:
    """A ScaledObjectRef as KEDA sends it: the trigger's metadata, scalerAddress included."""
    metadata = {"scalerAddress": "zeroscale:9443", "metricName": metric, "labelSelector": selector, **extra}
    return pb.ScaledObjectRef(name="worker", namespace="default", scalerMetadata=metadata)


class Routes:
    """The proxy's own per-route counters (RouteCounts), driven by the test instead of by requests."""

    def __init__(self, *names: str) -> None:
        self.counts = {name: RouteCounts(name) for name in names}

    def add(self, route: str, held: int = 0, inflight: int = 0) -> None:
        self.counts[route].add(held, inflight)

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        stops = [counts.subscribe(listener) for counts in self.counts.values()]

        def unsubscribe() -> None:
            for stop in stops:
                stop()

        return unsubscribe


StartCounts = Callable[..., Awaitable[CountsServer]]


@pytest.fixture
async def start_counts() -> AsyncIterator[StartCounts]:
    """A pending-count stream server over the given routes' counters, on a free loopback port."""
    servers: list[CountsServer] = []

    async def start(routes: Routes, port: int = 0, **settings: Any) -> CountsServer:
        settings = {"heartbeat_interval": 0.2, **settings}
        config = CountsServerConfig(enabled=True, bind="127.0.0.1", port=port or free_port(), **settings)
        server = await start_counts_server(config, routes.subscribe)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


MakeCache = Callable[..., Awaitable[MetricCache]]


@pytest.fixture
async def make_cache() -> AsyncIterator[MakeCache]:
    """A cache over one `http` source; its interval is long, so only pushes can refresh it quickly."""
    made: list[tuple[MetricCache, ProxyCounts]] = []

    async def make(name: str, count: str = "pending", **source: Any) -> MetricCache:
        config = HTTPSource(**{"name": name, "type": "http", "stale_after": 0.6, "reconnect_max": 0.2, **source})
        metrics = [
            HTTPMetric(name="http-requests-pending", type="http", source=name, count=count),
        ]
        proxies = ProxyCounts(config)
        cache = MetricCache(Catalogue(metrics), {name: proxies}, CacheConfig(interval=60, max_staleness=120))
        made.append((cache, proxies))
        return cache

    yield make
    for cache, proxies in made:
        await cache.close()
        await proxies.close()


async def value(cache: MetricCache, route: str = "web") -> Decimal:
    return (await cache.read("http-requests-pending", "default", f"route={route}")).value


async def eventually(
    cache: MetricCache, expected: int, within: float = 3.0, route: str = "web", *, through_errors: bool = False
) -> float:
    """Wait until the series reads `expected`; return how long that took.

    An error on the way fails at once, unless `through_errors` (the series starts out failing).
    """
    started = time.monotonic()
    got: Decimal | str = "no value"
    while True:
        try:
            got = await value(cache, route)
        except MetricUnavailable as err:
            if not through_errors:
                raise
            got = f"error: {err}"
        if got == expected:
            break
        if time.monotonic() - started > within:
            raise AssertionError(f"still {got}, not {expected}, after {within}s")
        await asyncio.sleep(0.005)
    return time.monotonic() - started
