"""The `zeroscale` command line: exit codes and messages a user sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def zeroscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapter", *args], capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )


def test_check_accepts_the_local_example_config() -> None:
    result = zeroscale("check", "--config", "deploy/local/zeroscale.yaml")
    assert result.returncode == 0, result.stderr
    assert "config ok: 1 source(s), 1 metric(s)" in result.stdout
    assert "source demo (static): ok" in result.stdout


def test_check_refuses_a_bad_config_with_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {port: -1}\nmetrics: [{name: m, type: static, source: s, interval: x}]\n")
    result = zeroscale("check", "--config", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"config error: {bad}: ") for line in lines)


def test_version_is_printed() -> None:
    result = zeroscale("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("zeroscale ")
