"""`zeroscale serve`'s metrics port answers in the format the scraper asks for: OpenMetrics (exemplars included) on
`Accept: application/openmetrics-text`, the classic text format otherwise; one cached page per format, whatever the
header holds, within `server.max_header_bytes`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from adapter.api.http import HTTPServer
from adapter.api.listeners import MetricsPage, listener_limits
from adapter.config.server import ServerConfig
from adapter.telemetry import api as telemetry
from tests.fixtures.openmetrics import PROMETHEUS_ACCEPT, family_names


@asynccontextmanager
async def metrics_port(**server: int) -> AsyncIterator[int]:
    """The metrics listener as `zeroscale serve` runs it (adapter/serve.py), its page kept for an hour."""
    listener = HTTPServer(MetricsPage(3600.0), listener_limits(ServerConfig(**server), "metrics"), "metrics")
    port = await listener.start("127.0.0.1", 0, None)
    try:
        yield port
    finally:
        await listener.stop()


async def scrape(port: int, accept: bytes | None) -> tuple[str, str]:
    """(the head, the body) of GET /metrics with that Accept header."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        header = b"Accept: " + accept + b"\r\n" if accept is not None else b""
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n" + header + b"\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.decode("latin-1").partition("\r\n\r\n")
    return head, body


async def test_each_format_has_its_own_cached_page() -> None:
    """Interleaved scrapes within the page's lifetime each get their own format (one shared cached page would
    answer the second format with the first's)."""
    telemetry.REQUEST_SECONDS.labels("health", "200").observe(0.003, exemplar={"trace_id": "5" * 32})
    async with metrics_port() as port:
        for _ in range(2):
            await scraped_in_each_format(port)


async def scraped_in_each_format(port: int) -> None:
    head, body = await scrape(port, PROMETHEUS_ACCEPT.encode())
    assert "Content-Type: application/openmetrics-text; version=1.0.0" in head
    assert body.endswith("# EOF\n")
    assert 'trace_id="55555555555555555555555555555555"' in body
    assert "zeroscale_api_request_duration_seconds" in family_names(body)
    head, body = await scrape(port, None)  # as before: the classic format
    assert "Content-Type: text/plain" in head
    assert "zeroscale_api_request_duration_seconds_bucket" in body
    assert "trace_id" not in body
    assert "# EOF" not in body


async def test_odd_accept_headers_get_one_of_the_two_formats() -> None:
    cases = [
        (b"application/openmetrics-text;q=0", "text/plain"),
        (b"application/openmetrics-text;q=nope", "application/openmetrics-text"),
        (b"," * 3000 + b"application/openmetrics-text", "application/openmetrics-text"),
        (b"\xff\xfe;;==,,", "text/plain"),
    ]
    async with metrics_port(max_header_bytes=4096) as port:
        for accept, content_type in cases:
            head, _ = await scrape(port, accept)
            assert head.startswith("HTTP/1.1 200"), (accept[:40], head)
            assert f"Content-Type: {content_type}" in head, (accept[:40], head)
        head, _ = await scrape(port, b"application/openmetrics-text," * 200)  # past max_header_bytes
        assert head.startswith("HTTP/1.1 431"), head
        head, _ = await scrape(port, PROMETHEUS_ACCEPT.encode())  # and the port still answers
        assert head.startswith("HTTP/1.1 200"), head
