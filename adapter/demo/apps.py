"""The demo's sample workloads, one process per replica: `python -m adapter.demo.apps KIND ...`.

- `http`: an HTTP/1.1 app. Every replica listens on the same loopback port (SO_REUSEPORT), so the
  port behaves like a Service: refused at zero replicas, spread over the replicas otherwise.
- `worker`: takes jobs from a Redis list (BLPOP) and counts the ones it finished.
- `kafka`: a consumer-group member that commits each batch it processed.

Each prints `ready` once it serves, and on SIGTERM finishes what it holds before exiting: no job and
no accepted request is dropped by a scale-down.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

_DRAIN = 5.0


def _announce_ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def run_http(port: int, replica: str, start_delay: float, work: float) -> None:
    stop = _stop_event()
    await asyncio.sleep(start_delay)  # a cold start: loading code, warming caches
    handlers: set[asyncio.Task[object]] = set()
    body = f"hello from {replica} (pid {os.getpid()})\n".encode()

    async def serve_one(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to be closed after it."""
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next((int(line.split(":", 1)[1]) for line in lines if line.startswith("content-length:")), 0)
        if length:
            await reader.readexactly(length)
        await asyncio.sleep(work)
        close = stop.is_set() or "connection: close" in lines
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n"
            % (len(body), b"Connection: close\r\n" if close else b"")
            + body
        )
        await writer.drain()
        return not close

    async def next_head(reader: asyncio.StreamReader) -> bytes | None:
        """The next request's head, or None once SIGTERM came first (a request being served is finished)."""
        head_wait = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({head_wait, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if head_wait.done():
            return head_wait.result()
        head_wait.cancel()
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            while (head := await next_head(reader)) is not None and await serve_one(head, reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            handlers.discard(task)
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_port=True)
    _announce_ready()
    await stop.wait()
    server.close()  # no new connections; the open ones finish their current request
    if handlers:
        await asyncio.wait(set(handlers), timeout=_DRAIN)


async def run_worker(redis_url: str, key: str, done_key: str, work: float) -> None:
    import redis.asyncio as redis

    stop = _stop_event()
    client = redis.Redis.from_url(redis_url)
    await client.ping()
    _announce_ready()
    try:
        while not stop.is_set():
            # Never cancelled: a BLPOP cut short after Redis popped the job would lose it.
            popped = await client.blpop([key], timeout=0.5)
            if popped is None:
                continue
            await asyncio.sleep(work)
            await client.incr(done_key)
    finally:
        await client.aclose()


async def run_kafka(bootstrap: str, topic: str, group: str, work: float) -> None:
    from aiokafka import AIOKafkaConsumer

    stop = _stop_event()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    _announce_ready()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=20)
            for records in batches.values():
                for _record in records:
                    await asyncio.sleep(work)
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapter.demo.apps")
    kinds = parser.add_subparsers(dest="kind", required=True)
    http = kinds.add_parser("http")
    http.add_argument("--port", type=int, required=True)
    http.add_argument("--replica", default="web")
    http.add_argument("--start-delay", type=float, default=0.5)
    http.add_argument("--work", type=float, default=0.05)
    worker = kinds.add_parser("worker")
    worker.add_argument("--redis-url", required=True)
    worker.add_argument("--key", required=True)
    worker.add_argument("--done-key", required=True)
    worker.add_argument("--work", type=float, default=0.1)
    kafka = kinds.add_parser("kafka")
    kafka.add_argument("--bootstrap", required=True)
    kafka.add_argument("--topic", required=True)
    kafka.add_argument("--group", required=True)
    kafka.add_argument("--work", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.kind == "http":
        asyncio.run(run_http(args.port, args.replica, args.start_delay, args.work))
    elif args.kind == "worker":
        asyncio.run(run_worker(args.redis_url, args.key, args.done_key, args.work))
    else:
        asyncio.run(run_kafka(args.bootstrap, args.topic, args.group, args.work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
