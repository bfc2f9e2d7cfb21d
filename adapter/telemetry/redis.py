"""Metrics of the `redis` source."""

from prometheus_client import Counter, Gauge, Histogram

ROUND_TRIPS = Counter(
    "zeroscale_redis_round_trips_total",
    "Pipelines sent to Redis nodes (one per node per batch of coalesced reads)",
    ["source"],
)
PIPELINE_COMMANDS = Histogram(
    "zeroscale_redis_pipeline_commands",
    "Commands in one coalesced pipeline",
    ["source"],
    buckets=(1, 2, 5, 10, 50, 100, 500, 1000, 5000, 10000),
)
PIPELINE_SECONDS = Histogram(
    "zeroscale_redis_pipeline_duration_seconds",
    "Time one coalesced pipeline took, successful or not",
    ["source"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
)
LAG_ESTIMATED = Counter(
    "zeroscale_redis_stream_lag_estimated_total",
    "Stream lag reads where Redis reported lag as NULL and an upper-bound estimate was served instead",
    ["source", "metric"],
)
NOTIFICATIONS = Counter(
    "zeroscale_redis_keyspace_notifications_total",
    "Keyspace notifications received for watched keys",
    ["source"],
)
NOTIFICATIONS_ACTIVE = Gauge(
    "zeroscale_redis_keyspace_notifications_active",
    "1 when the source refreshes on keyspace notifications, 0 when it only polls",
    ["source"],
)
