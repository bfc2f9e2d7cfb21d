"""What one response on a pooled keep-alive upstream connection may leave behind for the next one.

An upstream connection goes back to the pool when a response ends; whatever the upstream sent past that
end (in the same read or later) and whatever the response carried after its head (trailers) must never
become part of the next response, which may belong to another client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY

from tests.fixtures.proxy import Responses, get, read_response, request, route, running_proxy, until

Answer = Callable[[bytes], bytes | list[bytes]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _counted(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class ScriptedUpstream:
    """A stand-in upstream that answers requests without bodies with the raw bytes `answer` returns for their
    target (a list: written piece by piece, each in its own read), each once `gate` is set (so a test can line
    up requests first); it records every request line with the number of the connection it came on."""

    def __init__(self, answer: Callable[[bytes], bytes | list[bytes]]) -> None:
        self.answer = answer
        self.gate = asyncio.Event()
        self.gate.set()
        self.seen: list[tuple[int, bytes]] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> ScriptedUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1]
                self.seen.append((number, target))
                await self.gate.wait()
                answer = self.answer(target)
                for piece in answer if isinstance(answer, list) else [answer]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.05)
        self._writers.discard(writer)
        writer.close()


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Answer], ScriptedUpstream]]:
    started: list[ScriptedUpstream] = []

    def make(answer: Answer) -> ScriptedUpstream:
        stand_in = ScriptedUpstream(answer)
        started.append(stand_in)
        return stand_in

    yield make
    for stand_in in started:
        await stand_in.stop()


AFTER_THE_RESPONSE = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL",
    b"HTTP/1.1 200 OK\r\nContent-Le",
    b"HTTP/1.",
    b"EVIL",
]


@pytest.mark.parametrize("after", AFTER_THE_RESPONSE, ids=["whole-response", "partial-head", "partial-line", "junk"])
@pytest.mark.parametrize(
    "first",
    [
        OK,
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ],
    ids=["content-length", "204", "chunked"],
)
async def test_bytes_after_a_response_in_the_same_read_never_answer_another_clients_request(
    scripted: Callable[[Answer], ScriptedUpstream], first: bytes, after: bytes
) -> None:
    """Client B's request waits for the endpoint's only slot while A's is answered; when A's response ends, B's
    request is sent at once. What the upstream glued to A's response must not be read as B's answer."""
    upstream = scripted(
        lambda target: first + after if target == b"/a" else b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb"
    )
    await upstream.start()
    upstream.gate.clear()
    async with running_proxy([route("app", upstream.address, limits={"endpoint_concurrency": 1})]) as server:
        counted = {"side": "response", "reason": "bytes_after_response"}
        before = _counted("zeroscale_proxy_refused_messages_total", counted)
        reader_a, writer_a = await asyncio.open_connection("127.0.0.1", server.port)
        reader_b, writer_b = await asyncio.open_connection("127.0.0.1", server.port)
        writer_a.write(get("/a"))
        await until(lambda: len(upstream.seen) == 1)
        writer_b.write(get("/b"))
        await until(lambda: server.routes["default/app"].counts.held == 1)
        upstream.gate.set()
        a = await asyncio.wait_for(read_response(reader_a), 5)
        b = await asyncio.wait_for(read_response(reader_b), 5)
        writer_a.close()
        writer_b.close()
        assert a.status == int(first.split(b" ")[1])
        assert (b.status, b.body) == (200, b"b")
        # B's request went on a new connection: the one that sent too much is never pooled.
        assert upstream.seen == [(1, b"/a"), (2, b"/b")]
        assert _counted("zeroscale_proxy_refused_messages_total", counted) == before + 1


async def test_pipelined_requests_get_their_own_answers_when_a_response_carries_extra_bytes(
    scripted: Callable[[Answer], ScriptedUpstream],
) -> None:
    upstream = scripted(
        lambda target: OK + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL" if target == b"/a" else OK
    )
    await upstream.start()
    async with running_proxy([route("app", upstream.address)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/a") + get("/b"))
        responses = Responses(reader)
        bodies = [(await responses.next()).body for _ in range(2)]
        writer.close()
        assert bodies == [b"ok", b"ok"]
        assert upstream.seen == [(1, b"/a"), (2, b"/b")]


def _chunked_with_trailers(trailers: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n" + trailers + b"\r\n"


async def test_a_responses_trailers_never_reach_the_next_response_on_its_connection(
    scripted: Callable[[Answer], ScriptedUpstream],
) -> None:
    trailers = b"Set-Cookie: session=first-users-secret\r\nX-Trailer: 1\r\n"
    upstream = scripted(lambda target: _chunked_with_trailers(trailers) if target == b"/a" else OK)
    await upstream.start()
    async with running_proxy([route("app", upstream.address)]) as server:
        first = await request(server.port, get("/a"))
        second = await request(server.port, get("/b"))
        assert (first.status, first.body) == (200, b"ok")
        assert (second.status, second.body) == (200, b"ok")
        assert "set-cookie" not in second.headers
        assert "x-trailer" not in second.headers
        # The trailers ended a well-framed response: the connection stays pooled.
        assert upstream.seen == [(1, b"/a"), (1, b"/b")]


async def test_response_trailers_are_bounded_like_a_response_head(
    scripted: Callable[[Answer], ScriptedUpstream],
) -> None:
    limit = 4096
    # One trailer line that never ends, then many short ones: both are buffered by the parser until they end.
    endless = b"X-Big: " + b"a" * (limit * 4)
    many = b"".join(b"X-%d: v\r\n" % n for n in range(limit))
    for trailers in (endless, many):
        # The head and body first, then the trailer section that never ends, in reads of their own.
        response = _chunked_with_trailers(trailers)[:-2]
        split = response.index(b"0\r\n") + 3
        pieces = [response[:split], *(response[at : at + 1024] for at in range(split, len(response), 1024))]
        upstream = scripted(lambda _target, pieces=pieces: pieces)  # type: ignore[misc]
        await upstream.start()
        async with running_proxy([route("app", upstream.address, limits={"max_response_head_bytes": limit})]) as server:
            counted = {"route": "default/app", "limit": "max_response_head_bytes"}
            before = _counted("zeroscale_proxy_limit_hits_total", counted)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(get("/a"))
            # The response began: it is cut off, never completed with the oversized trailers dropped.
            received = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert received.startswith(b"HTTP/1.1 200 OK")
            assert not received.endswith(b"0\r\n\r\n")
            assert _counted("zeroscale_proxy_limit_hits_total", counted) == before + 1
            await until(lambda: server.routes["default/app"].counts.pending == 0)


async def test_a_204_is_forwarded_without_a_content_length(
    scripted: Callable[[Answer], ScriptedUpstream],
) -> None:
    """RFC 9110 8.6: no Content-Length in a 204; a client that believed one would read the next response as body."""
    upstream = scripted(lambda _target: b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n")
    await upstream.start()
    async with running_proxy([route("app", upstream.address)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(get("/a"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 204")
        assert b"content-length" not in head.lower()


def _echo_target(target: bytes) -> list[bytes]:
    # In a read of its own: a second answer comes after the proxy has handed the connection on. The first
    # request's answer is empty, so it is a whole answer to a HEAD too.
    body = b"" if target == b"/a" else target
    return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)]


@pytest.mark.parametrize("method", [b"GET", b"HEAD", b"DELETE", b"TRACE"])
async def test_a_body_on_a_method_without_content_semantics_never_leaves_its_connection_pooled(
    scripted: Callable[[Answer], ScriptedUpstream], method: bytes
) -> None:
    """Many servers ignore the body of a GET (RFC 9110 9.3.1: it has no defined meaning); this stand-in does too.
    The body is then read as a request of its own, and its answer, on a pooled connection, as the answer to the
    next request sent there (another client's)."""
    upstream = scripted(_echo_target)
    await upstream.start()
    upstream.gate.clear()
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: app.example\r\n\r\n"
    async with running_proxy([route("app", upstream.address, limits={"endpoint_concurrency": 1})]) as server:
        reader_a, writer_a = await asyncio.open_connection("127.0.0.1", server.port)
        reader_b, writer_b = await asyncio.open_connection("127.0.0.1", server.port)
        writer_a.write(
            b"%b /a HTTP/1.1\r\nHost: app.example\r\nContent-Length: %d\r\n\r\n%b" % (method, len(smuggled), smuggled)
        )
        await until(lambda: len(upstream.seen) == 1)
        writer_b.write(get("/b"))
        await until(lambda: server.routes["default/app"].counts.held == 1)
        upstream.gate.set()
        a = await asyncio.wait_for(read_response(reader_a, head_only=method == b"HEAD"), 5)
        b = await asyncio.wait_for(read_response(reader_b), 5)
        writer_a.close()
        writer_b.close()
        assert a.status == 200
        assert (b.status, b.body) == (200, b"/b")
        assert upstream.seen[-1] == (2, b"/b")
