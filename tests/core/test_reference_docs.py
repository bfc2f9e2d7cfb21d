"""The generated references (scripts/docs/generate.py): up to date, complete, and read from the code they describe.

The configuration reference is the models' (every key described on its field), the CLI reference the parsers', the
metrics reference the registered collectors'; a change to any of them without regenerating fails here.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, Counter
from pydantic import TypeAdapter

import adapter.telemetry.cache
from adapter.cli import SUBCOMMANDS, build_parser
from adapter.config import ZeroscaleConfig
from adapter.config.base import Duration
from adapter.telemetry import tracing
from scripts.docs import cli_reference, config_reference, generate, mdtext, metrics_reference, tracing_reference

ROOT = Path(__file__).resolve().parents[2]
GENERATE = ROOT / "scripts" / "docs" / "generate.py"
_HEADING_ID = re.compile(r"^#+ .* \{#([^}]+)\}$", re.MULTILINE)


def test_the_generated_references_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATE), "--check"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _stale(capsys: pytest.CaptureFixture[str]) -> str:
    assert generate.main(["--check"]) == 1
    return capsys.readouterr().out


def test_a_model_changed_without_regenerating_is_caught(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Grown(ZeroscaleConfig):
        weight: int = 1
        """A new key."""

    assert generate.main(["--check"]) == 0
    monkeypatch.setattr(config_reference, "ZeroscaleConfig", Grown)
    assert "docs/reference/configuration.md" in _stale(capsys)


def test_an_option_added_without_regenerating_is_caught(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def grown() -> argparse.ArgumentParser:
        parser = build_parser()
        parser.add_argument("--colour", help="a new option")
        return parser

    monkeypatch.setattr(cli_reference, "build_parser", grown)
    assert "docs/reference/cli.md" in _stale(capsys)


@pytest.fixture
def new_metric() -> Iterator[Counter]:
    """A metric defined in adapter/telemetry/cache.py since the page was generated."""
    metric = Counter("zeroscale_test_new_total", "A new metric", ["route"])
    adapter.telemetry.cache.NEW_METRIC = metric  # type: ignore[attr-defined]
    yield metric
    del adapter.telemetry.cache.NEW_METRIC  # type: ignore[attr-defined]
    REGISTRY.unregister(metric)


@pytest.mark.usefixtures("new_metric")
def test_a_metric_added_without_regenerating_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    assert "docs/reference/metrics.md" in _stale(capsys)
    assert "zeroscale_test_new_total" in metrics_reference.page()


@pytest.mark.parametrize(
    ("register", "table"),
    [(tracing.span, tracing.SPANS), (tracing.event, tracing.EVENTS), (tracing.attribute, tracing.ATTRIBUTES)],
)
def test_a_trace_name_added_without_regenerating_is_caught(
    register: Callable[[str, str], str], table: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    name = register("zeroscale.test.new", "a name a test registers")
    try:
        assert "docs/reference/tracing.md" in _stale(capsys)
        assert "`zeroscale.test.new` | a name a test registers" in tracing_reference.page()
        with pytest.raises(ValueError, match="registered twice"):
            register(name, "again")
    finally:
        del table[name]


def _properties(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for model, node in [("ZeroscaleConfig", schema), *schema["$defs"].items()]:
        for name, prop in node.get("properties", {}).items():
            yield model, name, prop


def test_every_config_key_has_a_description() -> None:
    """Walks the JSON schema the chart's values.schema.json is made of: every property says what it is."""
    missing = [
        f"{model}.{name}"
        for model, name, prop in _properties(ZeroscaleConfig.model_json_schema())
        if not prop.get("description", "").strip()
    ]
    assert not missing, "give these fields a docstring (adapter/config):\n" + "\n".join(missing)


def test_a_field_without_a_docstring_is_caught() -> None:
    class Undocumented(ZeroscaleConfig):
        weight: int = 1

    assert any(
        name == "weight" and "description" not in prop
        for _, name, prop in _properties(Undocumented.model_json_schema())
    )


def test_every_key_has_its_own_anchor_by_the_rule() -> None:
    page = config_reference.PAGE.read_text(encoding="utf-8")
    ids = _HEADING_ID.findall(page)
    assert len(ids) == len(set(ids))
    assert len(ids) == len(config_reference.config_keys())
    assert "### `proxy.routes[].limits.hold_timeout` {#proxy-routes-limits-hold_timeout}" in page
    assert config_reference.anchor("sources[kafka].sasl.username.file") == "sources-kafka-sasl-username-file"
    assert config_reference.anchor("proxy.routes[].upstream(service).port") == "proxy-routes-upstream-service-port"


@pytest.mark.parametrize("seconds", [0.0, 0.002, 0.01, 0.25, 0.8, 1.5, 5.0, 25.0, 90.0, 120.0, 1800.0, 3600.0])
def test_a_duration_is_written_as_the_config_reads_it(seconds: float) -> None:
    text = config_reference.duration_text(seconds)
    assert TypeAdapter(Duration).validate_python(text) == pytest.approx(seconds)


def test_defaults_are_the_models() -> None:
    """One key of each kind, as the page says it and as the model has it."""
    by_path = {key.path: key for key in config_reference.config_keys()}
    assert by_path["proxy.routes[].limits.hold_timeout"].default == "`2m`"
    assert by_path["proxy.routes[].limits.max_held_bytes"].default == "`67108864` (64 MiB)"
    assert by_path["server.tls.min_version"].default == '`"1.2"`'  # YAML would read 1.2 as a number
    assert by_path["proxy.port"].env == "ZEROSCALE_PROXY__PORT"
    assert by_path["proxy.routes[].name"].env is None  # inside a list: only the whole list, as JSON
    assert by_path["sources[kafka].bootstrap_servers"].default == "none (required)"


def test_every_limit_metric_names_a_key_and_a_metric() -> None:
    """The adapter's limits are listed by hand: each must be a key of the config and a metric of the reference. The
    proxy's are found in its code: each label it counts is a key of `proxy:` or of a route's limits."""
    paths = {key.path for key in config_reference.config_keys()}
    names = {metric.name for metric in metrics_reference.metrics()}
    for path, metric in config_reference.ADAPTER_LIMITS.items():
        assert path in paths
        assert metric.split("{")[0] in names
    assert config_reference.PROXY_LIMIT_HITS in names
    labels = config_reference.proxy_limit_labels()
    assert {"header_timeout", "max_tunnels", "http2.max_stream_resets"} <= labels
    for label in labels:
        assert f"proxy.{label}" in paths or f"proxy.routes[].limits.{label}" in paths, label


def test_every_registered_metric_is_in_the_metrics_reference() -> None:
    """Read from the registry the metrics ports serve, not from the modules the generator walks."""
    page = metrics_reference.PAGE.read_text(encoding="utf-8")
    registered = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in REGISTRY.collect()
        if family.name.startswith("zeroscale_")
    }
    assert registered
    missing = sorted(name for name in registered if f"`{name}`" not in page)
    assert not missing, missing


def test_every_subcommand_is_in_the_cli_reference() -> None:
    page = cli_reference.PAGE.read_text(encoding="utf-8")
    for name, _, _ in SUBCOMMANDS:
        assert f"## `zeroscale {name}` {{#zeroscale-{name}}}" in page


def test_the_cli_reference_does_not_follow_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference.page()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference.page() == narrow


def test_the_chart_readme_describes_each_config_section_by_its_model() -> None:
    readme = (ROOT / "deploy" / "helm" / "zeroscale" / "README.md").read_text(encoding="utf-8")
    for name, field in ZeroscaleConfig.model_fields.items():
        assert f"| `config.{name}` |  | {field.description} " in readme, name
        assert f"(../../../docs/reference/configuration.md#{config_reference.anchor(name)})" in readme, name


def test_a_docstring_citing_a_contributors_page_links_to_it() -> None:
    """The generated pages are read on the site, where a bare `docs/architecture.md#rules` cannot be followed."""
    assert mdtext.inline("see docs/architecture.md#activator, `docs/architecture.md#rules`") == (
        "see [docs/architecture.md#activator](../architecture.md#activator), `docs/architecture.md#rules`"
    )
    bare = re.compile(r"(?<!\[)docs/(?:architecture|protocols)\.md#")
    for page in (config_reference.PAGE, metrics_reference.PAGE):
        assert not bare.search(page.read_text(encoding="utf-8")), page
