"""HTTP/1.1 wire pieces the proxy needs: chunk framing, header value syntax, its own answers (the header
policy is in headers.py)."""

from __future__ import annotations

from http import HTTPStatus

CHUNK_END = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# status_line's cache: the hot path reads it first, so a known code costs no call
# (docs/architecture.md#hot-skipped-calls).
STATUS_LINES: dict[int, bytes] = {}


def status_line(code: int) -> bytes:
    """`HTTP/1.1 <code> <reason>\\r\\n`, cached: the proxy answers with few codes and upstreams with few more."""
    line = STATUS_LINES.get(code)
    if line is None:
        try:
            reason = HTTPStatus(code).phrase
        except ValueError:
            reason = "Status"
        line = STATUS_LINES[code] = f"HTTP/1.1 {code} {reason}\r\n".encode("ascii")
    return line


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


_OWS = b" \t"


def transfer_codings(value: bytes) -> list[bytes]:
    """The codings of a Transfer-Encoding value, lower-cased, parameters kept (so `chunked;x` is not chunked)."""
    return [coding.strip(_OWS).lower() for coding in value.split(b",") if coding.strip(_OWS)]


# Upgrade tokens naming HTTP itself (RFC 9110 7.8: protocol-name "/" version). A tunnel to one would carry
# requests the proxy never parses: not routed, not counted as pending, under no per-request limit or deadline
# (the "h2c smuggling" of reverse proxies). RFC 9113 3.1 retired the h2c upgrade anyway.
_HTTP_PROTOCOLS = frozenset({b"h2c", b"h2", b"http"})


def tunnel_protocols(value: bytes) -> bytes:
    """An Upgrade request value without the protocols that are HTTP itself (b"" when none is left)."""
    kept = [
        protocol.strip(_OWS)
        for protocol in value.split(b",")
        if protocol.strip(_OWS) and protocol.strip(_OWS).split(b"/", 1)[0].lower() not in _HTTP_PROTOCOLS
    ]
    return b", ".join(kept)


def trim(value: bytes) -> bytes:
    """A header value without the optional whitespace RFC 9110 5.5 allows around it."""
    return value.strip(_OWS)


def error_response(code: int, message: str, *, retry_after: int | None = None, close: bool = True) -> bytes:
    """A plain-text answer from the proxy itself; the body says what happened so a person can act on it."""
    body = (message + "\n").encode("utf-8")
    head = [
        status_line(code),
        b"Content-Type: text/plain; charset=utf-8\r\n",
        b"Content-Length: %d\r\n" % len(body),
        b"X-Zeroscale-Proxy: error\r\n",
    ]
    if retry_after is not None:
        head.append(b"Retry-After: %d\r\n" % retry_after)
    if close:
        head.append(b"Connection: close\r\n")
    head.append(b"\r\n")
    head.append(body)
    return b"".join(head)
