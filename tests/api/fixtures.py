"""What the API server tests import: the server their `start_server` fixture (tests/api/conftest.py) starts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from adapter.config import ZeroscaleConfig


@dataclass
class RunningServer:
    port: int
    metrics_port: int
    config: ZeroscaleConfig


StartServer = Callable[[dict[str, Any]], Awaitable[RunningServer]]
