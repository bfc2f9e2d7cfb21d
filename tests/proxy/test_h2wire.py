"""The translations between HTTP/1.1 and HTTP/2 forms, and gRPC's own answers: pure functions, no sockets."""

from __future__ import annotations

import pytest

from adapter.proxy.h2wire import (
    StreamRequest,
    chunk_end,
    error_fields,
    grpc_message,
    grpc_timeout,
    h1_request_head,
    h1_response_head,
    h2_head_of_h1,
    h2_request_head,
    h2_response_head,
)
from adapter.proxy.headers import MessageRefused

_GRPC_CALL = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"echo.example:8080"),
    (b":path", b"/pkg.Echo/Unary"),
    (b"content-type", b"application/grpc+proto"),
    (b"te", b"trailers"),
    (b"grpc-timeout", b"250m"),
    (b"x-forwarded-for", b"10.0.0.1"),
    (b"x-forwarded-proto", b"https"),
    (b"x_forwarded_for", b"spoofed"),
    (b"content-length", b"12"),
]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"100u", 1e-4), (b"5n", 5e-9)],
)
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert grpc_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"12", b"1x", b"123456789S", b"-1S", b"1.5S"])
def test_malformed_grpc_timeout_is_ignored(value: bytes) -> None:
    assert grpc_timeout(value) is None


def test_a_grpc_call_is_read_for_routing_and_holding() -> None:
    request = StreamRequest(_GRPC_CALL)
    assert (request.method, request.authority, request.path) == (b"POST", b"echo.example:8080", b"/pkg.Echo/Unary")
    assert request.grpc
    assert request.grpc_timeout == pytest.approx(0.25)
    assert request.content_length == 12
    assert not request.idempotent


def test_the_forwarded_fields_are_the_proxys_own() -> None:
    head = h2_request_head(StreamRequest(_GRPC_CALL), b"192.0.2.7", b"192.0.2.7", b"echo.ns", via=True)
    assert head[:4] == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"echo.example:8080"),
        (b":path", b"/pkg.Echo/Unary"),
    ]
    fields = dict(head[4:])
    assert fields[b"x-forwarded-for"] == b"10.0.0.1, 192.0.2.7"  # appended to
    assert fields[b"x-forwarded-proto"] == b"http"  # replaced
    assert fields[b"x-forwarded-host"] == b"echo.example:8080"
    assert fields[b"te"] == b"trailers"
    assert fields[b"via"] == b"2 zeroscale"
    assert b"x_forwarded_for" not in fields  # a spelling of a field the proxy owns
    assert [name for name, _ in head].count(b"content-length") == 1


def test_connect_and_a_target_that_is_no_path_are_refused() -> None:
    with pytest.raises(MessageRefused) as refused:
        StreamRequest([(b":method", b"CONNECT"), (b":authority", b"example:443")])
    assert refused.value.code == 405
    with pytest.raises(MessageRefused):
        StreamRequest([(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"example/x")])


def test_an_http2_request_becomes_an_http11_head_with_its_length_or_chunked() -> None:
    head = h2_request_head(StreamRequest(_GRPC_CALL), b"192.0.2.7", b"192.0.2.7", b"echo.ns", via=False)
    whole = h1_request_head(head, 12)
    assert whole.startswith(b"POST /pkg.Echo/Unary HTTP/1.1\r\nHost: echo.example:8080\r\n")
    assert whole.endswith(b"Content-Length: 12\r\n\r\n")
    assert b"te:" not in whole.lower()
    streaming = h1_request_head(head, None)
    assert b"Transfer-Encoding: chunked\r\n" in streaming
    assert b"content-length" not in streaming.lower()
    get = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a"), (b":path", b"/")]
    assert b"Content-Length" not in h1_request_head(get, 0)


def test_an_http11_head_becomes_http2_fields_without_connection_fields() -> None:
    head = (
        b"POST /upload?x=1 HTTP/1.1\r\nUser-Agent: t\r\nX-Forwarded-For: 192.0.2.7\r\nHost: app.example\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    )
    fields = h2_head_of_h1(head, None)
    assert fields[:4] == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"app.example"),
        (b":path", b"/upload?x=1"),
    ]
    names = [name for name, _ in fields]
    assert b"transfer-encoding" not in names
    assert b"connection" not in names
    assert (b"te", b"trailers") in fields  # the proxy relays trailers to an HTTP/1.1 client
    assert (b"user-agent", b"t") in fields
    assert (b"content-length", b"5") in h2_head_of_h1(head, 5)


def test_responses_lose_connection_fields_both_ways() -> None:
    fields = [(b"content-type", b"text/plain"), (b"connection", b"close"), (b"transfer-encoding", b"chunked")]
    h2_head = h2_response_head(200, fields, 1.5, via=False)
    assert h2_head == [
        (b":status", b"200"),
        (b"content-type", b"text/plain"),
        (b"x-zeroscale-cold-start", b"true"),
        (b"x-zeroscale-hold-seconds", b"1.500"),
    ]
    head, chunked, close = h1_response_head(200, fields, False, True, True, False, False, None, False)
    assert chunked
    assert not close
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked\r\n" in head
    assert b"connection: close" not in head.lower()


def test_trailers_go_in_the_last_chunk() -> None:
    assert chunk_end(None) == b"0\r\n\r\n"
    assert chunk_end([(b"grpc-status", b"0"), (b"connection", b"x")]) == b"0\r\ngrpc-status: 0\r\n\r\n"


@pytest.mark.parametrize(("code", "status"), [(503, b"14"), (502, b"14"), (504, b"4"), (413, b"8"), (500, b"13")])
def test_a_grpc_call_gets_a_trailers_only_status(code: int, status: bytes) -> None:
    fields, body = error_fields(code, "the proxy already holds 3 requests (limits.max_held_requests)", 1, grpc=True)
    assert body == b""
    answer = dict(fields)
    assert answer[b":status"] == b"200"
    assert answer[b"content-type"] == b"application/grpc"
    assert answer[b"grpc-status"] == status
    assert answer[b"grpc-message"] == b"the proxy already holds 3 requests (limits.max_held_requests)"


def test_a_plain_stream_gets_the_http_error() -> None:
    fields, body = error_fields(503, "full", 5, grpc=False)
    assert dict(fields)[b":status"] == b"503"
    assert dict(fields)[b"retry-after"] == b"5"
    assert body == b"full\n"


def test_grpc_message_is_percent_encoded() -> None:
    assert grpc_message("50% done: ok") == b"50%25 done: ok"
    assert grpc_message("caf\u00e9\n") == b"caf%C3%A9%0A"


def test_hop_by_hop_fields_and_their_underscore_spellings_are_not_forwarded() -> None:
    head = [
        *_GRPC_CALL[:4],
        (b"proxy-authorization", b"Basic c2VjcmV0OnB3"),  # a credential for the proxy, never for the app
        (b"trailer", b"x-t"),
        (b"transfer_encoding", b"chunked"),
        (b"proxy_connection", b"x"),
        (b"x-kept", b"1"),
    ]
    assert [name for name, _ in StreamRequest(head).fields] == [b"x-kept"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b":authority", b"b.example:@a.example"),  # routed by one host, read by the upstream as another
        (b":method", b"GET /admin"),  # not a token: it would be a request line of its own
        (b":path", b"/public\tHTTP/1.0"),
        (b":path", b"/a b"),
    ],
)
def test_pseudo_fields_that_would_forge_an_http11_request_line_or_host_are_refused(name: bytes, value: bytes) -> None:
    head = [(key, value if key == name else given) for key, given in _GRPC_CALL[:4]]
    with pytest.raises(MessageRefused) as refused:
        StreamRequest(head)
    assert refused.value.code == 400
