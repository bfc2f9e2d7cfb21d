"""Loading the config: one YAML file, environment overrides, one message per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter.config import ConfigError, load_config
from adapter.config.base import SecretFile

GOOD = """
sources:
  - {name: demo, type: static, series: [{labels: {queue: a}, value: 3}]}
metrics:
  - name: Queue-Depth
    type: static
    source: demo
    interval: 500ms
    max_staleness: 2m
    labels: {queue: {pattern: "[a-z]+", required: true}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "zeroscale.yaml"
    path.write_text(text)
    return path


def test_a_good_file_loads_with_durations_in_seconds(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    metric = config.metrics[0]
    assert metric.key == "queue-depth"
    assert metric.interval == 0.5
    assert metric.max_staleness == 120.0
    assert config.server.port == 6443
    assert config.server.metrics_port == 8080


def test_the_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSCALE_SERVER__PORT", "7443")
    monkeypatch.setenv("ZEROSCALE_CACHE__MAX_SERIES", "12")
    config = load_config(write(tmp_path, GOOD))
    assert config.server.port == 7443
    assert config.cache.max_series == 12


def test_the_config_file_can_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSCALE_CONFIG", str(write(tmp_path, GOOD)))
    assert load_config().metrics[0].name == "Queue-Depth"


def test_every_problem_is_reported_with_file_and_key_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
server: {port: 99999, prot: 1}
cache: {interval: soon}
sources: [{name: demo, type: statik}]
metrics: [{name: m, type: static, source: demo, labels: {k: {pattern: "("}}}]
""",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    problems = caught.value.problems
    assert all(problem.startswith(f"{path}: ") for problem in problems)
    joined = "\n".join(problems)
    assert "server.port: " in joined
    assert "server.prot: Extra inputs are not permitted" in joined
    assert "cache.interval: " in joined
    assert "not a duration" in joined
    assert "sources[0]: " in joined
    assert "statik" in joined
    assert "metrics[0].labels.k.pattern: " in joined
    assert len(problems) == 5


def test_references_to_undefined_or_mismatched_sources_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
sources: [{name: demo, type: static}]
metrics:
  - {name: a, type: static, source: nowhere}
  - {name: A, type: static, source: demo}
""",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    joined = "\n".join(caught.value.problems)
    assert "metrics[0].source: no source named 'nowhere' is defined (defined: demo)" in joined
    assert "the name 'a' is used 2 times" in joined


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[1, 2]", "the top level must be a mapping"), ("a: [", "not valid YAML")],
)
def test_unreadable_files_say_why(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, text))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.yaml")


def test_secrets_are_read_from_files_and_never_shown(tmp_path: Path) -> None:
    secret_path = tmp_path / "password"
    secret_path.write_text("hunter2\n")
    secret = SecretFile(file=secret_path)
    assert secret.read() == "hunter2"
    assert "hunter2" not in repr(secret)
    assert "hunter2" not in str(secret)


@pytest.mark.parametrize("threshold", [".nan", ".inf", "-.inf"])
def test_an_activation_threshold_is_a_number(tmp_path: Path, threshold: str) -> None:
    """NaN compares with no value: the cache compares each reading with the threshold (is the series at rest?),
    so before, every read of such a metric failed with decimal.InvalidOperation, the HPA's too."""
    path = write(tmp_path, GOOD + f"    activation_threshold: {threshold}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "metrics[0].activation_threshold: " in "\n".join(caught.value.problems)
