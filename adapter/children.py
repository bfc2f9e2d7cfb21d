"""Servers started as child processes, without port races (docs/architecture.md#no-port-races).

- Our own servers (`zeroscale serve|proxy --ready-file`) bind port 0 and write the ports they got
  (adapter/ready.py); `wait_ready` waits for that report.
- A server that cannot report (redis-server, a Kafka broker) is given a port outside the kernel's ephemeral
  range, which no outgoing connection is ever given; if another listener holds it anyway, the child exits
  at once saying so, and `PortAttempts` starts it again on another port.
- Many processes sharing one port (the demo's replicas of one app, like a Service) bind it with
  SO_REUSEPORT beside a socket the starter holds from the start (`shared_port`).

Either way, a child that exits before it is ready is reported at once, with the last lines of its log;
nobody waits out a timeout for a process that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TAIL_LINES = 20
_POLL = 0.02
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PROC_NET = Path("/proc/net")
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp
_LINUX_DEFAULT_RANGE = (32768, 60999)
_FIRST_UNPRIVILEGED = 1024
# What redis-server, Java (Kafka) and Python servers say when another socket holds their port.
_PORT_TAKEN = "address already in use"


class ChildFailed(Exception):
    """A child exited before it was ready, or was not ready in time; the message ends with its log's tail."""

    def __init__(self, message: str, tail: str) -> None:
        super().__init__(f"{message}; the last lines of its log:\n{tail}")
        self.tail = tail

    @property
    def port_taken(self) -> bool:
        return _PORT_TAKEN in self.tail.lower()


def log_tail(log: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"({log} does not exist)"
    return "\n".join(text.splitlines()[-lines:]) or f"({log} is empty)"


def _check(exit_code: int | None, ready: Callable[[], T | None], what: str, log: Path) -> T | None:
    # Exit first: whatever says ready once the child is gone (a file left behind) is not the child.
    if exit_code is not None:
        raise ChildFailed(f"{what} exited with code {exit_code} before it was ready (log: {log})", log_tail(log))
    return ready()


def _late(what: str, log: Path, within: float) -> ChildFailed:
    return ChildFailed(f"{what} is running but was not ready after {within:g}s (log: {log})", log_tail(log))


async def wait_ready(
    process: asyncio.subprocess.Process, ready: Callable[[], T | None], what: str, log: Path, within: float = 60.0
) -> T:
    """`ready()`'s first answer that is not None; ChildFailed as soon as the process exits first."""
    deadline = time.monotonic() + within
    while (answer := _check(process.returncode, ready, what, log)) is None:
        if time.monotonic() > deadline:
            raise _late(what, log, within)
        await asyncio.sleep(_POLL)
    return answer


def wait_ready_blocking(
    process: subprocess.Popen[bytes], ready: Callable[[], T | None], what: str, log: Path, within: float = 60.0
) -> T:
    """`wait_ready` for a `subprocess.Popen` child, in a thread that may block (tests, benchmarks)."""
    deadline = time.monotonic() + within
    while (answer := _check(process.poll(), ready, what, log)) is None:
        if time.monotonic() > deadline:
            raise _late(what, log, within)
        time.sleep(_POLL)
    return answer


def stop_blocking(process: subprocess.Popen[bytes] | None, within: float = 10.0) -> None:
    """SIGTERM (a clean shutdown), SIGKILL if the child is still there after `within` seconds; reaped either
    way. Nothing happens when there is no child or it has exited already; blocking, for tests and benchmarks."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def listening(pid: int, port: int) -> bool | None:
    """A readiness check for servers that cannot report: True once process `pid`, or one it started, listens
    on TCP `port`. Not "the port accepts": when another listener holds the port, a connection would reach it
    while our child is still on its way to exiting (Linux: /proc/net/tcp and the processes' descriptors)."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not sockets:
        return None
    for process in _with_descendants(pid):
        try:
            descriptors = list(Path(f"/proc/{process}/fd").iterdir())
        except OSError:  # gone meanwhile
            continue
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                if os.readlink(descriptor) in sockets:
                    return True
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in (_PROC_NET / "tcp", _PROC_NET / "tcp6"):
        try:
            rows = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:  # no IPv6
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN and int(local.rpartition(":")[2], 16) == port:
                inodes.add(inode)
    return inodes


def _with_descendants(pid: int) -> Iterator[int]:
    """`pid` and every process below it (a script's server, a master's workers)."""
    yield pid
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in children.read_text(encoding="ascii").split():
                yield from _with_descendants(int(child))


def log_says(log: Path, text: str) -> Callable[[], bool | None]:
    """A readiness check for servers that log when they serve: True once `text` is in what `log` gains
    after this call (so a line from an earlier run in the same log does not count)."""
    start = log.stat().st_size if log.exists() else 0
    wanted = text.encode()

    def said() -> bool | None:
        try:
            with log.open("rb") as lines:
                lines.seek(start)
                return True if wanted in lines.read() else None
        except FileNotFoundError:  # not written yet
            return None

    return said


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of binds to port 0)."""
    try:
        low, high = _PORT_RANGE.read_text(encoding="ascii").split()
    except OSError:
        return _LINUX_DEFAULT_RANGE
    return int(low), int(high)


def port_outside_ephemeral(host: str = "127.0.0.1") -> int:
    """A port free right now that no outgoing connection can be given; only another listener can take it
    (then the child says so and exits: see PortAttempts)."""
    low, high = ephemeral_range()
    candidates = [*range(_FIRST_UNPRIVILEGED, low), *range(high + 1, 65536)]
    while True:
        port: int = random.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port


class PortAttempts:
    """Ports to start a server that cannot report on, until one is not taken by another listener:

    attempts = PortAttempts()
    while True:
        port = attempts.port()
        try:
            return start(port)
        except ChildFailed as failed:
            attempts.failed(failed)  # raises it unless the port was taken and attempts are left
    """

    def __init__(self, host: str = "127.0.0.1", attempts: int = 5) -> None:
        self._host = host
        self._left = attempts

    def port(self) -> int:
        self._left -= 1
        return port_outside_ephemeral(self._host)

    def failed(self, failure: ChildFailed) -> None:
        if not failure.port_taken or self._left <= 0:
            raise failure


def on_a_free_port(start: Callable[[int], T], host: str = "127.0.0.1") -> T:
    """`start(port)` (which raises ChildFailed if the child exits before it is ready) on a port outside the
    ephemeral range, again on another while one is taken (`PortAttempts`); blocking, for tests and benchmarks."""
    attempts = PortAttempts(host)
    while True:
        try:
            return start(attempts.port())
        except ChildFailed as failed:
            attempts.failed(failed)


def shared_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a port the kernel picked, with SO_REUSEPORT, and not listening: while the caller
    holds it, the port is refused to outgoing connections and to other users' listeners, connections to it
    are refused until a child listens there (binding it with SO_REUSEPORT), and they are spread over
    every child that does."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, 0))
    return holder
