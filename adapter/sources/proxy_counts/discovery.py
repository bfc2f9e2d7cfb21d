"""Where the proxy replicas are: every address of a headless Service's DNS name, or a fixed list."""

from __future__ import annotations

import asyncio
import socket

from adapter.config.base import split_address
from adapter.config.http import HTTPSource


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve(dns: str) -> list[str]:
    """Every address (A and AAAA) the name resolves to, as `ip:port`; raises OSError when the lookup fails."""
    host, port = split_address(dns)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({_join(str(info[4][0]), port) for info in infos})


async def replica_addresses(config: HTTPSource) -> list[str]:
    """The replicas to subscribe to now."""
    if config.dns is None:
        return list(config.proxies)
    return await resolve(config.dns)
