"""The API's HTTP behaviour in-process: Status errors, staleness 503, keep-alive, pipelining and every bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from adapter.api.http import HTTPServer
from adapter.api.routes import ExternalMetricsAPI
from adapter.config.server import CacheConfig
from adapter.config.static import StaticMetric
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.sources.base import Sample, Source, SourceError, SourceQuery
from adapter.telemetry import api as telemetry
from tests.fixtures.httpclient import Answer, read_answer, request_bytes
from tests.security.api_serving import api_limits

LIST = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/jobs"


class ScriptedSource(Source):
    """A test source: answers `value`, or fails with `failure`."""

    def __init__(self) -> None:
        super().__init__()
        self.value = Decimal(7)
        self.failure: str | None = None

    async def query(self, query: SourceQuery) -> list[Sample]:
        if self.failure is not None:
            raise SourceError(self.failure)
        return [Sample(self.value)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Served:
    def __init__(self, port: int, source: ScriptedSource, clock: Clock) -> None:
        self.port = port
        self.source = source
        self.clock = clock

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def get(self, path: str, headers: list[tuple[str, str]] | None = None, method: str = "GET") -> Answer:
        reader, writer = await self.connect()
        try:
            writer.write(request_bytes(path, headers, method))
            return await asyncio.wait_for(read_answer(reader), 10)
        finally:
            writer.close()


LIMITS = api_limits(max_header_bytes=2048, max_connections=8, header_timeout=0.5, idle_timeout=0.5, body_timeout=0.5)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    source, clock = ScriptedSource(), Clock()
    metric = StaticMetric.model_validate({"name": "Jobs", "type": "static", "source": "q"})
    settings = CacheConfig.model_validate({"interval": 3600, "max_staleness": 60})
    cache = MetricCache(Catalogue([metric]), {"q": source}, settings, clock=clock)
    server = HTTPServer(ExternalMetricsAPI(cache, None, None), LIMITS)
    port = await server.start("127.0.0.1", 0, None)
    yield Served(port, source, clock)
    await server.stop()
    await cache.close()


async def test_source_failure_past_staleness_is_a_503_status(served: Served) -> None:
    first = await served.get(LIST)
    assert first.status == 200
    assert first.json()["items"][0]["value"] == "7"
    served.source.failure = "broker down"
    served.clock.now += 30  # failing, but the last good value is younger than max_staleness
    still = await served.get(LIST)
    assert (still.status, still.json()["items"][0]["value"]) == (200, "7")
    served.clock.now += 31
    stale = await served.get(LIST)
    assert stale.status == 503
    assert stale.headers["content-type"] == "application/json"
    status = stale.json()
    assert {k: status[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "ServiceUnavailable",
        "code": 503,
    }
    assert "broker down" in status["message"]


async def test_protobuf_accept_still_gets_json(served: Served) -> None:
    answer = await served.get(LIST, [("Accept", "application/vnd.kubernetes.protobuf, */*")])
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"


AGGREGATED_DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@pytest.mark.parametrize("path", ["/apis", "/apis/external.metrics.k8s.io", "/apis/external.metrics.k8s.io/v1beta1"])
async def test_aggregated_discovery_is_not_acceptable_so_the_aggregator_falls_back(served: Served, path: str) -> None:
    """The v1.37 aggregator asks /apis for an APIGroupDiscoveryList; a 406 (not a plain APIGroupList it
    would have to second-guess) is what a server without aggregated discovery answers."""
    refused = await served.get(path, [("Accept", AGGREGATED_DISCOVERY)])
    assert refused.status == 406
    status = refused.json()
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotAcceptable", 406)
    assert status["message"] == "only the following media types are accepted: application/json"
    # Its fallback, and kubectl's own list of choices, get the plain document.
    for accept in ("application/json", f"{AGGREGATED_DISCOVERY},application/json", "*/*", ""):
        answer = await served.get(path, [("Accept", accept)] if accept else None)
        assert answer.status == 200, accept
        assert answer.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    "accept",
    [
        "application/json;as=Table;v=v1;g=meta.k8s.io",  # kubectl get's table
        "application/json;stream=watch",
        "application/json;q=0",
        "application/vnd.kubernetes.protobuf",
        "application/yaml",
    ],
)
async def test_representations_it_cannot_write_are_not_acceptable(served: Served, accept: str) -> None:
    assert (await served.get(LIST, [("Accept", accept)])).status == 406


async def test_unknown_path_and_method(served: Served) -> None:
    missing = await served.get("/apis/other.group/v1")
    assert (missing.status, missing.json()["reason"]) == (404, "NotFound")
    posted = await served.get(LIST, method="POST")
    assert (posted.status, posted.json()["reason"]) == (405, "MethodNotAllowed")


async def test_keep_alive_and_pipelining_answer_in_order(served: Served) -> None:
    reader, writer = await served.connect()
    try:
        writer.write(request_bytes(LIST) + request_bytes("/healthz") + request_bytes("/apis/nothing"))
        answers = [await asyncio.wait_for(read_answer(reader), 10) for _ in range(3)]
        assert [a.status for a in answers] == [200, 200, 404]
        writer.write(request_bytes("/livez"))
        assert (await asyncio.wait_for(read_answer(reader), 10)).body == b"ok"
    finally:
        writer.close()


async def test_oversized_head_is_431_and_closed(served: Served) -> None:
    reader, writer = await served.connect()
    try:
        writer.write(request_bytes(LIST, [("X-Padding", "a" * 4096)]))
        answer = await asyncio.wait_for(read_answer(reader), 10)
        assert answer.status == 431
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_idle_and_slow_head_connections_are_closed(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(request_bytes("/healthz"))
    await asyncio.wait_for(read_answer(reader), 10)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after idle_timeout
    writer.close()

    reader, writer = await served.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_connections_beyond_the_limit_are_refused(served: Served) -> None:
    refused_before = telemetry.CONNECTIONS_REFUSED.labels("api")._value.get()
    held = [await served.connect() for _ in range(LIMITS.max_connections)]
    for reader, writer in held:  # each is admitted and answered
        writer.write(request_bytes("/healthz"))
        assert (await asyncio.wait_for(read_answer(reader), 10)).status == 200
    reader, writer = await served.connect()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert telemetry.CONNECTIONS_REFUSED.labels("api")._value.get() == refused_before + 1
    for _, held_writer in held:
        held_writer.close()


async def test_connection_close_and_head(served: Served) -> None:
    reader, writer = await served.connect()
    try:
        writer.write(request_bytes("/healthz", method="HEAD") + request_bytes("/livez", [("Connection", "close")]))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Length: 2\r\n" in head  # the length of the body a GET would get, and no body
        closing = await asyncio.wait_for(read_answer(reader), 10)
        assert (closing.status, closing.body, closing.headers["connection"]) == (200, b"ok", "close")
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
