"""The local scaler: the scale subresource of the demo's local workloads, on loopback HTTP.

The proxy's `Local` scale target (development mode) points here and wakes a workload with the same
GET and merge-PATCH it sends to Kubernetes (docs/protocols.md#scale-subresource): `spec.replicas` is omitted at 0, a
PATCH carrying a stale `metadata.resourceVersion` is refused with 409 and a `metav1.Status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from adapter.demo.workloads import LocalWorkload

_PATH = re.compile(r"^/apis/apps/v1/namespaces/[^/]+/deployments/([^/?]+)/scale(\?.*)?$")
_MAX_HEAD = 16_384
_MAX_BODY = 65_536
_IDLE_TIMEOUT = 30.0


def scale_object(workload: LocalWorkload) -> dict[str, Any]:
    spec = {"replicas": workload.spec_replicas} if workload.spec_replicas else {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": workload.name, "resourceVersion": str(workload.resource_version)},
        "spec": spec,
        "status": {"replicas": workload.status_replicas, "selector": f"app={workload.name}"},
    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# Told of every accepted PATCH: (workload, replicas before, replicas after).
ScaleHook = Callable[[str, int, int], None]


def answer(
    workloads: Mapping[str, LocalWorkload], method: str, path: str, body: bytes, on_scale: ScaleHook | None = None
) -> tuple[int, dict[str, Any]]:
    """One call: (HTTP status, JSON document)."""
    match = _PATH.match(path)
    workload = workloads.get(match.group(1)) if match else None
    if workload is None:
        return 404, _status(404, "NotFound", f"no local workload at {path}")
    if method == "GET":
        return 200, scale_object(workload)
    if method != "PATCH":
        return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")
    try:
        patch = json.loads(body)
        replicas = int(patch["spec"]["replicas"])
        version = (patch.get("metadata") or {}).get("resourceVersion")
    except (ValueError, KeyError, TypeError):
        return 400, _status(400, "BadRequest", "expected a merge patch setting spec.replicas")
    if replicas < 0:
        return 422, _status(422, "Invalid", "spec.replicas must be >= 0")
    if version is not None and version != str(workload.resource_version):
        message = (
            f'Operation cannot be fulfilled on deployments.apps "{workload.name}": '
            "the object has been modified; please apply your changes to the latest version and try again"
        )
        return 409, _status(409, "Conflict", message)
    before = workload.spec_replicas
    workload.scale(replicas)
    if on_scale is not None:
        on_scale(workload.name, before, replicas)
    return 200, scale_object(workload)


async def start_scaler(
    workloads: Mapping[str, LocalWorkload], on_scale: ScaleHook | None = None, host: str = "127.0.0.1"
) -> asyncio.Server:
    """Serve on a free loopback port (HTTP/1.1, keep-alive); the port is `server.sockets[0].getsockname()[1]`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                async with asyncio.timeout(_IDLE_TIMEOUT):
                    head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                length = int({k.strip().lower(): v for k, v in headers.items()}.get("content-length", "0"))
                if length > _MAX_BODY:
                    break
                body = await reader.readexactly(length) if length else b""
                code, document = answer(workloads, method, path, body, on_scale)
                data = json.dumps(document).encode()
                writer.write(
                    f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, 0, limit=_MAX_HEAD)
