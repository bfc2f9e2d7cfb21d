"""The HTTP/2 parts of perf/proxy_bench.py: nginx as an h2c upstream and as an h2c proxy, h2load, held streams.

nginx 1.22 speaks HTTP/2 without TLS on a `listen ... http2` port with prior knowledge only (no Upgrade), the
way gRPC clients and h2load's http:// URLs do; its `grpc_pass` is the one module of nginx 1.22 that speaks h2c to
an upstream (`proxy_pass` speaks HTTP/1.x only), and it passes plain GET requests and their answers through as
well as gRPC calls. h2load's per-request log (`--log-file`: start, status, microseconds to the end of the
response) gives the p50 and p99 that its summary (mean, sd, max) does not.
"""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import h2.config
import h2.connection
import h2.events

# nginx closes a connection after keepalive_requests (1000 by default), HTTP/2 ones too, and h2load's timed
# runs (-D) do not open another: raised so that each run keeps its connections.
_MANY = "keepalive_requests 1000000000;"
UPSTREAM = "server { listen 127.0.0.1:{port} http2; " + _MANY + ' location / { return 200 "hello from upstream\\n"; } }'


def nginx_proxy(upstream: int) -> str:
    """nginx in front of `upstream`, h2c on both sides, upstream connections kept (keepalive)."""
    return (
        f"upstream up {{ server 127.0.0.1:{upstream}; keepalive 128; {_MANY} }}\n"
        "server { listen 127.0.0.1:{port} http2; " + _MANY + " location / { grpc_pass grpc://up; } }"
    )


# Concurrent streams -> (connections, streams on each): one stream alone, and 64 over a few connections.
LOADS = {1: (1, 1), 64: (4, 16)}


def h2load(port: int, streams: int, seconds: int) -> tuple[float, float, float]:
    """(requests/s, p50 us, p99 us) of h2load for `seconds` against http://127.0.0.1:port/ (prior knowledge) at
    `streams` concurrent streams; SystemExit with what h2load printed if any request failed or was not a 2xx."""
    connections, per_connection = LOADS[streams]
    with tempfile.TemporaryDirectory(prefix="bench-h2load-") as directory:
        log = Path(directory, "requests.tsv")
        argv = ["h2load", f"-c{connections}", f"-m{per_connection}", f"-D{seconds}", f"--log-file={log}"]
        run = subprocess.run([*argv, f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=seconds + 60)
        out = run.stdout + run.stderr
        counts = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out)
        statuses = re.search(r"status codes: \d+ 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        if run.returncode or not counts or not statuses:
            raise SystemExit(f"h2load failed against port {port} (exit {run.returncode}):\n{out}")
        succeeded, failed, errored, timeout = map(int, counts.groups())
        if not succeeded or failed + errored + timeout or sum(map(int, statuses.groups())):
            raise SystemExit(f"h2load saw errors against port {port}:\n{out}")
        times = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines())
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    return rps, statistics.median(times), times[math.ceil(len(times) * 0.99) - 1]  # p99: nearest rank


class HeldStreams:
    """Client connections that each open streams (GET, no body) and keep them open, answering the server's
    SETTINGS and PINGs meanwhile, so that the proxy holds every stream until `close()`."""

    def __init__(self) -> None:
        self._readers: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.StreamWriter] = []
        # What the proxy did instead of holding a stream: "status 503", "reset 7"... -> how many times.
        self.answered: dict[str, int] = {}

    async def open(self, port: int, connections: int, streams: int) -> None:
        await asyncio.gather(*(self._connection(port, streams) for _ in range(connections)))

    async def _connection(self, port: int, streams: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self._writers.append(writer)
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        connection.initiate_connection()
        writer.write(connection.data_to_send())
        # Streams are opened once the server's SETTINGS are in: h2 then refuses more than it allows at once.
        while not any(
            isinstance(event, h2.events.RemoteSettingsChanged) for event in await _receive(connection, reader)
        ):
            pass
        headers = [(":method", "GET"), (":scheme", "http"), (":authority", "bench"), (":path", "/held")]
        for _ in range(streams):
            connection.send_headers(connection.get_next_available_stream_id(), headers, end_stream=True)
        writer.write(connection.data_to_send())
        self._readers.append(asyncio.create_task(self._keep_answering(connection, reader, writer)))

    async def _keep_answering(
        self, connection: h2.connection.H2Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                events = await _receive(connection, reader)
            except ConnectionError:
                self._note("connection closed")
                return
            for event in events:
                if isinstance(event, h2.events.ResponseReceived):
                    self._note(f"status {dict(event.headers or []).get(b':status', b'?').decode()}")
                elif isinstance(event, h2.events.StreamReset):
                    self._note(f"reset {event.error_code!r}")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self._note(f"GOAWAY {event.error_code!r}")
            writer.write(connection.data_to_send())  # SETTINGS and PING acknowledgements

    def _note(self, answer: str) -> None:
        self.answered[answer] = self.answered.get(answer, 0) + 1

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def _receive(connection: h2.connection.H2Connection, reader: asyncio.StreamReader) -> list[h2.events.Event]:
    data = await reader.read(65536)
    if not data:
        raise ConnectionError("the proxy closed a connection holding streams")
    return connection.receive_data(data)
