"""Metrics of the gRPC servers (KEDA's external scaler, the proxies' count streams) and of the `http` source."""

from prometheus_client import Counter, Gauge, Histogram

# Servers (label `server`: scaler or counts).
GRPC_REQUESTS = Counter(
    "zeroscale_grpc_requests_total",
    "gRPC calls answered, by method and status code",
    ["server", "method", "code"],
)
GRPC_REQUEST_SECONDS = Histogram(
    "zeroscale_grpc_request_duration_seconds",
    "Time to answer one unary gRPC call (streams are not timed), by method",
    ["server", "method"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
GRPC_STREAMS = Gauge("zeroscale_grpc_streams", "Open server-side gRPC streams", ["server", "method"])
GRPC_STREAMS_REFUSED = Counter(
    "zeroscale_grpc_streams_refused_total",
    "Streams refused with RESOURCE_EXHAUSTED, by the limit that refused them (max_streams or max_streams_per_peer)",
    ["server", "limit"],
)
GRPC_CONNECTIONS = Gauge(
    "zeroscale_grpc_connections",
    "Connections open on the listener, from accept (sampled every 5 s from the kernel's socket table)",
    ["server"],
)
GRPC_CONNECTION_LIMIT = Gauge("zeroscale_grpc_connection_limit", "The listener's max_connections", ["server"])
GRPC_CONNECTIONS_FULL = Counter(
    "zeroscale_grpc_connection_limit_reached_total",
    "Times the open connections reached max_connections (beyond it, gRPC closes new ones at accept)",
    ["server"],
)
GRPC_TLS_RELOADS = Counter(
    "zeroscale_grpc_tls_reloads_total",
    "Certificate files re-read after a change, by outcome",
    ["server", "result"],
)
STREAM_MESSAGES = Counter(
    "zeroscale_grpc_stream_messages_total",
    "Messages sent on server streams, by kind (change or heartbeat)",
    ["server", "method", "kind"],
)

# The `http` source: its subscriptions to the proxies.
PROXY_SUBSCRIPTIONS = Gauge(
    "zeroscale_proxy_subscriptions",
    "Proxy replicas whose count stream is open now",
    ["source"],
)
PROXY_REPLICAS = Gauge(
    "zeroscale_proxy_replicas",
    "Proxy replicas whose counts are in the sum (heard from within stale_after)",
    ["source"],
)
PROXY_LISTED = Gauge(
    "zeroscale_proxy_replicas_listed",
    "Proxy replicas discovery lists now (above max_replicas the metric fails)",
    ["source"],
)
PROXY_RECONNECTS = Counter(
    "zeroscale_proxy_subscription_reconnects_total",
    "Count streams that ended or failed and were opened again",
    ["source"],
)
PROXY_DROPPED = Counter(
    "zeroscale_proxy_replicas_dropped_total",
    "Replicas dropped from the sum: gone from discovery and silent for stale_after",
    ["source"],
)
PROXY_COUNTS_REJECTED = Counter(
    "zeroscale_proxy_counts_rejected_total",
    "Count updates refused because a count was negative or above max_count (the replica fails the metric)",
    ["source"],
)
PROXY_SUBSCRIPTIONS_REFUSED = Counter(
    "zeroscale_proxy_subscriptions_refused_total",
    "Count streams a reachable replica refused or filled with bytes that are no counts (it fails the metric)",
    ["source"],
)
PROXY_COUNTS_COALESCED = Counter(
    "zeroscale_proxy_counts_coalesced_total",
    "Count updates superseded by a newer one from the same replica before they were applied",
    ["source"],
)
PROXY_MESSAGE_LAG_SECONDS = Histogram(
    "zeroscale_proxy_counts_message_lag_seconds",
    "From a proxy sending a count update to the adapter receiving it (wall clocks of two hosts)",
    ["source"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
