"""HTTP/2 message pieces the proxy needs, as pure functions: a stream's request read for routing, the head an
upstream of either protocol is sent, a response carried to a client of the other protocol, gRPC's own answers.

A message crosses between the protocols in its forwarded form only: HTTP/1.1 head bytes (headers.py's policy) or a
list of HTTP/2 header fields (pseudo-headers first). Converting one into the other is a translation of forms the
policy already produced, never a second policy: what headers.py drops for HTTP/1.1 is dropped here for HTTP/2.
"""

from __future__ import annotations

import re

from adapter.proxy.headers import (
    FRAMING,
    HOP_BY_HOP,
    IDEMPOTENT,
    REPLACED,
    MessageRefused,
    forwarded_response_head,
    valid_host,
)
from adapter.proxy.http1 import NO_LENGTH, OWN_ANSWER_FIELDS, error_answer
from adapter.proxy.http1 import Fields as Fields  # the name the other modules import from here

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Connection-specific fields an HTTP/2 message may not carry (RFC 9113 8.2.2); `te` only as `te: trailers`.
_H2_FORBIDDEN = HOP_BY_HOP - {b"te"}
# Fields the proxy writes itself on a forwarded request (the client's values are dropped or appended to).
_REQUEST_OWN = REPLACED | {b"x-forwarded-for", b"forwarded", b"host", b"content-length", b"via"}
# Fields a request never carries on (hop-by-hop; `te: trailers` alone is HTTP/2's own), and the ones whose spelling
# with `_` for `-` is dropped too (CGI and WSGI servers read them as the same field: headers.py says why).
_REQUEST_DROPPED = HOP_BY_HOP - {b"te"}
_UNDERSCORE_SPELLED = _REQUEST_OWN | HOP_BY_HOP | FRAMING
# RFC 9110 5.6.2: a method is a token; a path has no space, control or DEL (it is written into a request line).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NOT_IN_PATH = re.compile(rb"[\x00-\x20\x7f]")
_GRPC = b"application/grpc"
# gRPC status codes (grpc/doc/statuscodes.md) for the proxy's own HTTP answers.
UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, CANCELLED = 14, 4, 8, 13, 1
_GRPC_STATUS = {503: UNAVAILABLE, 502: UNAVAILABLE, 504: DEADLINE_EXCEEDED, 413: RESOURCE_EXHAUSTED, 408: CANCELLED}
# grpc-timeout units (PROTOCOL-HTTP2.md) in seconds.
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class StreamRequest:
    """What the proxy reads of a stream's request head: enough to route it, hold it and build the upstream's head."""

    __slots__ = ("authority", "content_length", "fields", "grpc", "grpc_timeout", "method", "path", "scheme")

    def __init__(self, headers: Fields) -> None:
        """`headers` as h2 validated them (pseudo-headers first, names lower-case); raises `MessageRefused`."""
        pseudo: dict[bytes, bytes] = {}
        fields: Fields = []
        self.content_length: int | None = None
        self.grpc = False
        self.grpc_timeout: float | None = None
        host = b""
        for name, value in headers:
            if name[:1] == b":":
                pseudo[name] = value
            elif name == b"host":
                host = value
            elif name == b"content-length":
                self.content_length = int(value)  # h2 checked it is a number and matches the DATA received
            elif name in (b"x-forwarded-for", b"forwarded"):
                fields.append((name, value))  # appended to by the proxy
            elif name in _REQUEST_OWN or name in _REQUEST_DROPPED:
                continue  # written by the proxy itself, or hop-by-hop (proxy-authorization is the proxy's, trailer...)
            elif b"_" in name and name.replace(b"_", b"-") in _UNDERSCORE_SPELLED:
                continue
            else:
                if name == b"content-type" and value.startswith(_GRPC):
                    self.grpc = True
                elif name == b"grpc-timeout":
                    self.grpc_timeout = grpc_timeout(value)
                fields.append((name, value))
        method = pseudo.get(b":method", b"")
        if method == b"CONNECT":
            raise MessageRefused("CONNECT is not served by this proxy", code=405)
        if _TOKEN.fullmatch(method) is None:
            raise MessageRefused("the request method is not a token")
        self.method = method
        self.scheme = pseudo.get(b":scheme", b"http")
        self.path = pseudo.get(b":path", b"")
        self.authority = pseudo.get(b":authority") or host
        if not self.path.startswith(b"/") and not (self.path == b"*" and method == b"OPTIONS"):
            raise MessageRefused("the request target must be a path")
        if _NOT_IN_PATH.search(self.path):
            raise MessageRefused("the request target has a space or a control character")
        if self.authority and not valid_host(self.authority):
            raise MessageRefused("the :authority is not a host name or address with an optional port", "bad_host")
        self.fields = fields

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT


def grpc_timeout(value: bytes) -> float | None:
    """Seconds of a `grpc-timeout` value (`<digits><unit>`, at most 8 digits); None when malformed."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def grpc_message(message: str) -> bytes:
    """`grpc-message`'s percent-encoding: printable ASCII but `%` as is, every other byte of the UTF-8 as %XX."""
    return "".join(
        chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}" for byte in message.encode("utf-8")
    ).encode("ascii")


def _forwarded_fields(request: StreamRequest, peer: bytes, node: bytes, via: bool) -> Fields:
    """The client's end-to-end fields, then the proxy's own (as headers.forwarded_request_head writes them)."""
    fields: Fields = []
    forwarded_for = forwarded = b""
    for name, value in request.fields:
        if name == b"x-forwarded-for":
            forwarded_for = value if not forwarded_for else forwarded_for + b", " + value
        elif name == b"forwarded":
            forwarded = value if not forwarded else forwarded + b", " + value
        else:
            fields.append((name, value))
    fields.append((b"x-forwarded-for", forwarded_for + b", " + peer if forwarded_for else peer))
    fields.append((b"x-forwarded-proto", b"http"))
    if forwarded:
        fields.append((b"forwarded", b"%b, for=%b;proto=http" % (forwarded, node)))
    if request.authority:
        fields.append((b"x-forwarded-host", request.authority))
    if via:
        fields.append((b"via", b"2 zeroscale"))
    return fields


def h2_request_head(request: StreamRequest, peer: bytes, node: bytes, default_host: bytes, via: bool) -> Fields:
    """The fields an HTTP/2 upstream is sent for a stream's request."""
    head = [
        (b":method", request.method),
        (b":scheme", b"http"),
        (b":authority", request.authority or default_host),
        (b":path", request.path),
    ]
    if request.content_length is not None:
        head.append((b"content-length", b"%d" % request.content_length))
    head += _forwarded_fields(request, peer, node, via)
    return head


def h1_request_head(head: Fields, body_size: int | None) -> bytes:
    """An HTTP/1.1 head for an HTTP/2 request head (`h2_request_head`'s form); `body_size`: the whole body's length
    when known, None when it streams (then chunked: the caller frames it)."""
    pseudo = dict(head[:4])
    lines = [pseudo[b":method"], b" ", pseudo[b":path"], b" HTTP/1.1\r\nHost: ", pseudo[b":authority"], b"\r\n"]
    for name, value in head[4:]:
        if name == b"te" or name == b"content-length":
            continue  # `te: trailers` means nothing to an HTTP/1.1 upstream; the length is written below
        lines += (name, b": ", value, b"\r\n")
    if body_size is None:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    elif body_size or pseudo[b":method"] not in (b"GET", b"HEAD"):
        lines.append(b"Content-Length: %d\r\n" % body_size)
    lines.append(b"\r\n")
    return b"".join(lines)


def h2_head_of_h1(head: bytes, content_length: int | None) -> Fields:
    """The HTTP/2 fields of an HTTP/1.1 head the request policy built (headers.forwarded_request_head), for an
    HTTP/1.1 client's request to an HTTP/2 upstream."""
    lines = head.split(b"\r\n")
    method, _, rest = lines[0].partition(b" ")
    path = rest.rpartition(b" ")[0]
    fields: Fields = []
    authority = b""
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(b":")
        name, value = name.lower(), value.strip(b" \t")
        if name == b"host":
            authority = value
        elif name not in _H2_FORBIDDEN and name not in (b"te", b"content-length"):
            fields.append((name, value))
    head_fields = [(b":method", method), (b":scheme", b"http"), (b":authority", authority), (b":path", path)]
    if content_length is not None:
        head_fields.append((b"content-length", b"%d" % content_length))
    # The proxy takes trailers (an HTTP/1.1 client gets them in its last chunk), whatever the client's own TE said
    # (a hop-by-hop field, not forwarded); gRPC servers refuse a call without it.
    head_fields.append((b"te", b"trailers"))
    return head_fields + fields


def h2_response_head(status: int, fields: Fields, cold_wait: float | None, via: bool) -> Fields:
    """The fields an HTTP/2 client is sent for a response (from either protocol): hop-by-hop fields dropped."""
    head = [(b":status", b"%d" % status)]
    head += [(name, value) for name, value in fields if name not in _H2_FORBIDDEN and name != b"te"]
    if cold_wait is not None:
        head += ((b"x-zeroscale-cold-start", b"true"), (b"x-zeroscale-hold-seconds", b"%.3f" % cold_wait))
    if via:
        head.append((b"via", b"2 zeroscale"))
    return head


def h1_response_head(
    status: int,
    fields: Fields,
    is_head: bool,
    keep_alive: bool,
    body_done: bool,
    draining: bool,
    http10: bool,
    cold_wait: float | None,
    via: bool,
) -> tuple[bytes, bool, bool]:
    """(head, chunked, close) for an HTTP/1.1 client of an HTTP/2 response: the HTTP/1.1 policy, run on its fields
    (an HTTP/2 response has no framing of its own to carry over: without content-length it is chunked)."""
    parts = [b""]
    has_length = False
    for name, value in fields:
        if name in _H2_FORBIDDEN:
            continue
        has_length = has_length or name == b"content-length"
        parts += (name, b": ", value, b"\r\n")
    head, _, chunked, _, close = forwarded_response_head(
        status, parts, [], has_length, is_head, keep_alive, body_done, draining, http10, cold_wait, via
    )
    return head, chunked, close


def chunk_end(trailers: Fields | None) -> bytes:
    """The last chunk of a chunked body, with the trailer fields an HTTP/2 response ended with."""
    if not trailers:
        return b"0\r\n\r\n"
    lines = [b"0\r\n"]
    for name, value in trailers:
        if name not in _H2_FORBIDDEN and name[:1] != b":":
            lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def error_fields(code: int, message: str, retry_after: int | None, grpc: bool) -> tuple[Fields, bytes]:
    """The proxy's own answer on a stream: (fields, body). For a gRPC call a trailers-only response a gRPC client
    reads as a status (UNAVAILABLE, DEADLINE_EXCEEDED...), not an HTTP error it reports as a protocol failure."""
    if grpc:
        status = _GRPC_STATUS.get(code, INTERNAL)
        return [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"%d" % status),
            (b"grpc-message", grpc_message(message)),
            (b"x-zeroscale-proxy", b"error"),
        ], b""
    fields, body = error_answer(message, retry_after)
    return own_fields(code, fields, body), body


def own_fields(code: int, fields: Fields, body: bytes) -> Fields:
    """An answer of the proxy's own on a stream (the HTTP/2 form of http1.own_response): its head's fields."""
    length = [] if code in NO_LENGTH else [(b"content-length", b"%d" % len(body))]
    return [(b":status", b"%d" % code), *fields, *OWN_ANSWER_FIELDS, *length]
