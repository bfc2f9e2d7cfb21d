"""Watches that a dead peer, an endless event or a malformed object cannot stop for good."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from adapter.api.trust import bundle_from_configmap
from adapter.config.server import AuthConfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConnectionError
from adapter.kube.kubeconfig import APIServer
from adapter.kube.watching import WatchTask, apply_event, objects_by_name

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _server(after_head: bytes) -> AsyncIterator[tuple[KubeClient, list[bytes]]]:
    """A peer that answers any watch with a 200 head, then `after_head`, then nothing, never closing."""
    requests: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(_HEAD + after_head)
        await asyncio.sleep(3600)

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = KubeClient(APIServer("http", "127.0.0.1", port, None, None, None, token="t"), timeout=0.3)
    try:
        yield client, requests
    finally:
        await client.close()
        for writer in writers:
            writer.close()
        server.close()


async def _drain(client: KubeClient, timeout_seconds: int) -> None:
    async for _ in client.watch("/api/v1/namespaces/a/configmaps", timeout_seconds=timeout_seconds):
        pass


@pytest.fixture
async def silent_peer() -> AsyncIterator[tuple[KubeClient, list[bytes]]]:
    async for pair in _server(b""):
        yield pair


@pytest.fixture
async def endless_event_peer() -> AsyncIterator[tuple[KubeClient, list[bytes]]]:
    chunk = b"x" * (1024 * 1024)
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(9))  # 9 MiB, no newline
    async for pair in _server(body):
        yield pair


async def test_a_watch_whose_peer_went_silent_ends_after_its_deadline(
    silent_peer: tuple[KubeClient, list[bytes]],
) -> None:
    client, requests = silent_peer
    started = time.monotonic()
    with pytest.raises(KubeConnectionError, match="sent nothing"):
        await asyncio.wait_for(_drain(client, timeout_seconds=1), 10)  # without the deadline: for ever
    assert 1.0 <= time.monotonic() - started < 5
    assert b"timeoutSeconds=1" in requests[0]  # the server was asked to end it


async def test_an_endless_watch_event_is_refused(endless_event_peer: tuple[KubeClient, list[bytes]]) -> None:
    client, _ = endless_event_peer
    with pytest.raises(KubeConnectionError, match="longer than"):
        await asyncio.wait_for(_drain(client, timeout_seconds=60), 10)


class _Flaky(WatchTask):
    watch_name = "test flaky watch"

    def __init__(self) -> None:
        self.runs = 0
        self.recovered = asyncio.Event()

    async def _run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            raise KeyError("metadata")  # what a malformed object did to a watch loop
        self.recovered.set()
        await asyncio.sleep(3600)


async def test_a_watch_loop_that_crashes_is_counted_and_started_again() -> None:
    before = REGISTRY.get_sample_value("zeroscale_kube_watch_crashes_total", {"watch": _Flaky.watch_name}) or 0.0
    watch = _Flaky()
    watch.start()
    try:
        await asyncio.wait_for(watch.recovered.wait(), 5)
    finally:
        await watch.close()
    assert watch.runs == 2
    after = REGISTRY.get_sample_value("zeroscale_kube_watch_crashes_total", {"watch": _Flaky.watch_name})
    assert after == before + 1


def test_malformed_list_items_and_events_are_skipped() -> None:
    good = {"metadata": {"name": "a"}}
    listing = {"items": [good, "junk", {"metadata": "junk"}, {"metadata": {"name": 5}}, {}]}
    assert objects_by_name(listing) == {"a": good}
    assert objects_by_name({"items": "junk"}) == {}
    objects = {"a": good}
    for event in ({"type": "ADDED", "object": "junk"}, {"type": "DELETED", "object": {"metadata": []}}):
        assert not apply_event(objects, event)
    assert objects == {"a": good}


@pytest.mark.parametrize("value", [5, ["a"], {"a": 1}])
def test_an_authentication_configmap_with_a_non_string_value_is_refused_not_a_crash(value: object) -> None:
    """The trust watch keeps its previous trust on a ValueError; any other error would end it."""
    with pytest.raises(ValueError, match="not a string"):
        bundle_from_configmap({"requestheader-allowed-names": value}, AuthConfig())
    with pytest.raises(ValueError, match="not a string"):
        bundle_from_configmap({"client-ca-file": value}, AuthConfig())
