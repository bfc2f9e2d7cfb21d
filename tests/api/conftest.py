"""Fixtures of the API server tests: the server in-process on uvloop, the Kubernetes stand-in, CAs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import trustme
import uvloop

from adapter.config import ZeroscaleConfig
from tests.api.fixtures import RunningServer, StartServer
from tests.fixtures.adapter_inprocess import DEMO_METRICS, DEMO_SOURCES, start_serving
from tests.fixtures.kube_standin import KubeStandIn


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """The server runs on uvloop in production; its TLS and transports differ from asyncio's, so test on it."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start `serve()` in this loop with the given `server:` section (ports filled in); stopped after the test."""
    running: list[tuple[asyncio.Event, asyncio.Task[int]]] = []

    async def start(server: dict[str, Any]) -> RunningServer:
        settings = {"bind": "127.0.0.1", "metrics_bind": "127.0.0.1", "port": 0, "metrics_port": 0}
        config = ZeroscaleConfig(server={**settings, **server}, sources=DEMO_SOURCES, metrics=DEMO_METRICS)
        serving = await start_serving(config, "the server")
        running.append((serving.stop, serving.task))
        return RunningServer(serving.ports["api"], serving.ports["metrics"], config)

    yield start
    for stop, task in running:
        stop.set()
        assert await asyncio.wait_for(task, 10) in (0, 2)


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    """The stand-in for the Kubernetes API (tests/fixtures/kube_standin.py), on a free loopback port."""
    with KubeStandIn() as standin:
        yield standin


@pytest.fixture(scope="session")
def front_proxy_ca() -> trustme.CA:
    """Signs the aggregator's front-proxy client certificate (requestheader-client-ca-file)."""
    return trustme.CA(organization_name="front-proxy-ca")


@pytest.fixture(scope="session")
def client_ca() -> trustme.CA:
    """Signs ordinary client certificates (client-ca-file)."""
    return trustme.CA(organization_name="client-ca")
