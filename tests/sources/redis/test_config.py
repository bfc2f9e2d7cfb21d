"""The `redis` source's configuration: the manual's example loads, and mistakes are refused with a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapter.config import ConfigError, load_config
from adapter.config.redis import RedisMetric, RedisSource
from tests.fixtures.docs import section, yaml_blocks


def docs_example() -> str:
    return yaml_blocks(section("how-to/redis.md", "## The `redis` source"))[0]


def test_the_docs_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "zeroscale.yaml"
    path.write_text(docs_example(), encoding="utf-8")
    config = load_config(path)
    source = config.source_named("jobs")
    assert isinstance(source, RedisSource)
    assert source.mode == "standalone"
    assert source.notifications is True
    metrics = {m.name: m for m in config.metrics}
    assert isinstance(metrics["rq-queue"], RedisMetric)
    assert metrics["rq-queue"].redis_key == "rq:queue:${queue}"
    assert metrics["order-events-backlog"].activation_threshold == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "set exactly one of url"),
        ({"url": "redis://a:6379", "cluster_nodes": ["b:6379"]}, r"given: url, cluster_nodes"),
        ({"url": "http://a:6379"}, "must start with redis:// or rediss://"),
        ({"url": "redis://user:hunter2@a:6379"}, "url must not hold a password"),
        ({"cluster_nodes": ["no-port"]}, "'no-port' is not host:port"),
        ({"cluster_nodes": ["a:6379"], "db": 2}, "only database 0"),
        ({"sentinel": {"addresses": [], "master_name": "m"}}, "needs at least one host:port"),
    ],
)
def test_source_mistakes_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisSource(type="redis", name="q", **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"query": "stream_lag"}, "query stream_lag needs group"),
        ({"query": "length", "group": "g"}, "query length reads no consumer group"),
        ({"query": "length", "redis_key": "q:${queue}"}, "declares no selector label 'queue'"),
        (
            {"query": "length", "redis_key": "q:${queue}", "labels": {"queue": {"pattern": "[a-z]+"}}},
            "mark the label 'queue' required: true",
        ),
        ({"query": "length", "redis_key": "cost$"}, r"write \$\$ for a literal \$"),
        (
            {"query": "length", "redis_key": "${namespace}:q", "labels": {"namespace": {"required": True}}},
            r"uses \$\{namespace\}, the namespace asking: rename the selector label 'namespace'",
        ),
        ({"query": "queue_depth"}, "Input should be 'length'"),
    ],
)
def test_metric_mistakes_are_refused(fields: dict[str, Any], message: str) -> None:
    fields.setdefault("labels", {})
    with pytest.raises(ValueError, match=message):
        RedisMetric(type="redis", name="m", source="q", **fields)


def test_a_metric_on_a_source_of_another_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "zeroscale.yaml"
    path.write_text(
        "sources: [{name: demo, type: static}]\n"
        "metrics: [{name: m, type: redis, source: demo, query: length, redis_key: jobs}]\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="is of type 'static' but the metric is of type 'redis'"):
        load_config(path)
