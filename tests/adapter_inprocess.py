"""The adapter's `serve()` started in the test's own event loop: demo sources and metrics, waiting until it listens."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

DEMO_SOURCES: list[dict[str, Any]] = [
    {
        "name": "demo",
        "type": "static",
        "series": [{"labels": {"queue": "orders"}, "value": 1500}, {"labels": {"queue": "emails"}, "value": 0.5}],
    }
]
DEMO_METRICS: list[dict[str, Any]] = [
    {"name": "Demo-Queue-Depth", "type": "static", "source": "demo", "labels": {"queue": {"pattern": "[a-z]+"}}}
]


async def wait_listening(task: asyncio.Task[int], port: int, what: str) -> None:
    """Return once 127.0.0.1:port accepts connections; raise if `task` (the server) ends first or 10 s pass."""
    for _ in range(200):
        if task.done():
            raise RuntimeError(f"{what} stopped at start with code {task.result()}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on port {port} within 10 s")
