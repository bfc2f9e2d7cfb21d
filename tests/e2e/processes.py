"""`zeroscale serve` and `zeroscale proxy` as real processes, with their config written to a YAML file."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from adapter.children import ChildFailed, stop_blocking, wait_ready_blocking
from adapter.ready import read_ready_file


class Managed:
    """A process in its own session with its output in `log_file`; kill() and start again keep its settings."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None

    def launch(self, command: list[str], env: dict[str, str] | None = None) -> None:
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                env=None if env is None else {**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def exited(self) -> bool:
        return self._process is not None and self._process.poll() is not None

    def kill(self) -> None:
        """SIGKILL: no goodbye, as when a node dies."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        process, self._process = self._process, None
        stop_blocking(process, 30)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


class Zeroscale(Managed):
    """One `zeroscale COMMAND --config FILE` process; kill() and start() again keep its config and ports.

    `port`, its main listener's, is one the cluster's objects name (so it stays across restarts): chosen
    outside the ephemeral range (`adapter.children.port_outside_ephemeral`). start() returns once every
    listener is bound (its ready file, docs/architecture.md#no-port-races), and fails at once if it exits."""

    def __init__(self, command: str, workdir: Path, config: dict[str, Any], port: int, log_level: str = "INFO") -> None:
        super().__init__(workdir / f"{command}.log")
        self.command = command
        self.log_level = log_level
        self.workdir = workdir
        self.port = port
        self.config_file = workdir / f"{command}.yaml"
        self.config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.ready_file = workdir / f"{command}.ready.json"
        self.ports: dict[str, int] = {}  # every listener's port, once started

    def start(self, timeout: float = 30.0) -> Zeroscale:
        self.ready_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "adapter", "--log-level", self.log_level, self.command]
        self.launch([*command, "--config", str(self.config_file), "--ready-file", str(self.ready_file)])
        assert self._process is not None
        try:
            ready = functools.partial(read_ready_file, self.ready_file)
            self.ports = wait_ready_blocking(self._process, ready, f"zeroscale {self.command}", self.log_file, timeout)
        except ChildFailed:
            self.stop()
            raise
        return self
