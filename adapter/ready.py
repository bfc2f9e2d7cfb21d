"""The ready file: how a server started with `--ready-file PATH` says which ports it bound
(docs/architecture.md#no-port-races).

Every listener is configured with a port (0: the kernel picks one); once all are bound, the process writes
one JSON object, listener name -> "host:port", atomically (a temporary file renamed over PATH), so a reader
sees either nothing or the whole document. Whoever started it reads the ports from there: nobody chooses a
port for someone else to bind, so no other process can take it in between.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def announce(stack: contextlib.AsyncExitStack, path: Path, listeners: Mapping[str, str]) -> None:
    """Write `listeners` (name -> "host:port") to `path` all at once, removed again when `stack` unwinds: the
    file names ports only while they are bound (one left from an earlier run would send a starter to ports
    nobody holds)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(dict(listeners), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
    stack.callback(path.unlink, missing_ok=True)


def read_ready_file(path: Path) -> dict[str, int] | None:
    """Listener name -> port, or None while the file is not there yet."""
    try:
        listeners: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return {name: int(where.rpartition(":")[2]) for name, where in listeners.items()}
