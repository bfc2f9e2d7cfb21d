"""Queue systems behind one interface (see base.Source); `build_source` makes one from its config."""

from __future__ import annotations

from adapter.config.model import SourceConfig
from adapter.sources.base import Sample, Source, SourceError, SourceQuery


def build_source(config: SourceConfig) -> Source:
    """The client for one configured source. Imports lazily: a Redis-only install never loads aiokafka."""
    match config.type:
        case "static":
            from adapter.sources.static import StaticValues

            return StaticValues(config)
        case "redis":
            from adapter.sources.redis.source import RedisQueues

            return RedisQueues(config)
        case "kafka":
            from adapter.sources.kafka.source import KafkaLag

            return KafkaLag(config)
        case "http":
            from adapter.sources.proxy_counts.source import ProxyCounts

            return ProxyCounts(config)
    raise AssertionError(f"unhandled source type {config.type!r}")  # the config union is exhaustive


__all__ = ["Sample", "Source", "SourceError", "SourceQuery", "build_source"]
