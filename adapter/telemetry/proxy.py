"""Metrics of the buffering proxy: what is held, how long cold starts take phase by phase, what failed.

The held and in-flight gauges read the routes' own counters when scraped (see adapter/proxy/counts.py),
and the two per-request series (requests, upstream response time) are plain integers in `HotPathStats`,
read by one collector at scrape time: the hot path pays neither a lock nor a label lookup for them
(docs/architecture.md#hot-plain-counters).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Holds can last as long as a cold start: up to ten minutes.
_HOLD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

HELD_REQUESTS = Gauge("zeroscale_proxy_held_requests", "Requests waiting for a ready endpoint", ["route"])
HELD_BYTES = Gauge("zeroscale_proxy_held_body_bytes", "Request body bytes buffered while not yet upstream", ["route"])
INFLIGHT_REQUESTS = Gauge(
    "zeroscale_proxy_inflight_requests",
    "Requests sent upstream and not yet answered (an upgraded tunnel leaves this count at its 101)",
    ["route"],
)
READY_ENDPOINTS = Gauge("zeroscale_proxy_ready_endpoints", "Endpoints the route may forward to", ["route"])
HOLD_SECONDS = Histogram(
    "zeroscale_proxy_hold_duration_seconds",
    "Time a request waited before it was forwarded or answered",
    ["route"],
    buckets=_HOLD_BUCKETS,
)
COLD_STARTS = Counter(
    "zeroscale_proxy_cold_starts_total", "Times a route went from no ready endpoint to one", ["route"]
)
WAKE_TO_READY_SECONDS = Histogram(
    "zeroscale_proxy_cold_start_wake_to_ready_seconds",
    "Cold-start phase: wake sent (or first request held) to the first ready endpoint",
    ["route"],
    buckets=_HOLD_BUCKETS,
)
READY_TO_FIRST_BYTE_SECONDS = Histogram(
    "zeroscale_proxy_cold_start_ready_to_first_byte_seconds",
    "Cold-start phase: first ready endpoint to the first response byte of a held request",
    ["route"],
    buckets=_HOLD_BUCKETS,
)
WAKES = Counter(
    "zeroscale_proxy_wakes_total",
    "Wake attempts on a scale target, by result (patched, already_awake, conflict, refused, error)",
    ["route", "result"],
)
WAKE_REFUSALS = Counter(
    "zeroscale_proxy_wake_refusals_total",
    "Wake attempts of wake: scale refused (the held requests answered 503), by reason (stopped_by_hand, no_hpa, "
    "ambiguous_hpas, hpas_unreadable); docs/architecture.md#wake",
    ["route", "reason"],
)
HPA_LISTS = Counter(
    "zeroscale_proxy_hpa_lists_total",
    "Lists of a namespace's HPAs sent before wakes (shared by the routes waking together; docs/architecture.md#wake)",
    ["namespace"],
)
HPAS_LISTED = Gauge(
    "zeroscale_proxy_hpas_listed",
    "HPAs the latest list of the namespace answered, in pages of 500: what each list costs (docs/architecture.md#wake)",
    ["namespace"],
)
ERRORS = Counter(
    "zeroscale_proxy_error_responses_total",
    "Requests the proxy answered itself or dropped, by status (404, 413, 431, 499 client gone, 502, 503, 504)",
    ["route", "code"],
)
COLD_CHOICES = Counter(
    "zeroscale_proxy_cold_choices_total",
    "Requests a route's cold-start options decided (waking_page, never_wake, fallback, overflow_waking_page, "
    "overflow_fallback) and wakes of its extra targets (also_wake, also_wake_refused): "
    "docs/architecture.md#cold-start-choices",
    ["route", "choice"],
)
RETRIES = Counter(
    "zeroscale_proxy_retries_total", "Requests moved to another endpoint before any byte reached upstream", ["route"]
)
CONNECTIONS = Gauge("zeroscale_proxy_client_connections", "Open client connections")
REFUSED_CONNECTIONS = Counter(
    "zeroscale_proxy_refused_connections_total", "Client connections closed at once because max_connections was reached"
)
TARGET_REPLICAS = Gauge(
    "zeroscale_proxy_target_replicas",
    "spec.replicas of a route's scale target, read at start, whenever its endpoints change, and when waking it",
    ["route", "namespace", "kind", "name"],
)
ACTIVATOR_LEADER = Gauge(
    "zeroscale_proxy_activator_leader",
    "1 while this replica holds the activator Lease and so writes the activator routes' EndpointSlices",
)
ACTIVATOR_HOLDER_SERVES = Gauge(
    "zeroscale_proxy_activator_holder_serves",
    "1 while the activator Lease's holder writes this activator route's Service as this replica's config says, 0 "
    "while it does not (another installation sharing the Lease, another config, nobody holding it); absent while "
    "unknown",
    ["route"],
)
ACTIVATOR_DIRECT = Gauge(
    "zeroscale_proxy_activator_direct",
    "1 while an activator route's Service lists the workload's pods (the proxy out of the path), 0 while it lists "
    "the proxy's pods, as this replica last wrote or would write it",
    ["route"],
)
SLICE_WRITES = Counter(
    "zeroscale_proxy_activator_slice_writes_total",
    "Writes of an activator route's EndpointSlices by result (created, updated, deleted, conflict, error, refused)",
    ["route", "result"],
)
REFUSED_ENDPOINTS = Counter(
    "zeroscale_proxy_refused_endpoints_total",
    "Endpoint addresses refused (docs/architecture.md#only-ip-endpoints), each counted when it first shows up, by "
    "where it came from (endpointslice, proxy_service, dns) and why (fqdn_slice, not_an_ip, unspecified, loopback, "
    "link_local)",
    ["route", "source", "reason"],
)
SWITCH_SECONDS = Histogram(
    "zeroscale_proxy_activator_switch_seconds",
    "From the event that decided a switch (a pod ready, the target at 0) to the Service's slices written, by where "
    "they now send new connections (pods, proxy)",
    ["route", "to"],
    buckets=_LATENCY_BUCKETS,
)
REFUSED_MESSAGES = Counter(
    "zeroscale_proxy_refused_messages_total",
    "Requests (400) and upstream responses (502) refused for how they are framed or routed, by side and reason",
    ["side", "reason"],
)
LIMIT_HITS = Counter(
    "zeroscale_proxy_limit_hits_total",
    "Requests answered or connections closed because a limit or timeout ran out, by the config key that sets it",
    ["route", "limit"],
)
H2_GOAWAYS = Counter(
    "zeroscale_proxy_http2_goaways_total",
    "HTTP/2 client connections the proxy ended with GOAWAY, by its error code (ENHANCE_YOUR_CALM: a flood or rapid "
    "reset; PROTOCOL_ERROR: a broken frame or a header block over the limits; NO_ERROR: idle or draining)",
    ["code"],
)
OPEN_TUNNELS = Gauge(
    "zeroscale_proxy_open_tunnels", "Upgraded (WebSocket) connections open through the route", ["route"]
)
UPSTREAM_CONNECTS = Counter(
    "zeroscale_proxy_upstream_connections_total", "Upstream connections opened, by result", ["route", "result"]
)
ROUTE_TABLE_FAILURES = Counter(
    "zeroscale_proxy_route_table_failures_total",
    "Route tables that could not be built after a change of the route objects (the table in force stayed; see the log)",
)
ROUTE_STATUS_WRITES = Counter(
    "zeroscale_proxy_route_status_writes_total",
    "Writes of ZeroscaleRoute status by the Lease holder, by result (written; gone: the route was deleted meanwhile; "
    "error: retried after proxy.route_objects.status_interval); docs/architecture.md#route-status",
    ["result"],
)
ROUTE_STATUS_BACKLOG = Gauge(
    "zeroscale_proxy_route_status_backlog",
    "ZeroscaleRoutes whose status is to be looked at (and written if it changed): high for long, the writer falls "
    "behind its routes (or this replica does not hold the Lease); docs/architecture.md#route-status",
)
ROUTE_OBJECTS = Gauge(
    "zeroscale_proxy_route_objects",
    "ZeroscaleRoute objects this replica sees, by state: accepted (served) or refused (its Accepted condition says "
    "why)",
    ["state"],
)


class FastHistogram:
    """Bucket counts as plain integers; observed on the event loop's thread only, read at scrape time."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class HotPathStats:
    """One route's per-request series."""

    __slots__ = ("requests", "upstream_seconds")

    def __init__(self) -> None:
        self.requests = 0
        self.upstream_seconds = FastHistogram(_LATENCY_BUCKETS)


class _HotPathCollector(Collector):
    def __init__(self) -> None:
        self._routes: dict[str, HotPathStats] = {}

    def stats(self, route: str) -> HotPathStats:
        return self._routes.setdefault(route, HotPathStats())

    def forget(self, route: str) -> None:
        self._routes.pop(route, None)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "zeroscale_proxy_requests", "Requests forwarded upstream (retries not counted)", labels=["route"]
        )
        latency = HistogramMetricFamily(
            "zeroscale_proxy_upstream_response_seconds",
            "Request sent upstream to response head received",
            labels=["route"],
        )
        for route, stats in list(self._routes.items()):
            requests.add_metric([route], stats.requests)
            histogram = stats.upstream_seconds
            cumulative, buckets = 0, []
            for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            latency.add_metric([route], buckets, histogram.total)
        yield requests
        yield latency


HOT_PATH = _HotPathCollector()
REGISTRY.register(HOT_PATH)


class _AtZeroCollector(Collector):
    """Seconds each route's upstream had no endpoint at all (its workload at zero: the saving), read at scrape."""

    def __init__(self) -> None:
        self._routes: dict[str, Callable[[], float]] = {}

    def track(self, route: str, seconds: Callable[[], float]) -> None:
        self._routes[route] = seconds

    def forget(self, route: str) -> None:
        self._routes.pop(route, None)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "zeroscale_proxy_target_at_zero_seconds",
            "Time the route's upstream had no endpoint (scaled to zero), as this proxy saw it",
            labels=["route"],
        )
        for route, seconds in list(self._routes.items()):
            family.add_metric([route], seconds())
        yield family


AT_ZERO = _AtZeroCollector()
REGISTRY.register(AT_ZERO)


# Every series above with a `route` label (its first): a route deleted for good leaves none behind, so routes made
# and deleted live (ZeroscaleRoute objects) do not grow the scrape for ever.
_PER_ROUTE: tuple[Counter | Gauge | Histogram, ...] = (
    HELD_REQUESTS,
    HELD_BYTES,
    INFLIGHT_REQUESTS,
    READY_ENDPOINTS,
    HOLD_SECONDS,
    COLD_STARTS,
    WAKE_TO_READY_SECONDS,
    READY_TO_FIRST_BYTE_SECONDS,
    WAKES,
    WAKE_REFUSALS,
    ERRORS,
    RETRIES,
    TARGET_REPLICAS,
    ACTIVATOR_HOLDER_SERVES,
    ACTIVATOR_DIRECT,
    SLICE_WRITES,
    REFUSED_ENDPOINTS,
    SWITCH_SECONDS,
    LIMIT_HITS,
    OPEN_TUNNELS,
    UPSTREAM_CONNECTS,
    COLD_CHOICES,
)


def forget_route(route: str) -> None:
    """Remove every series of `route` (deleted, and its last version closed)."""
    for metric in _PER_ROUTE:
        # prometheus_client lists a metric's children only in this attribute; remove() takes whole label sets.
        for labels in [labels for labels in list(metric._metrics) if labels[0] == route]:
            metric.remove(*labels)
    HOT_PATH.forget(route)
    AT_ZERO.forget(route)
