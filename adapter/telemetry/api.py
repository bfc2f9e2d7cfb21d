"""Metrics of the external metrics API server: requests, connections, authentication, TLS."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "zeroscale_api_requests_total",
    "Requests answered by the external metrics API, by route kind and HTTP status code",
    ["route", "code"],
)
REQUEST_SECONDS = Histogram(
    "zeroscale_api_request_duration_seconds",
    "Time from a complete request to its answer being written, by route kind and HTTP status code",
    ["route", "code"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CONNECTIONS = Gauge(
    "zeroscale_api_connections",
    "Open client connections, counted from accept (TLS handshakes included), by listener (api, metrics)",
    ["listener"],
)
CONNECTIONS_REFUSED = Counter(
    "zeroscale_api_connections_refused_total",
    "Connections closed at once because a limit of the listener was reached (server.max_connections, "
    "server.metrics_max_connections, or their _per_source shares), by listener",
    ["listener"],
)
TIMEOUTS = Counter(
    "zeroscale_api_timeouts_total",
    "Connections closed because a phase (handshake, head, body, response, idle) overran its deadline",
    ["listener", "phase"],
)
AUTHENTICATIONS = Counter(
    "zeroscale_api_authentications_total",
    "Authentication outcomes, by method (front-proxy, client-certificate, token, none) and result (success, "
    "failure, error, busy: a bearer token answered 429 past server.auth.max_token_reviews)",
    ["method", "result"],
)
AUTHORIZATIONS = Counter(
    "zeroscale_api_authorizations_total",
    "Authorization decisions (allow, deny, error, busy: answered 429 past server.auth.max_access_reviews), and "
    "whether they came from the cache or skipped the review",
    ["decision", "origin"],
)
TLS_RELOADS = Counter(
    "zeroscale_api_tls_reloads_total",
    "Reloads of the serving certificate or the trusted client CAs, by what changed and result",
    ["what", "result"],
)

# Label lookups cost more than the increment; the children are few, so keep them.
_request_children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}


def observe_request(route: str, code: int, seconds: float) -> None:
    children = _request_children.get((route, code))
    if children is None:
        label = str(code)
        children = (REQUESTS.labels(route, label), REQUEST_SECONDS.labels(route, label))
        _request_children[(route, code)] = children
    children[0].inc()
    children[1].observe(seconds)
