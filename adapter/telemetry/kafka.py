"""Metrics of the `kafka` source: broker requests, group reads, and the per-partition lag it saw."""

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "zeroscale_kafka_requests_total",
    "Requests sent to Kafka brokers, by API (Metadata, FindCoordinator, OffsetFetch, ListOffsets)",
    ["source", "api"],
)
REQUEST_ERRORS = Counter(
    "zeroscale_kafka_request_errors_total",
    "Kafka requests that failed (no connection, timeout, or an error code in the answer)",
    ["source", "api"],
)
GROUP_READ_SECONDS = Histogram(
    "zeroscale_kafka_group_read_duration_seconds",
    "Time to read one round of consumer groups' committed and log offsets",
    ["source"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PARTITION_LAG = Gauge(
    "zeroscale_kafka_partition_lag_messages",
    "Lag of one partition of a consumer group, as counted for the metric (before persistent-lag exclusion)",
    ["source", "group", "topic", "partition"],
)
PARTITION_LAG_DROPPED = Counter(
    "zeroscale_kafka_partition_lag_series_dropped_total",
    "Per-partition lag values not exported because the source reached partition_lag_series_limit",
    ["source"],
)
