"""Loopback helpers for tests that start real servers."""

from __future__ import annotations

import asyncio
import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
    """Block until something accepts TCP connections on host:port, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g}s") from None
            time.sleep(0.05)


async def send_until_answered(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunk: bytes, times: int
) -> bytes:
    """Write `chunk` up to `times` times, stopping at the server's first answer (more bytes would only draw a
    reset) or when it closes; returns what it answered (b"" if nothing)."""
    for _ in range(times):
        try:
            writer.write(chunk)
            return await asyncio.wait_for(reader.read(65536), 0.02)
        except TimeoutError:
            continue
        except ConnectionError:
            break
    return b""
