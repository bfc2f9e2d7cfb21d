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
    "Lag of one partition of a consumer group as the metric counts it (its offset_reset_policy and "
    "scale_to_zero_on_invalid_offset; before persistent-lag exclusion)",
    ["source", "metric", "group", "topic", "partition"],
)
COMMITTED_OFFSET = Gauge(
    "zeroscale_kafka_committed_offset",
    "The offset a consumer group committed for a partition, as last read (absent: no commit)",
    ["source", "group", "topic", "partition"],
)
LOG_START_OFFSET = Gauge(
    "zeroscale_kafka_log_start_offset",
    "First offset still in a partition's log (retention removed the records below it), as last read",
    ["source", "topic", "partition"],
)
LOG_END_OFFSET = Gauge(
    "zeroscale_kafka_log_end_offset",
    "Offset of the next record produced to a partition (high watermark), as last read",
    ["source", "topic", "partition"],
)
INVALID_OFFSETS = Gauge(
    "zeroscale_kafka_invalid_offset_partitions",
    "Partitions of a group, as last read, where the consumer would reset its position "
    "(offset_reset_policy applies): no commit, a commit below the log start, or beyond the log end",
    ["source", "group", "reason"],
)
PARTITION_LAG_DROPPED = Counter(
    "zeroscale_kafka_partition_lag_series_dropped_total",
    "Per-partition series (offsets, lag) not exported because the source reached partition_lag_series_limit",
    ["source"],
)
