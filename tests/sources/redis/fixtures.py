"""Helpers of the Redis source tests: a metric and the query it makes, and the type of the `make_source` fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapter.config.redis import RedisMetric
from adapter.metrics.catalogue import Catalogue
from adapter.sources.base import SourceQuery
from adapter.sources.redis.source import RedisQueues

Make = Callable[..., RedisQueues]


def redis_metric(query: str, **fields: Any) -> RedisMetric:
    """A metric whose `key` (and `group` for group queries) come from the selector by default."""
    labels: dict[str, Any] = {"key": {"pattern": "[a-z0-9.-]+", "required": True}}
    if query in ("stream_pending", "stream_lag", "stream_backlog"):
        labels["group"] = {"pattern": "[a-z0-9-]+", "required": True}
        fields.setdefault("group", "${group}")
    fields.setdefault("labels", labels)
    fields.setdefault("name", f"redis-{query}")
    return RedisMetric(type="redis", source="q", query=query, **fields)


def query_for(metric: RedisMetric, selector: str, namespace: str = "default") -> SourceQuery:
    """The SourceQuery the catalogue makes for the selector of an HPA in `namespace`."""
    _, query = Catalogue([metric]).resolve(metric.name, namespace, selector)
    return query
