"""The manual's kafka example is a valid config, and builds a kafka source."""

from __future__ import annotations

from pathlib import Path

from adapter.config import load_config
from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.sources import build_source
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.docs import section, yaml_blocks


def docs_example() -> str:
    return yaml_blocks(section("how-to/kafka.md", "## The `kafka` source"))[0]


async def test_the_docs_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "zeroscale.yaml"
    path.write_text(docs_example())
    config = load_config(path)
    [source] = config.sources
    [metric] = config.metrics
    assert isinstance(source, KafkaSource)
    assert isinstance(metric, KafkaMetric)
    assert source.sasl is not None
    assert source.sasl.mechanism == "SCRAM-SHA-512"
    assert source.offsets_max_age == 5.0
    assert metric.lag_threshold == 100
    assert metric.activation_threshold == 1
    built = build_source(source)
    assert isinstance(built, KafkaLag)
    await built.close()
