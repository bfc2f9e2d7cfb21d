"""Metrics of the series cache and the source queries it makes."""

from prometheus_client import Counter, Gauge, Histogram

SERIES = Gauge("zeroscale_series", "Series (metric, namespace, selector) kept warm in the cache", ["metric"])
SERIES_REFUSED = Counter(
    "zeroscale_series_refused_total",
    "Reads of a new series refused because the cache was full, by the limit reached "
    "(max_series, max_series_per_namespace: keys of the cache section)",
    ["limit"],
)
VALUES_REFUSED = Counter(
    "zeroscale_values_refused_total",
    "Source values not served because the HPA would misread them (NaN, infinite, milli-value beyond int64)",
    ["metric"],
)
SOURCE_QUERY_SECONDS = Histogram(
    "zeroscale_source_query_duration_seconds",
    "Time one source query took, successful or not",
    ["source"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
SOURCE_ERRORS = Counter("zeroscale_source_errors_total", "Source queries that failed", ["source", "metric"])
VALUE_AGE_SECONDS = Histogram(
    "zeroscale_metric_value_age_seconds",
    "Age of the value served for each answered read",
    ["metric"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300),
)
STALE_READS = Counter(
    "zeroscale_stale_reads_total",
    "Reads answered 503 because the last good value was older than max_staleness",
    ["metric"],
)
SERIES_VALUE = Gauge(
    "zeroscale_metric_value",
    "Latest good value of each series kept warm (the queue depth served to the HPA), by metric, namespace, selector",
    ["metric", "namespace", "selector"],
)
LAST_REFRESH = Gauge(
    "zeroscale_metric_last_success_timestamp_seconds",
    "Unix time of the newest successful refresh of any series of the metric",
    ["metric"],
)
EDGE_READS = Counter(
    "zeroscale_cache_edge_reads_total",
    "Pushed changes read at once, within cache.push_interval of the latest, because the series was at rest "
    "(0 or below activation_threshold): the edge from zero; by what the read found (active, or still at_rest: "
    "then the next change waits its push_interval)",
    ["metric", "found"],
)
