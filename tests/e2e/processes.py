"""`zeroscale serve` and `zeroscale proxy` as real processes, with their config written to a YAML file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.netutil import wait_for_port


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
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


class Zeroscale(Managed):
    """One `zeroscale COMMAND --config FILE` process; kill() and start() again keep its config and ports."""

    def __init__(
        self,
        command: str,
        workdir: Path,
        config: dict[str, Any],
        port: int,
        log_level: str = "INFO",
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(workdir / f"{command}.log")
        self.command = command
        self.log_level = log_level
        self.workdir = workdir
        self.port = port
        self.host = host  # where start() waits for `port` to listen
        self.config_file = workdir / f"{command}.yaml"
        self.config_file.write_text(yaml.safe_dump(config), encoding="utf-8")

    def start(self, timeout: float = 30.0) -> Zeroscale:
        command = [sys.executable, "-m", "adapter", "--log-level", self.log_level, self.command]
        self.launch([*command, "--config", str(self.config_file)])
        try:
            wait_for_port(self.port, self.host, timeout=timeout)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"zeroscale {self.command} did not listen:\n{self.log_tail()}") from None
        return self
