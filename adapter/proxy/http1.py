"""HTTP/1.1 wire pieces the proxy needs: chunk framing, header value syntax, its own answers (the header
policy is in headers.py)."""

from __future__ import annotations

from http import HTTPStatus

from adapter.config.cold import NO_CONTENT

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


# 204 and 304 carry no Content-Length either (NO_CONTENT: the statuses without content, which the config refuses a
# body for).
NO_LENGTH = frozenset({204, 304})

# Fields, lower-case (name, value), as both protocols' writers take them.
Fields = list[tuple[bytes, bytes]]

# On every answer the proxy gives itself (its errors, a never-wake rule's response, the waking page): no cache keeps
# it (it says how things are now), and no browser reads its body as a type other than the one it names.
OWN_ANSWER_FIELDS: Fields = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]


def own_response(
    code: int, fields: Fields, body: bytes, *, head: bool = False, close: bool = True, http10: bool = False
) -> bytes:
    """An answer of the proxy's own on an HTTP/1.1 connection: `fields` and OWN_ANSWER_FIELDS, the body framed by its
    length. `head`: the answer to a HEAD (the length the body would have, no body); `close`: the connection ends
    after it (else it stays open, said explicitly to an HTTP/1.0 client: `http10`)."""
    if code in NO_CONTENT:
        body = b""  # never written after such a head (the config refuses one too)
    lines = [status_line(code)]
    for name, value in fields:
        lines += (name, b": ", value, b"\r\n")
    for name, value in OWN_ANSWER_FIELDS:
        lines += (name, b": ", value, b"\r\n")
    if code not in NO_LENGTH:
        lines.append(b"content-length: %d\r\n" % len(body))
    if close:
        lines.append(b"connection: close\r\n")
    elif http10:
        lines.append(b"connection: keep-alive\r\n")
    lines.append(b"\r\n")
    if not head:
        lines.append(body)
    return b"".join(lines)


def error_answer(message: str, retry_after: int | None) -> tuple[Fields, bytes]:
    """The fields and body of the proxy's own error: plain text saying what happened, so a person can act on it."""
    fields = [(b"content-type", b"text/plain; charset=utf-8"), (b"x-zeroscale-proxy", b"error")]
    if retry_after is not None:
        fields.append((b"retry-after", b"%d" % retry_after))
    return fields, (message + "\n").encode("utf-8")


def error_response(code: int, message: str, *, retry_after: int | None = None, close: bool = True) -> bytes:
    """A plain-text error from the proxy itself (own_response's HTTP/1.1 form of error_answer)."""
    fields, body = error_answer(message, retry_after)
    return own_response(code, fields, body, close=close)
