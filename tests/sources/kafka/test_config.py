"""The README's kafka example is a valid config, and builds a kafka source."""

from __future__ import annotations

import re
from pathlib import Path

from adapter.config import load_config
from adapter.config.kafka import KafkaMetric, KafkaSource
from adapter.sources import build_source
from adapter.sources.kafka.source import KafkaLag

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("### The `kafka` source", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the README's kafka section has no yaml example"
    return found.group(1)


async def test_readme_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "zeroscale.yaml"
    path.write_text(readme_example())
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
