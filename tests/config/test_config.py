"""Loading the config: one YAML file, environment overrides, one message per problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter.config import ConfigError, load_config
from adapter.config.base import SecretFile
from adapter.config.kube import SERVICE_ACCOUNT_DIR
from adapter.config.proxy import pod_namespace

SERVICE_ACCOUNT_NAMESPACE = SERVICE_ACCOUNT_DIR / "namespace"

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


def test_a_sidecar_reports_its_route_in_the_pods_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Set from the downward API as the examples do; unset, the service account's namespace file, else `default`
    (this machine is no pod: no such file)."""
    monkeypatch.setenv("ZEROSCALE_PROXY__SIDECAR__UPSTREAM", "127.0.0.1:8080")
    monkeypatch.setenv("ZEROSCALE_PROXY__SIDECAR__ROUTE", "web")
    assert not SERVICE_ACCOUNT_NAMESPACE.exists()
    sidecar = load_config().proxy.sidecar
    assert sidecar is not None
    assert sidecar.as_route().key == "default/web"
    monkeypatch.setenv("ZEROSCALE_PROXY__SIDECAR__NAMESPACE", "shop")
    sidecar = load_config().proxy.sidecar
    assert sidecar is not None
    assert sidecar.as_route().key == "shop/web"
    mounted = tmp_path / "namespace"
    mounted.write_text("team-a\n")
    assert pod_namespace(mounted) == "team-a"
    assert pod_namespace(tmp_path / "absent") == "default"


def test_a_label_pattern_may_name_the_asking_namespace(tmp_path: Path) -> None:
    """`{namespace}` in a pattern is the namespace asking, regex-escaped; the pattern is compiled at load with a
    sample namespace, so a broken one is refused there and not at an HPA's first request. A separator no namespace
    name holds (`_` here) keeps namespace `team` from reading team-a's values."""
    config = load_config(write(tmp_path, GOOD.replace('pattern: "[a-z]+"', 'pattern: "{namespace}_[a-z]+"')))
    label = config.metrics[0].labels["queue"]
    assert label.allows("team-a_orders", "team-a")
    assert not label.allows("team-b_orders", "team-a")
    assert not label.allows("team-a_orders", "team")
    assert label.bound("team-a") == "team\\-a_[a-z]+"
    broken = write(tmp_path, GOOD.replace('pattern: "[a-z]+"', 'pattern: "{namespace}_[a-z"'))
    with pytest.raises(ConfigError, match=r"metrics\[0\]\.labels\.queue\.pattern: .*not a valid regular expression"):
        load_config(broken)


def test_a_bad_override_is_named_as_the_environment_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is right; the variable is wrong: the message says which one to change."""
    monkeypatch.setenv("ZEROSCALE_SERVER__PORT", "abc")
    monkeypatch.setenv("ZEROSCALE_PROXY__SIDECAR", '{"upstream": "127.0.0.1:8081", "protocol": "h3"}')
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, GOOD))
    protocol, port = sorted(caught.value.problems)  # by key path: proxy, then server
    assert "server.port (from the environment, ZEROSCALE_SERVER__PORT): " in port
    assert "proxy.sidecar.protocol (from the environment, ZEROSCALE_PROXY__SIDECAR): " in protocol
