"""A tiny HTTPS client for tests: raw HTTP/1.1 over asyncio streams, so the server in the same loop keeps running."""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any

import trustme


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def tls_client(
    trust: trustme.CA | None = None,
    cert: trustme.LeafCert | None = None,
    maximum: ssl.TLSVersion | None = None,
) -> ssl.SSLContext:
    """A client context; without `trust` the server's certificate is not checked (it is self-signed)."""
    context = ssl.create_default_context()
    if trust is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        trust.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    if maximum is not None:
        context.maximum_version = maximum
    return context


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)


def request_bytes(path: str, headers: list[tuple[str, str]] | None = None, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def fetch(
    port: int,
    path: str,
    headers: list[tuple[str, str]] | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
) -> Answer:
    """One request on a new TLS connection to 127.0.0.1:port."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context or tls_client(), server_hostname="localhost"
    )
    try:
        writer.write(request_bytes(path, headers, method))
        return await asyncio.wait_for(read_answer(reader), 10)
    finally:
        writer.close()
