"""Writes the generated reference pages; `--check` fails (exit 1) when one is out of date (tests/core runs it).

- docs/reference/configuration.md: every key of the config file, from the models (scripts/docs/config_reference.py);
- docs/reference/cli.md: every subcommand and option, from the argparse parsers (scripts/docs/cli_reference.py);
- docs/reference/metrics.md: every Prometheus metric, from adapter/telemetry (scripts/docs/metrics_reference.py);
- docs/reference/tracing.md: every span, event and attribute name, from adapter/telemetry/tracing.py's registry
  (scripts/docs/tracing_reference.py);
- deploy/helm/zeroscale/README.md: the chart's values, written by scripts/helm/generate.py's readme_text (that script
  also writes the chart's values.schema.json; both scripts write this README the same, from the one function).

Usage: .venv/bin/python scripts/docs/generate.py [--check]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.docs import cli_reference, config_reference, metrics_reference, tracing_reference  # noqa: E402


def _helm_generator() -> ModuleType:
    """scripts/helm/generate.py, loaded by path: scripts/helm is not a package (it holds a Go module too)."""
    spec = importlib.util.spec_from_file_location("helm_generate", ROOT / "scripts" / "helm" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chart_readme() -> str:
    helm = _helm_generator()
    text: str = helm.readme_text(helm.CHART)
    return text


def outputs() -> dict[Path, Callable[[], str]]:
    """Each generated file and what writes its text."""
    return {
        config_reference.PAGE: config_reference.page,
        cli_reference.PAGE: cli_reference.page,
        metrics_reference.PAGE: metrics_reference.page,
        tracing_reference.PAGE: tracing_reference.page,
        ROOT / "deploy" / "helm" / "zeroscale" / "README.md": _chart_readme,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="fail when a generated file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, write in outputs().items():
        text = write()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}: run .venv/bin/python scripts/docs/generate.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
