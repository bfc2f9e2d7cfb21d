"""Child processes of the demo, each in a process group of its own, so stopping one stops all it started.

The terminal's Ctrl-C reaches only the demo (children are in their own sessions); the demo then stops
its children in reverse start order: SIGTERM to the group, SIGKILL after a grace period. On Linux each
child also gets SIGTERM if the demo dies without cleaning up (PR_SET_PDEATHSIG), so none is orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_STOP_GRACE = 5.0


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def set_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the demo died between fork and prctl: no signal will come
            os._exit(1)

    return set_death_signal


class Supervisor:
    """Starts processes with their output in `log_dir/<name>.log`; `stop_all()` ends every one still running."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._running: list[asyncio.subprocess.Process] = []
        self._preexec = _die_with_parent()

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = False,
    ) -> asyncio.subprocess.Process:
        """`stdout_pipe`: the caller reads stdout (e.g. for a "ready" line); stderr always goes to the log."""
        log = _open_log(self.log_dir, name)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if stdout_pipe else log,
                stderr=log,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        finally:
            os.close(log)  # the child has its own copy
        self._running.append(process)
        return process

    async def stop(self, process: asyncio.subprocess.Process, grace: float = _STOP_GRACE) -> None:
        """SIGTERM to the process group; SIGKILL if it is still there after `grace` seconds."""
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await process.wait()
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        # The leader may be gone while others in its group are not (a shell script's children).
        _signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(ValueError):
            self._running.remove(process)

    async def stop_all(self) -> None:
        """Stop everything, most recently started first (workloads before the servers they use)."""
        while self._running:
            await self.stop(self._running[-1])


def _open_log(log_dir: Path, name: str) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    return os.open(log_dir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
