"""Hostile input against the cold-start choices (docs/architecture.md#waking-page): the page never shows what a
request carried, a page body is bounded and served with fixed headers, and a `when: always` rule answers what it is
configured to answer and never reaches the upstream, whatever the request looks like."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived
from pydantic import ValidationError

from adapter.config import ConfigError, load_config
from adapter.config.cold import MAX_BODY_BYTES, FixedResponse, NeverWakeRule, WakingPage
from adapter.proxy.http1 import own_response
from tests.fixtures.h2_peers import h2_request
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import Response, Responses, get, known_cold, read_response, request, route, running_proxy
from tests.fixtures.upstream_app import Upstream

NAVIGATE = "Accept: text/html\r\nSec-Fetch-Mode: navigate\r\n"
SCRIPT = "<script>alert(1)</script>"


@pytest.mark.parametrize(
    "raw",
    [
        get(f"/{SCRIPT}", extra=NAVIGATE),
        get("/", extra=f"{NAVIGATE}X-Evil: {SCRIPT}\r\nReferer: http://x/{SCRIPT}\r\nUser-Agent: {SCRIPT}\r\n"),
        get("/", extra=f"Accept: text/html, {SCRIPT}\r\n"),
        get("/", host=SCRIPT, extra=NAVIGATE),  # refused as a Host; its answer names nothing of it either
        get("/", host="x%3Cscript%3E.example", extra=NAVIGATE),  # a Host the syntax allows: not shown
    ],
)
async def test_the_page_never_shows_what_the_request_carried(raw: bytes) -> None:
    port = refused_port()
    async with running_proxy([route("page", f"127.0.0.1:{port}", waking_page={})]) as server:
        await known_cold(server, "page")
        answer = await request(server.port, raw, within=2)
    assert answer.status in (400, 503)
    for piece in (b"<script", b"alert(1)", b"%3Cscript", b"x-evil"):
        assert piece not in answer.body.lower()
    if answer.status == 503:
        assert b"default/page" in answer.body  # the page: it names the route, and only that


async def test_an_http2_stream_s_headers_are_not_shown_either() -> None:
    port = refused_port()
    async with running_proxy([route("page", f"127.0.0.1:{port}", waking_page={})]) as server:
        await known_cold(server, "page")
        headers = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/a"),
            (":authority", "evil.example"),
            ("accept", "text/html"),
            ("x-evil", SCRIPT),
        ]
        answer = await h2_request(server.port, headers, within=2)
    assert answer.header(":status") == "503"
    assert b"<script" not in answer.body
    assert b"evil.example" not in answer.body


def page_config(tmp_path: Path, body_file: Path, upstream_port: int) -> Path:
    document = {
        "proxy": {
            "allow_loopback_endpoints": True,
            "routes": [
                {
                    "name": "filed",
                    "upstream": {"address": f"127.0.0.1:{upstream_port}"},
                    "wake": "none",
                    "waking_page": {"body_file": str(body_file)},
                }
            ],
        }
    }
    path = tmp_path / "zeroscale.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_page_file_over_64_kib_is_refused_naming_it(tmp_path: Path) -> None:
    page = tmp_path / "too-big.html"
    page.write_bytes(b"a" * (MAX_BODY_BYTES + 1))
    with pytest.raises(ConfigError) as refused:
        load_config(page_config(tmp_path, page, 1))
    assert str(page) in str(refused.value)
    assert "larger than 65536 bytes" in str(refused.value)


@pytest.mark.parametrize(("content", "why"), [(None, "cannot read it"), (b"\xff\xfe", "is not UTF-8")])
def test_a_page_file_that_cannot_be_served_is_refused_naming_it(
    tmp_path: Path, content: bytes | None, why: str
) -> None:
    page = tmp_path / "page.html"
    if content is not None:
        page.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        load_config(page_config(tmp_path, page, 1))
    assert str(page) in str(refused.value)
    assert why in str(refused.value)


@pytest.mark.parametrize("kind", ["fifo", "device"])
async def test_a_page_file_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO would block the load until something writes to it (the proxy never starts); a device (/dev/zero, a
    terminal) is no page either."""
    page = tmp_path / "page.html"
    if kind == "fifo":
        os.mkfifo(page)
    else:
        page.symlink_to("/dev/zero")
    loading = asyncio.create_task(asyncio.to_thread(load_config, page_config(tmp_path, page, 1)))
    done, _ = await asyncio.wait([loading], timeout=2)
    if not done:  # blocked opening the FIFO: a writer lets it go on, then the test fails
        os.close(os.open(page, os.O_WRONLY | os.O_NONBLOCK))
    with pytest.raises(ConfigError) as refused:
        await loading
    assert done, "the load blocked on the page file"
    assert f"{page} is not a regular file" in str(refused.value)


async def test_a_page_file_of_64_kib_is_served_whole_as_html(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    body = b"<p>" + b"w" * (MAX_BODY_BYTES - 7) + b"</p>"
    page.write_bytes(body)
    port = refused_port()
    config = load_config(page_config(tmp_path, page, port))
    routes: list[dict[str, Any]] = [
        {**config.proxy.routes[0].model_dump(exclude_defaults=True), "readiness": "probe", "probe_interval": 0.005}
    ]
    async with running_proxy(routes) as server:
        await known_cold(server, "filed")
        answer = await request(server.port, get("/", extra=NAVIGATE), within=2)
    assert answer.body == body
    assert answer.headers["content-type"] == "text/html; charset=utf-8"


@pytest.mark.parametrize("name", ["Content-Type", "cache-control", "X-Content-Type-Options", "Content-Length"])
def test_the_headers_the_proxy_fixes_cannot_be_configured(name: str) -> None:
    with pytest.raises(ValidationError, match="written by the proxy itself"):
        WakingPage(headers={name: "x"})
    with pytest.raises(ValidationError, match="written by the proxy itself"):
        FixedResponse(headers={name: "x"})


@pytest.mark.parametrize(
    "headers",
    [
        {"x-a": "b\n"},  # `$` matches before a trailing newline: a pattern check with it lets this through
        {"x-a": "b\r\n"},
        {"x-a": "b\r\nset-cookie: s=1"},
        {"x-a\n": "b"},
    ],
)
def test_a_configured_header_never_ends_a_line(headers: dict[str, str]) -> None:
    """A route object is a tenant's input: a newline in a header it configures would end the proxy's response head
    early (what follows read as body, or as a next response) on every client of the route."""
    for model, fields in ((WakingPage, {}), (FixedResponse, {}), (NeverWakeRule, {"path": "/x"})):
        with pytest.raises(ValidationError, match=r"control characters|not a header name"):
            model.model_validate({**fields, "headers": headers})


def test_a_configured_body_is_bounded_in_bytes_not_characters() -> None:
    """64 KiB as sent: 30,000 euro signs are 90,000 bytes of UTF-8 (a route object's page or rule answers, each)."""
    for model in (WakingPage, FixedResponse):
        with pytest.raises(ValidationError, match="larger than 65536 bytes"):
            model.model_validate({"body": "\u20ac" * 30_000})
        assert model.model_validate({"body": "\u20ac" * 21_845}).body  # 65,535 bytes


@pytest.mark.parametrize("status", [204, 205, 304])
def test_a_response_without_content_is_never_configured_with_a_body(status: int) -> None:
    """A client reads no body after a 204, 205 or 304 head: a configured body would be read as the answer to the next
    request on the connection, which a proxy in front may be sending for another client and another host."""
    with pytest.raises(ValidationError, match=f"a {status} response has no body"):
        FixedResponse(status=status, body="HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nforged")
    with pytest.raises(ValidationError, match="a waking page is a body"):
        WakingPage(status=status)
    assert FixedResponse(status=status).status == status  # an empty one is fine
    assert own_response(status, [], b"forged").endswith(b"\r\n\r\n")  # and the writer never writes one


async def test_a_204_rule_answer_has_no_length_and_the_next_request_gets_its_own_answer() -> None:
    upstream = await Upstream().start()
    rule = {"path": "/probe", "when": "always", "response": {"status": 204}}
    try:
        async with running_proxy([route("empty", upstream.address, never_wake=[rule])]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                writer.write(get("/probe"))
                async with asyncio.timeout(5):
                    head = await reader.readuntil(b"\r\n\r\n")
                writer.write(get("/echo?next"))
                following = await Responses(reader).next()
            finally:
                writer.close()
            stream = await h2_request(server.port, h2_fields("GET", "/probe"))
    finally:
        await upstream.stop()
    assert head.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert b"content-length" not in head  # RFC 9110 8.6: never in a 204
    assert (following.status, following.headers["x-seen-path"]) == (200, "/echo?next")
    assert stream.header(":status") == "204"
    assert stream.header("content-length") is None


@pytest.mark.parametrize("value", [" b", "b ", "\tb"])
def test_a_configured_response_header_has_no_whitespace_around_its_value(value: str) -> None:
    """HTTP/2 clients refuse such a field (h2: "header value surrounded by whitespace"): the page or answer would
    never reach them."""
    for model in (WakingPage, FixedResponse):
        with pytest.raises(ValidationError, match="whitespace around it"):
            model.model_validate({"headers": {"x-a": value}})


def test_a_rule_s_content_type_is_one_of_a_fixed_few() -> None:
    with pytest.raises(ValidationError):
        FixedResponse.model_validate({"content_type": "image/svg+xml"})


async def test_the_answers_carry_their_fixed_headers() -> None:
    port = refused_port()
    rule = {"path": "/j", "response": {"content_type": "application/json", "body": "<html>"}}
    async with running_proxy([route("fixed", f"127.0.0.1:{port}", waking_page={"body": "{}"}, never_wake=[rule])]) as s:
        await known_cold(s, "fixed")
        page = await request(s.port, get("/", extra=NAVIGATE), within=2)
        json = await request(s.port, get("/j"), within=2)
    for answer, content_type in ((page, "text/html; charset=utf-8"), (json, "application/json")):
        assert answer.headers["content-type"] == content_type
        assert answer.headers["cache-control"] == "no-store"
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in page.headers["content-security-policy"]


def chunked(path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".encode()
    )


ALWAYS_REQUESTS = [
    get("/admin"),
    get("/admin/x?y=1"),
    b"HEAD /admin HTTP/1.1\r\nHost: app.example\r\n\r\n",
    b"DELETE /admin HTTP/1.1\r\nHost: app.example\r\nContent-Length: 3\r\n\r\nabc",
    chunked("/admin"),
    b"GET http://app.example/admin HTTP/1.1\r\nHost: other.example\r\n\r\n",  # absolute form
    b"POST /admin HTTP/1.1\r\nHost: app.example\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /admin HTTP/1.0\r\n\r\n",
    get("/admin", extra="Connection: Upgrade\r\nUpgrade: websocket\r\n"),
    # Spellings an upstream reads as /admin (servers decode and clean a path before routing it).
    get("/%61dmin"),
    get("//admin"),
    get("/./admin/x"),
    get("/x/../admin"),
    get("/%2e%2e/admin"),
    get("/x/%2E%2E/%61dmin/"),
]


async def ask(port: int, raw: bytes) -> Response:
    """One request on a new connection, and its answer (a HEAD's: its head)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        async with asyncio.timeout(5):
            return await read_response(reader, head_only=raw.startswith(b"HEAD"))
    finally:
        writer.close()


async def test_a_when_always_rule_never_reaches_the_upstream() -> None:
    upstream = await Upstream().start()
    rule = {"path_prefix": "/admin", "when": "always", "response": {"status": 403, "body": "closed"}}
    try:
        async with running_proxy([route("walled", f"127.0.0.1:{upstream.port}", never_wake=[rule])]) as server:
            answers = [await ask(server.port, raw) for raw in ALWAYS_REQUESTS]
            stream = await h2_request(
                server.port,
                [(":method", "GET"), (":scheme", "http"), (":path", "/admin"), (":authority", "app.example")],
            )
            open_path = await request(server.port, get("/echo"))
    finally:
        await upstream.stop()
    assert [answer.status for answer in answers] == [403] * len(ALWAYS_REQUESTS)
    assert stream.header(":status") == "403"
    assert open_path.status == 200  # the upstream is there: only the rule's paths never reach it
    assert [seen.path for seen in upstream.requests] == ["/echo"]


async def test_a_slow_client_s_unread_body_after_a_rule_answer_is_dropped() -> None:
    """The answer goes before the body comes; what the client sends after is dropped with the connection."""
    upstream = await Upstream().start()
    rule = {"path": "/upload", "when": "always", "response": {"status": 413, "body": "no uploads here"}}
    try:
        async with running_proxy([route("slow", f"127.0.0.1:{upstream.port}", never_wake=[rule])]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"PUT /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: 100\r\n\r\n")
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"x" * 50 + get("/echo?smuggled"))
            async with asyncio.timeout(5):
                rest = await reader.read()
            writer.close()
    finally:
        await upstream.stop()
    assert head.startswith(b"HTTP/1.1 413")
    assert b"connection: close" in head
    assert rest == b"no uploads here"
    assert upstream.requests == []


async def test_body_sent_after_a_rule_answered_its_stream_is_given_back_to_the_connection_s_window() -> None:
    """An HTTP/2 client may send a stream's body until it reads the answer and the proxy's RST_STREAM: what it sent
    is credited back to the connection's window, or some 256 such uploads would stall every stream of the connection
    (the proxy's connection window is 16 MiB)."""
    upstream = await Upstream().start()
    rule = {"path_prefix": "/upload", "when": "always", "response": {"status": 403, "body": "no"}}
    window = 65535  # a stream's initial window
    try:
        async with running_proxy([route("uploads", upstream.address, never_wake=[rule])]) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            client = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
            client.initiate_connection()

            async def exchange_frames() -> None:
                writer.write(client.data_to_send())
                async with asyncio.timeout(2):
                    for event in client.receive_data(await reader.read(1 << 20)):
                        if isinstance(event, DataReceived):
                            client.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)

            for _ in range(300):  # 19.7 MB, more than the connection's window
                while client.outbound_flow_control_window < window or client.open_outbound_streams > 50:
                    await exchange_frames()  # TimeoutError: the window was never given back
                stream_id = client.get_next_available_stream_id()
                client.send_headers(stream_id, h2_fields("POST", "/upload"))
                for offset in range(0, window, 16384):
                    client.send_data(stream_id, b"x" * min(16384, window - offset))
            writer.close()
            answer = await h2_request(server.port, h2_fields("GET", "/echo"))
    finally:
        await upstream.stop()
    assert answer.header(":status") == "200"
    assert [seen.path for seen in upstream.requests] == ["/echo"]


def h2_fields(method: str, path: str) -> list[tuple[str, str]]:
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", "app.example")]
