"""The proxy's admin port serves its metrics in the format the scraper asks for: OpenMetrics (with the cold-start
histograms' exemplars) on `Accept: application/openmetrics-text`, the classic text format otherwise; whatever the
header holds, within the port's head limit."""

from __future__ import annotations

import asyncio

import pytest

from adapter.proxy.app import Proxy
from adapter.telemetry import proxy as telemetry
from tests.fixtures.openmetrics import PROMETHEUS_ACCEPT, family_names
from tests.fixtures.proxy import Response, get, request

TRACE = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}


async def scrape(proxy: Proxy, accept: str | None) -> Response:
    return await request(proxy.admin_port, get("/metrics", extra=f"Accept: {accept}\r\n" if accept else ""))


async def test_openmetrics_with_exemplars_for_prometheus_classic_without(proxy: Proxy) -> None:
    telemetry.HOLD_SECONDS.labels("default/admin-exemplar").observe(0.7, exemplar=TRACE)
    openmetrics = await scrape(proxy, PROMETHEUS_ACCEPT)
    assert openmetrics.status == 200
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    page = openmetrics.body.decode()
    assert page.endswith("# EOF\n")
    assert "zeroscale_proxy_hold_duration_seconds" in family_names(page)
    bucket = next(line for line in page.splitlines() if 'le="1.0",route="default/admin-exemplar"' in line)
    assert '# {span_id="b7ad6b7169203331",trace_id="0af7651916cd43dd8448eb211c80319c"} 0.7' in bucket

    classic = await scrape(proxy, None)  # as before: no Accept, the classic format
    assert classic.headers["content-type"].startswith("text/plain")
    assert 'route="default/admin-exemplar"' in classic.body.decode()
    assert "trace_id" not in classic.body.decode()
    assert "# EOF" not in classic.body.decode()


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("application/openmetrics-text;q=0", "text/plain"),
        ("application/openmetrics-text;q=nope", "application/openmetrics-text"),
        ("," * 7000 + "application/openmetrics-text", "application/openmetrics-text"),
        ("\xff\xfe;;==,,\x01", "text/plain"),
    ],
)
async def test_odd_accept_headers_get_one_of_the_two_formats(proxy: Proxy, accept: str, content_type: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.admin_port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: " + accept.encode("latin-1") + b"\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head = answer.partition(b"\r\n\r\n")[0].decode()
    assert head.startswith("HTTP/1.1 200 OK")
    assert f"Content-Type: {content_type}" in head


async def test_an_accept_header_past_the_head_limit_is_closed_unanswered(proxy: Proxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.admin_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nAccept: " + b"application/openmetrics-text," * 400 + b"\r\n\r\n")
    try:
        answer = await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        answer = b""  # reset: closed unanswered too
    writer.close()
    assert answer == b""
    assert (await scrape(proxy, PROMETHEUS_ACCEPT)).status == 200  # and the port still answers
