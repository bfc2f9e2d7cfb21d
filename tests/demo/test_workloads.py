"""Local workloads and the supervisor with real child processes: scale up and down, readiness, no orphans."""

from __future__ import annotations

import sys

from adapter.demo.processes import Supervisor
from adapter.demo.workloads import LocalWorkload
from tests.demo.fixtures import processes_mentioning, until


async def test_scale_up_counts_ready_replicas_then_down_to_zero(sleeper: LocalWorkload, tag: str) -> None:
    version = sleeper.resource_version
    sleeper.scale(3)
    assert sleeper.spec_replicas == 3
    assert sleeper.resource_version > version
    await until(lambda: sleeper.ready_replicas == 3)
    assert sleeper.status_replicas == 3
    assert len(processes_mentioning(tag)) == 3
    sleeper.scale(0)
    await until(lambda: sleeper.status_replicas == 0 and not processes_mentioning(tag))
    assert sleeper.ready_replicas == 0


async def test_a_crashed_replica_is_replaced(supervisor: Supervisor, tag: str) -> None:
    # Replica 0 exits at once after saying ready; its replacement (index 1) stays.
    code = "import sys, time; print('ready', flush=True); time.sleep(600 if sys.argv[1] != '0' else 0)"
    workload = LocalWorkload("crashy", lambda i: [sys.executable, "-c", code, str(i), tag], supervisor)
    try:
        workload.scale(1)
        await until(lambda: workload.crashes == 1 and workload.ready_replicas == 1)
        assert len(processes_mentioning(tag)) == 1
    finally:
        await workload.close()


async def test_stop_all_ends_the_whole_process_group(supervisor: Supervisor, tag: str) -> None:
    """A child's own child (which the supervisor never saw) goes too: the whole group is signalled."""
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]]); time.sleep(600)"
    )
    await supervisor.start("parent", [sys.executable, "-c", code, tag])
    await until(lambda: len(processes_mentioning(tag)) == 2)
    await supervisor.stop_all()
    await until(lambda: not processes_mentioning(tag))
