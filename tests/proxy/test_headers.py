"""The proxy's header policy (adapter/proxy/headers.py) without sockets: what a forwarded head keeps and refuses."""

from __future__ import annotations

from typing import Any

import pytest

from adapter.proxy.headers import (
    REQUEST_FIELDS,
    RESPONSE_FIELDS,
    MessageRefused,
    RequestHead,
    connection_tokens,
    forwarded_request_head,
    forwarded_response_head,
    read_request_head,
)


def _forward(request: RequestHead) -> bytes:
    forwarded_default = b"X-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: http\r\n"
    return forwarded_request_head(request, b"10.0.0.9", forwarded_default, b"10.0.0.9", b"app.default", False, "1.1")


def _fields(request: RequestHead) -> dict[str, Any]:
    """The request head's tuple by field name (the hot path unpacks it instead)."""
    return dict(zip(REQUEST_FIELDS, request, strict=True))


def _lines(head: bytes) -> list[bytes]:
    return head.split(b"\r\n")


def test_connection_tokens_are_lower_cased_and_trimmed() -> None:
    assert connection_tokens(b" Keep-Alive ,X-Secret,, close") == {b"keep-alive", b"x-secret", b"close"}


def test_a_request_head_loses_hop_by_hop_and_connection_named_headers() -> None:
    headers = [
        (b"Host", b"app.example"),
        (b"Connection", b"keep-alive, X-Secret"),
        (b"X-Secret", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Proxy-Authorization", b"Basic x"),
        (b"Accept", b"*/*"),
    ]
    request = read_request_head(b"GET", "1.1", b"/a?b", headers)
    lines = _lines(_forward(request))
    assert lines[0] == b"GET /a?b HTTP/1.1"
    assert b"Accept: */*" in lines
    assert b"Host: app.example" in lines
    assert b"X-Forwarded-Host: app.example" in lines
    assert not [line for line in lines if line.lower().startswith((b"x-secret", b"keep-alive", b"proxy-auth"))]
    assert not [line for line in lines if line.lower().startswith(b"connection")]
    assert _fields(request)["keep_alive"]


@pytest.mark.parametrize("named", [b"Content-Length", b"Transfer-Encoding", b"Host"])
def test_a_request_connection_naming_a_framing_header_is_refused(named: bytes) -> None:
    headers = [(b"Host", b"a"), (b"Connection", b"close, " + named), (b"Content-Length", b"3")]
    with pytest.raises(MessageRefused) as refused:
        read_request_head(b"POST", "1.1", b"/", headers)
    assert refused.value.framing_reason == "connection_names_framing"
    assert refused.value.code == 400
    assert refused.value.message.startswith("Connection names ")  # the answer's text, the exception's str
    assert str(refused.value) == refused.value.message


def test_underscore_spellings_of_the_proxys_headers_are_dropped() -> None:
    headers = [(b"Host", b"a"), (b"X_Forwarded_For", b"1.2.3.4"), (b"X_Custom", b"kept")]
    lines = _lines(_forward(read_request_head(b"GET", "1.1", b"/", headers)))
    assert b"X_Custom: kept" in lines
    assert not [line for line in lines if b"1.2.3.4" in line]


def test_forwarded_headers_are_appended_to_and_replaced() -> None:
    headers = [
        (b"Host", b"a"),
        (b"X-Forwarded-For", b"1.1.1.1"),
        (b"X-Forwarded-Proto", b"https"),
        (b"X-Forwarded-Host", b"evil"),
        (b"Forwarded", b"for=1.1.1.1"),
    ]
    lines = _lines(_forward(read_request_head(b"GET", "1.1", b"/", headers)))
    assert b"X-Forwarded-For: 1.1.1.1, 10.0.0.9" in lines
    assert b"X-Forwarded-Proto: http" in lines
    assert b"X-Forwarded-Proto: https" not in lines
    assert b"X-Forwarded-Host: a" in lines
    assert b"X-Forwarded-Host: evil" not in lines
    assert b"Forwarded: for=1.1.1.1, for=10.0.0.9;proto=http" in lines


def test_the_proxy_writes_the_framing_itself() -> None:
    chunked = read_request_head(b"POST", "1.1", b"/", [(b"Host", b"a"), (b"Transfer-Encoding", b"chunked")])
    assert _fields(chunked)["chunked"]
    assert b"Transfer-Encoding: chunked" in _lines(_forward(chunked))
    sized = read_request_head(b"POST", "1.1", b"/", [(b"Host", b"a"), (b"Content-Length", b"12")])
    assert _fields(sized)["content_length"] == 12
    assert b"Content-Length: 12" in _lines(_forward(sized))


@pytest.mark.parametrize(
    ("version", "headers", "code", "reason"),
    [
        ("2.0", [(b"Host", b"a")], 505, ""),
        ("1.1", [], 400, ""),
        ("1.1", [(b"Host", b"a"), (b"Host", b"b")], 400, ""),
        ("1.1", [(b"Host", b"a"), (b"Expect", b"magic")], 417, ""),
        ("1.1", [(b"Host", b"a b")], 400, "bad_host"),
        ("1.0", [(b"Transfer-Encoding", b"chunked")], 400, "transfer_encoding_http10"),
        (
            "1.1",
            [(b"Host", b"a"), (b"Content-Length", b"1"), (b"Transfer-Encoding", b"chunked")],
            400,
            "length_and_chunked",
        ),
        ("1.1", [(b"Host", b"a"), (b"Transfer-Encoding", b"chunked, gzip")], 400, "chunked_not_last"),
        ("1.1", [(b"Host", b"a"), (b"Transfer-Encoding", b"gzip, chunked")], 501, ""),
    ],
)
def test_request_refusals(version: str, headers: list[tuple[bytes, bytes]], code: int, reason: str) -> None:
    with pytest.raises(MessageRefused) as refused:
        read_request_head(b"POST", version, b"/", headers)
    assert (refused.value.code, refused.value.framing_reason) == (code, reason)


def test_an_absolute_target_names_the_host() -> None:
    request = _fields(read_request_head(b"GET", "1.1", b"http://app.example:8080/x", [(b"Host", b"other")]))
    assert (request["host"], request["url"]) == (b"app.example:8080", b"/x")
    with pytest.raises(MessageRefused, match="user information"):
        read_request_head(b"GET", "1.1", b"http://user@app/x", [(b"Host", b"app")])


def test_an_h2c_upgrade_is_not_tunnelled() -> None:
    headers = [(b"Host", b"a"), (b"Connection", b"Upgrade"), (b"Upgrade", b"h2c, websocket")]
    request = read_request_head(b"GET", "1.1", b"/", headers)
    assert _fields(request)["upgrade"] == b"websocket"
    assert not _fields(request)["keep_alive"]
    assert b"Upgrade: websocket" in _lines(_forward(request))
    # Asked for h2c alone: nothing to relay, and the connection still ends with this request (as the parser
    # only passes bytes through after such a head).
    h2c = _fields(read_request_head(b"GET", "1.1", b"/", [*headers[:2], (b"Upgrade", b"h2c")]))
    assert (h2c["upgrade"], h2c["keep_alive"]) == (b"", False)


def _respond(
    status: int, lines: list[bytes], hop: list[tuple[bytes, bytes]], has_length: bool, *, http10: bool = False
) -> dict[str, Any]:
    """The response head's tuple by field name (is_head, keep_alive, body_done, draining, http10, cold_wait, via)."""
    response = forwarded_response_head(
        status, [b"", *lines], hop, has_length, False, True, True, False, http10, None, False
    )
    return dict(zip(RESPONSE_FIELDS, response, strict=True))


def test_a_response_head_loses_connection_named_headers() -> None:
    lines = [b"X-Secret", b": ", b"1", b"\r\n", b"Content-Length", b": ", b"2", b"\r\n"]
    response = _respond(200, lines, [(b"connection", b"X-Secret, close")], True)
    head = response["head"]
    assert head == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
    assert response["upstream_close"]


def test_a_response_connection_naming_a_framing_header_is_refused() -> None:
    with pytest.raises(MessageRefused) as refused:
        _respond(200, [], [(b"connection", b"content-length")], False)
    assert refused.value.framing_reason == "connection_names_framing"


def test_a_response_without_length_is_chunked_for_an_http11_client_and_closed_for_http10() -> None:
    chunked = _respond(200, [], [], False)
    assert chunked["client_chunked"]
    assert chunked["until_close"]
    assert not chunked["close"]
    assert b"Transfer-Encoding: chunked\r\n" in chunked["head"]
    old = _respond(200, [], [], False, http10=True)
    assert old["close"]
    assert not old["client_chunked"]
    assert b"Connection: close\r\n" in old["head"]


def test_a_204_loses_its_content_length_and_a_foreign_coding_is_refused() -> None:
    response = _respond(204, [b"Content-Length", b": ", b"5", b"\r\n"], [], True)
    assert response["head"] == b"HTTP/1.1 204 No Content\r\n\r\n"
    with pytest.raises(MessageRefused) as refused:
        _respond(200, [], [(b"transfer-encoding", b"gzip")], False)
    assert refused.value.framing_reason == "transfer_coding"
