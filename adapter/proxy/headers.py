"""The RFC 9110 header policy of the proxy, both directions, as pure functions (no sockets, no state).

What a forwarded head keeps, drops, adds and refuses: hop-by-hop headers and the ones a peer names in
Connection are removed, a Connection naming a framing or routing header is refused (never rewritten),
spellings of the proxy's own headers with underscores are dropped, Forwarded / X-Forwarded-* are
appended to or replaced, and the body framing is written by the proxy itself. The protocols
(client.py, upstream.py) parse; this module decides; a refusal is a `MessageRefused` they turn into their answer.

A head is kept as pieces, four per header line (name, b": ", value, CRLF), joined once at the end: a
list of pieces is cheaper than a line per header on the hot path.
"""

from __future__ import annotations

import re

from adapter.proxy.http1 import STATUS_LINES, status_line, transfer_codings, trim, tunnel_protocols

# RFC 9110 7.6.1: headers that describe one connection and never pass through a proxy. Transfer-Encoding is
# re-added for the next hop when the body is chunked; Upgrade and Connection are re-added for a tunnel.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Headers the framing and the routing of a message rest on. RFC 9110 7.6.1 lets a peer name extra hop-by-hop
# headers in Connection, but a proxy that removed these would forward a body without its length (the next
# request or response on a pooled connection then starts inside it) or a request without its Host: a message
# whose Connection names one of them is refused, never rewritten.
FRAMING = frozenset({b"content-length", b"transfer-encoding", b"host"})
# Set by the proxy itself; a client's own values are replaced (X-Forwarded-For is appended to instead).
REPLACED = frozenset({b"x-forwarded-proto", b"x-forwarded-host", b"expect"})
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})
# Methods whose request content has no defined meaning (RFC 9110 9.3): many servers ignore such a body and
# read it as the next request. It is forwarded, and the upstream connection is closed after, never pooled.
CONTENT_UNDEFINED = frozenset({b"GET", b"HEAD", b"DELETE", b"TRACE"})

# Connection tokens that name no header to remove: a Connection made only of these needs no filtering.
_PLAIN_CONNECTION_TOKENS = frozenset({b"close", b"keep-alive", b"upgrade"})
NO_TOKENS: frozenset[bytes] = frozenset()
_OWS = b" \t"
_NO_BODY_STATUSES = frozenset({204, 304})
# RFC 3986 host (reg-name, IPv4 or IP-literal) with an optional port: what a Host header or an authority may be.
_HOST_VALUE = re.compile(rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=%]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?")

# Request headers the proxy looks at, by kind; _DROP: hop-by-hop or set by the proxy itself.
_HOST, _LENGTH, _TE, _CONNECTION, _UPGRADE, _EXPECT, _XFF, _FORWARDED, _DROP = range(9)
_SPECIAL = {
    **dict.fromkeys(HOP_BY_HOP | REPLACED, _DROP),
    b"host": _HOST,
    b"content-length": _LENGTH,
    b"transfer-encoding": _TE,
    b"connection": _CONNECTION,
    b"upgrade": _UPGRADE,
    b"expect": _EXPECT,
    b"x-forwarded-for": _XFF,
    b"forwarded": _FORWARDED,
}
# Only response header names as long as a hop-by-hop one or Content-Length need a closer (lower-cased) look.
RESPONSE_SPECIAL_LENGTHS = frozenset(len(name) for name in (*HOP_BY_HOP, b"content-length"))
# The Connection values nearly every upstream sends, parsed once.
_PLAIN_TOKENS = {value: frozenset({value.lower()}) for value in (b"keep-alive", b"close", b"Keep-Alive", b"Close")}


class MessageRefused(Exception):
    """A request or response the policy refuses (its head, or bytes its framing does not allow). `message`: why,
    as the answer says it; `framing_reason`: its reason label of zeroscale_proxy_refused_messages_total (messages
    refused for how they are framed or routed), "" for any other refusal; `code`: the status a refused request
    is answered with."""

    def __init__(self, message: str, framing_reason: str = "", code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.framing_reason = framing_reason
        self.code = code


def valid_host(value: bytes) -> bool:
    """Whether a Host (or an HTTP/2 :authority) is a host name or address with an optional port, nothing else."""
    return _HOST_VALUE.fullmatch(value) is not None


def connection_tokens(value: bytes) -> set[bytes]:
    return {token.strip(_OWS).lower() for token in value.split(b",") if token.strip(_OWS)}


def without_named(parts: list[bytes], first: int, names: frozenset[bytes] | set[bytes]) -> None:
    """Remove, in place, the header lines from `parts[first:]` whose (lower-cased) name is in `names`."""
    lines = range(first, len(parts), 4)
    parts[first:] = [piece for at in lines if parts[at].lower() not in names for piece in parts[at : at + 4]]


def drop_connection_named(parts: list[bytes], first: int, tokens: frozenset[bytes] | set[bytes]) -> None:
    """RFC 9110 7.6.1: headers named in Connection are hop-by-hop too; naming a framing header is refused.

    Called only when `tokens` name more than close, keep-alive and upgrade: the caller checks, so the warm
    path makes no call (docs/architecture.md#hot-skipped-calls).
    """
    named = tokens & FRAMING
    if named:
        raise MessageRefused(
            f"Connection names {b', '.join(sorted(named)).decode()}: framing and routing headers are never dropped",
            "connection_names_framing",
        )
    without_named(parts, first, tokens)


# What `read_request_head` read, a plain tuple in this order (not an object, and unpacked where it is used:
# docs/architecture.md#hot-head-tuples). `parts` is the forwarded head so far (no framing, no Host); `upgrade`
# the protocols kept from an upgrade asked with Connection: upgrade (b"": none asked, or none left to relay).
REQUEST_FIELDS = (
    "parts",
    "host",
    "url",
    "http10",
    "chunked",
    "content_length",
    "expect_continue",
    "keep_alive",
    "upgrade",
    "forwarded_for",
    "forwarded",
)
RequestHead = tuple[list[bytes], bytes | None, bytes, bool, bool, int | None, bool, bool, bytes, bytes, bytes]


def read_request_head(
    method: bytes, version: str | None, url: bytes, headers: list[tuple[bytes, bytes]]
) -> RequestHead:
    """The request policy up to routing: raises `MessageRefused` in the order the checks are made here."""
    if version not in ("1.1", "1.0"):
        raise MessageRefused("only HTTP/1.0 and HTTP/1.1 are served", code=505)
    if method == b"CONNECT":
        raise MessageRefused("CONNECT is not served by this proxy", code=405)
    http10 = version == "1.0"
    expect_continue = False
    host: bytes | None = None
    forwarded_for = b""
    forwarded = b""
    upgrade = b""
    tokens: frozenset[bytes] | set[bytes] = NO_TOKENS  # a new set only when there is a Connection header
    content_length: int | None = None
    codings: list[bytes] | None = None
    # Host and the framing headers are never copied from the client: the proxy writes its own.
    parts = [method, b" ", b"", b" HTTP/1.1\r\n"]
    for name, value in headers:
        kind = _SPECIAL.get(name.lower())
        if kind is None:
            if b"_" in name and name.lower().replace(b"_", b"-") in _SPECIAL:
                # CGI, WSGI and their kin read `X_Forwarded_For` as X-Forwarded-For (both become
                # HTTP_X_FORWARDED_FOR): a spelling of a header the proxy owns is never passed on.
                continue
            parts += (name, b": ", value, b"\r\n")
        elif kind == _HOST:
            if host is not None:
                raise MessageRefused("the request has more than one Host header")
            host = value.strip(_OWS)  # trim, written out: docs/architecture.md#hot-skipped-calls
        elif kind == _LENGTH:
            content_length = int(value)  # llhttp accepted only digits (and whitespace), and only one value
        elif kind == _TE:
            codings = transfer_codings(value) if codings is None else codings + transfer_codings(value)
        elif kind == _CONNECTION:
            tokens = tokens | connection_tokens(value)
        elif kind == _UPGRADE:
            upgrade = trim(value)
        elif kind == _EXPECT:
            if trim(value).lower() != b"100-continue":
                raise MessageRefused("only Expect: 100-continue is understood", code=417)
            # RFC 9110 10.1.1: ignored in HTTP/1.0, whose client would read a 100 as its final answer.
            expect_continue = not http10
        elif kind == _FORWARDED:
            # RFC 7239: what the client claims stays, the hop the proxy saw is added last.
            forwarded = trim(value) if not forwarded else forwarded + b", " + trim(value)
        elif kind == _XFF:
            forwarded_for = trim(value) if not forwarded_for else forwarded_for + b", " + trim(value)
    chunked = codings is not None and _check_codings(codings, http10, content_length)
    if tokens and not tokens <= _PLAIN_CONNECTION_TOKENS:  # docs/architecture.md#hot-skipped-calls
        drop_connection_named(parts, 4, tokens)
    if host is None and not http10:
        raise MessageRefused("an HTTP/1.1 request needs a Host header")
    if url[:8].lower().startswith((b"http://", b"https://")):
        # Absolute form: the authority in the target is the host, whatever Host says (RFC 9112 3.2.2).
        host, url = _split_absolute(url)
    elif not url.startswith(b"/") and not (url == b"*" and method == b"OPTIONS"):
        raise MessageRefused("the request target must be a path")
    if host and _HOST_VALUE.fullmatch(host) is None:
        raise MessageRefused("the Host is not a host name or address with an optional port", "bad_host")
    # As the parser decides: after such a head it only passes bytes through, so the connection ends with
    # this request even when the upgrade is not relayed.
    upgrade_asked = bool(upgrade) and b"upgrade" in tokens
    keep_alive = ((b"keep-alive" in tokens) if http10 else (b"close" not in tokens)) and not upgrade_asked
    return (
        parts,
        host,
        url,
        http10,
        chunked,
        content_length,
        expect_continue,
        keep_alive,
        tunnel_protocols(upgrade) if upgrade_asked else b"",
        forwarded_for,
        forwarded,
    )


def _check_codings(codings: list[bytes], http10: bool, content_length: int | None) -> bool:
    """RFC 9112 6.1 and 6.3 for a request's Transfer-Encoding: True (chunked) or the request is refused."""
    if http10:
        raise MessageRefused("Transfer-Encoding in an HTTP/1.0 request is refused", "transfer_encoding_http10")
    if content_length is not None:
        raise MessageRefused("Content-Length and Transfer-Encoding together are refused", "length_and_chunked")
    if not codings or codings[-1] != b"chunked":
        raise MessageRefused("a Transfer-Encoding must end with chunked", "chunked_not_last")
    if codings != [b"chunked"]:
        raise MessageRefused("only Transfer-Encoding: chunked is accepted", code=501)
    return True


def _split_absolute(url: bytes) -> tuple[bytes, bytes]:
    """(authority, origin-form target) of an absolute-form request target."""
    rest = url[url.index(b"//") + 2 :]
    end = len(rest)
    for delimiter in (b"/", b"?", b"#"):
        at = rest.find(delimiter)
        if at != -1 and at < end:
            end = at
    authority, path = rest[:end], rest[end:]
    if not authority or b"@" in authority:
        raise MessageRefused("the request target's authority is empty or carries user information", "bad_host")
    if not path.startswith(b"/"):
        path = b"/" + path
    return authority, path


def forwarded_request_head(
    request: RequestHead,
    peer: bytes,
    forwarded_default: bytes,
    forwarded_node: bytes,
    default_host: bytes,
    via: bool,
    version: str,
) -> bytes:
    """The head sent upstream: the client's end-to-end headers, then the proxy's own.

    `forwarded_default` is the X-Forwarded-For/-Proto lines for a request without X-Forwarded-For (built once
    per connection); `forwarded_node` the peer as an RFC 7239 node. An upgrade left in `request` is relayed
    (the caller refuses the request when its route has no room for one more tunnel). Positional arguments
    only, from the hot path: docs/architecture.md#hot-head-tuples.
    """
    parts, host, url, _, chunked, content_length, _, _, upgrade, forwarded_for, forwarded = request
    parts[2] = url
    if forwarded_for:
        parts.append(b"X-Forwarded-For: %b, %b\r\nX-Forwarded-Proto: http\r\n" % (forwarded_for, peer))
    else:
        parts.append(forwarded_default)
    if forwarded:
        parts.append(b"Forwarded: %b, for=%b;proto=http\r\n" % (forwarded, forwarded_node))
    if host is not None:
        parts += (b"Host: ", host, b"\r\nX-Forwarded-Host: ", host, b"\r\n")
    else:
        parts.append(b"Host: %b\r\n" % default_host)
    if via:
        parts.append(b"Via: %b zeroscale\r\n" % version.encode())
    if chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    elif content_length is not None:
        parts.append(b"Content-Length: %d\r\n" % content_length)
    if upgrade:
        parts.append(b"Connection: Upgrade\r\nUpgrade: %b\r\n" % upgrade)
    parts.append(b"\r\n")
    return b"".join(parts)


# What `forwarded_response_head` returns, a plain tuple in this order (docs/architecture.md#hot-head-tuples):
# the head for the client; whether the upstream said Connection: close; whether the proxy chunks the body (a
# close-delimited or unframed one for an HTTP/1.1 client); whether the body ends when the upstream closes;
# whether the client's connection closes after this response.
RESPONSE_FIELDS = ("head", "upstream_close", "client_chunked", "until_close", "close")
ResponseHead = tuple[bytes, bool, bool, bool, bool]


def forwarded_response_head(
    status: int,
    parts: list[bytes],
    hop: list[tuple[bytes, bytes]],
    has_length: bool,
    is_head: bool,
    keep_alive: bool,
    body_done: bool,
    draining: bool,
    http10: bool,
    cold_wait: float | None,
    via: bool,
) -> ResponseHead:
    """The head for the client from the pieces the parser kept: `parts` (a slot for the status line, then
    end-to-end lines, modified in place), `hop` (lower-cased hop-by-hop name, value); raises `MessageRefused`.
    Positional arguments only, from the hot path: docs/architecture.md#hot-head-tuples."""
    parts[0] = STATUS_LINES.get(status) or status_line(status)  # docs/architecture.md#hot-skipped-calls
    codings: list[bytes] = []
    tokens: frozenset[bytes] | set[bytes] = NO_TOKENS
    upgrade = b""
    for lower, value in hop:
        if lower == b"connection":
            tokens = tokens | (_PLAIN_TOKENS.get(value) or connection_tokens(value))
        elif lower == b"transfer-encoding":
            codings += transfer_codings(value)
        elif lower == b"upgrade":
            upgrade = trim(value)
    # The body is re-framed for the client: only chunked (which the parser removes) can be carried over.
    if codings and codings != [b"chunked"]:
        raise MessageRefused("sent a Transfer-Encoding other than chunked", "transfer_coding")
    chunked = bool(codings)
    if tokens and not tokens <= _PLAIN_CONNECTION_TOKENS:  # docs/architecture.md#hot-skipped-calls
        if not tokens.isdisjoint(FRAMING):
            raise MessageRefused(
                "named a framing header in Connection (it would be forwarded unframed)", "connection_names_framing"
            )
        drop_connection_named(parts, 1, tokens)
    if status == 204 and has_length:
        # RFC 9110 8.6: never in a 204 (the parser reads none there); a client that believed it would take
        # the next response on its connection for this one's body.
        without_named(parts, 1, {b"content-length"})
    client_chunked = until_close = close = False
    if status == 101:
        parts.append(b"Connection: Upgrade\r\nUpgrade: %b\r\n" % upgrade)
    else:
        no_body = is_head or status in _NO_BODY_STATUSES
        close = not keep_alive or not body_done or draining
        if not no_body and not has_length:
            if http10:
                close = True  # an HTTP/1.0 client reads the body until the connection closes
            else:
                client_chunked = True
                parts.append(b"Transfer-Encoding: chunked\r\n")
            until_close = not chunked
        if close:
            parts.append(b"Connection: close\r\n")
        elif http10:
            parts.append(b"Connection: keep-alive\r\n")
    if cold_wait is not None:
        parts.append(b"X-Zeroscale-Cold-Start: true\r\nX-Zeroscale-Hold-Seconds: %.3f\r\n" % cold_wait)
    if via:
        parts.append(b"Via: 1.1 zeroscale\r\n")
    parts.append(b"\r\n")
    return b"".join(parts), b"close" in tokens, client_chunked, until_close, close
