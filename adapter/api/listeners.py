"""The two HTTP listeners of `zeroscale serve`: their bounds from `server:`, and the plain metrics port's page.

The process is wired in adapter/serve.py."""

from __future__ import annotations

import time

from adapter.api.http import Limits, Request, Response
from adapter.api.routes import HEALTH_PATHS
from adapter.config.server import ServerConfig
from adapter.telemetry.exposition import Format, negotiate

_NOT_FOUND = Response(404, b"not found\n", "text/plain; charset=utf-8")
_OK = Response(200, b"ok", "text/plain; charset=utf-8")


def listener_limits(server: ServerConfig, listener: str) -> Limits:
    """The bounds of the HTTPS API (`api`) or the plain metrics port (`metrics`), from `server:`."""
    metrics_port = listener == "metrics"
    return Limits(
        max_header_bytes=server.max_header_bytes,
        max_connections=server.metrics_max_connections if metrics_port else server.max_connections,
        max_connections_per_source=(
            server.metrics_max_connections_per_source if metrics_port else server.max_connections_per_source
        ),
        header_timeout=server.header_timeout,
        idle_timeout=server.idle_timeout,
        body_timeout=server.body_timeout,
        response_timeout=server.response_timeout,
        max_body_bytes=server.max_body_bytes,
        max_buffered_bytes=server.max_buffered_bytes,
        connections_key="server.metrics_max_connections" if metrics_port else "server.max_connections",
        per_source_key=(
            "server.metrics_max_connections_per_source" if metrics_port else "server.max_connections_per_source"
        ),
    )


class MetricsPage:
    """The Prometheus page, rendered at most once per `ttl` seconds and shared by every scrape in between; one page
    per format (adapter/telemetry/exposition.py: OpenMetrics or the classic text, as the `Accept` header asks).

    The metrics port answers anyone, and rendering runs on the event loop: over 10,000 series the page is
    about 1 MB and 70 ms of CPU, so each scrape rendering its own would let one peer stall the API.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._pages: dict[Format, tuple[float, Response]] = {}  # at most one per format: negotiate() has two

    async def __call__(self, request: Request) -> Response:
        path = request.target.partition("?")[0]
        if path == "/metrics":
            return self._page(negotiate(request.header("accept")))
        if path in HEALTH_PATHS:
            return _OK
        return _NOT_FOUND

    def _page(self, page: Format) -> Response:
        now = time.monotonic()
        cached = self._pages.get(page)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        response = Response(200, page.render(), page.content_type)
        self._pages[page] = (now, response)
        return response
