"""Local scale targets: a workload is N copies of one command, like a Deployment's pods.

`spec_replicas` is what was asked (by the HPA or the proxy's wake); `status_replicas` counts the
copies running; a copy is ready once it prints `ready` on stdout (it is listening or connected).
Every change bumps `resource_version`, which the local scaler uses as the scale subresource does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from adapter.demo.processes import Supervisor

READY_LINE = b"ready"
_RESTART_DELAY = 1.0


@dataclass
class _Replica:
    index: int
    process: asyncio.subprocess.Process
    ready: bool = False
    stopping: bool = False
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class LocalWorkload:
    def __init__(self, name: str, command: Callable[[int], Sequence[str]], supervisor: Supervisor) -> None:
        """`command(index)` is the argv of replica number `index`."""
        self.name = name
        self._command = command
        self._supervisor = supervisor
        self.spec_replicas = 0
        self.resource_version = 1
        self._replicas: list[_Replica] = []
        self._next_index = 0
        self._reconciling: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self.crashes = 0

    @property
    def status_replicas(self) -> int:
        return sum(1 for r in self._replicas if not r.stopping)

    @property
    def ready_replicas(self) -> int:
        return sum(1 for r in self._replicas if r.ready and not r.stopping)

    def scale(self, replicas: int) -> None:
        """Set the wanted count; processes are started or stopped in the background."""
        if replicas != self.spec_replicas:
            self.spec_replicas = replicas
            self.resource_version += 1
        if self._reconciling is None or self._reconciling.done():
            self._reconciling = asyncio.get_running_loop().create_task(self._reconcile())

    async def _reconcile(self) -> None:
        # Loops until the running count matches, so a scale() during a start is not lost.
        while self.status_replicas != self.spec_replicas:
            if self.status_replicas < self.spec_replicas:
                await self._start_one()
            else:
                newest = max((r for r in self._replicas if not r.stopping), key=lambda r: r.index)
                newest.stopping = True
                self.resource_version += 1
                task = asyncio.get_running_loop().create_task(self._stop(newest))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def _start_one(self) -> None:
        index = self._next_index
        self._next_index += 1
        process = await self._supervisor.start(f"{self.name}-{index}", self._command(index), stdout_pipe=True)
        replica = _Replica(index, process)
        replica.watcher = asyncio.get_running_loop().create_task(self._watch(replica))
        self._replicas.append(replica)
        self.resource_version += 1

    async def _watch(self, replica: _Replica) -> None:
        """Mark the replica ready on its `ready` line; when it exits on its own, replace it (a crash)."""
        stdout = replica.process.stdout
        assert stdout is not None
        async for line in stdout:
            if line.strip() == READY_LINE and not replica.ready:
                replica.ready = True
                self.resource_version += 1
        await replica.process.wait()
        if not replica.stopping and replica in self._replicas:
            self.crashes += 1
            self._replicas.remove(replica)
            self.resource_version += 1
            await asyncio.sleep(_RESTART_DELAY)  # a replica that keeps crashing is restarted at most this often
            self.scale(self.spec_replicas)

    async def _stop(self, replica: _Replica) -> None:
        replica.ready = False
        await self._supervisor.stop(replica.process)
        if replica.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await replica.watcher
        with contextlib.suppress(ValueError):
            self._replicas.remove(replica)

    async def close(self) -> None:
        """Stop every replica (the demo is ending)."""
        if self._reconciling is not None:
            self._reconciling.cancel()
            await asyncio.gather(self._reconciling, return_exceptions=True)
        self.spec_replicas = 0
        for replica in list(self._replicas):
            replica.stopping = True
        await asyncio.gather(*(self._stop(r) for r in list(self._replicas)), *self._stopping, return_exceptions=True)
