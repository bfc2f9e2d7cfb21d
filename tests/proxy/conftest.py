"""Fixtures for the proxy tests: a real upstream, the proxy in-process on uvloop, a raw HTTP client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httptools
import pytest
import uvloop

from adapter.config.proxy import ProxyConfig
from adapter.kube.client import KubeClient
from adapter.proxy.server import ProxyServer
from tests.kube_standin import KubeStandIn
from tests.proxy.upstream_app import Upstream


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    # The proxy runs on uvloop in production; its tests run there too.
    return {"uvloop": uvloop.new_event_loop}


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class _ResponseReader:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.done = False
        self.head_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


async def read_response(reader: asyncio.StreamReader, *, head_only: bool = False) -> Response:
    """One response from `reader` (close-delimited bodies end at EOF)."""
    state = _ResponseReader()
    while not state.done and not (head_only and state.head_done):
        data = await reader.read(65536)
        if not data:
            if state.head_done:
                break
            raise ConnectionError("closed before a response")
        state.parser.feed_data(data)
    return Response(state.parser.get_status_code(), state.headers, b"".join(state.body))


class Responses:
    """Successive responses on one connection (pipelined answers may share a read), with one parser."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.done: list[Response] = []
        self._state = _ResponseReader()
        self._state.on_message_complete = self._complete  # type: ignore[method-assign]
        self._state.parser = httptools.HttpResponseParser(self._state)

    def _complete(self) -> None:
        state = self._state
        self.done.append(Response(state.parser.get_status_code(), state.headers, b"".join(state.body)))
        state.headers, state.body = {}, []

    async def next(self, within: float = 5.0) -> Response:
        async with asyncio.timeout(within):
            while not self.done:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("closed before a response")
                self._state.parser.feed_data(data)
        return self.done.pop(0)


async def request(port: int, raw: bytes, *, within: float = 10.0) -> Response:
    """Send raw request bytes on a new connection and read one response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        async with asyncio.timeout(within):
            return await read_response(reader)
    finally:
        writer.close()


async def until(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for a condition on the proxy's state (it changes from callbacks, so it is polled)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - no event to wait on: the state is plain attributes
            await asyncio.sleep(0.005)


def get(path: str = "/echo", host: str = "app.example", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def post(body: bytes, path: str = "/echo", host: str = "app.example", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def route(name: str, address: str, **overrides: Any) -> dict[str, Any]:
    """A route to `address` with probe readiness and no waking, plus overrides (limits merge)."""
    limits = overrides.pop("limits", {})
    return {
        "name": name,
        "upstream": {"address": address},
        "wake": "none",
        "readiness": "probe",
        "probe_interval": 0.005,
        "limits": {"hold_timeout": 10, **limits},
        **overrides,
    }


@asynccontextmanager
async def running_proxy(routes: list[dict[str, Any]], **settings: Any) -> AsyncIterator[ProxyServer]:
    kube = settings.pop("kube", None)
    config = ProxyConfig(bind="127.0.0.1", port=0, admin_bind="127.0.0.1", admin_port=0, routes=routes, **settings)
    server = ProxyServer(config, kube=kube)
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown(grace=0)


@pytest.fixture
async def kube_client(kube: KubeStandIn) -> AsyncIterator[KubeClient]:
    """A client of the test module's `kube` stand-in."""
    client = KubeClient.from_config(kube.client_config())
    yield client
    await client.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    app = await Upstream().start()
    yield app
    await app.stop()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[ProxyServer]:
    async with running_proxy([route("app", upstream.address)]) as server:
        yield server


@pytest.fixture(autouse=True)
async def no_loop_errors() -> AsyncIterator[None]:
    """Fail a test when a callback raised: asyncio only logs exceptions from protocol callbacks and tasks."""
    loop = asyncio.get_running_loop()
    problems: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: problems.append(context))
    yield
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert not problems, [str(p.get("exception") or p.get("message")) for p in problems]
