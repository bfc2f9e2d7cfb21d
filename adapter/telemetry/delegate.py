"""Metrics of the calls to the external metrics delegate (`delegate:`, adapter/api/delegate.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REQUESTS = Counter(
    "zeroscale_delegate_requests_total",
    "List calls forwarded to the external metrics delegate, by outcome (ok, 4xx, 5xx, unavailable, "
    "too-large: raise delegate.max_response_bytes, malformed)",
    ["outcome"],
)
DISCOVERIES = Counter(
    "zeroscale_delegate_discoveries_total",
    "Fetches of the delegate's discovery document, by outcome (ok, error, empty: it listed no metric)",
    ["outcome"],
)
METRICS = Gauge(
    "zeroscale_delegate_metrics",
    "Metric names the delegate listed at its last good discovery, those Zeroscale serves itself left out",
)
SATURATED = Counter(
    "zeroscale_delegate_saturated_total",
    "Calls refused because delegate.max_in_flight calls were in flight for all of delegate.timeout, or because "
    "their caller already had a quarter of delegate.max_in_flight in flight (answered 429)",
)
