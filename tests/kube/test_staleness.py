"""How stale a watch's copy may get (docs/architecture.md#staleness-bounds), against the Kubernetes stand-in: a
watch that goes silent (open, nothing sent: a stuck watch cache, a half-open connection) is taken for dead and
listed again; bookmarks keep a quiet healthy one alive; a reader that doubts its copy lists it again at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeError
from adapter.kube.watching import ListWatch, WatchTask, collection_lister
from tests.fixtures.kube_standin import CONFIGMAPS, KubeStandIn

COLLECTION = "/api/v1/namespaces/apps/configmaps"


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "apps"}, "data": {}}


def silences() -> float:
    return REGISTRY.get_sample_value("zeroscale_kube_watch_silences_total", {"resource": "configmaps"}) or 0.0


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="t") as standin:
        yield standin


class Copy:
    """A ListWatch of COLLECTION and the names it last saw."""

    def __init__(self, client: KubeClient) -> None:
        self.names: set[str] = set()
        self.errors: list[KubeError] = []
        self.watch = ListWatch(client, collection_lister(client, COLLECTION), "test copy", self._seen, self._failed)

    def _seen(self, objects: dict[str, dict[str, Any]]) -> None:
        self.names = set(objects)

    def _failed(self, err: KubeError) -> bool:
        self.errors.append(err)
        return False


async def until(condition: Any, within: float) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - the copy is plain attributes set from callbacks
            await asyncio.sleep(0.01)


@pytest.fixture
async def copy(kube: KubeStandIn, request: pytest.FixtureRequest) -> AsyncIterator[Copy]:
    silence = getattr(request, "param", 30.0)
    client = KubeClient.from_config(kube.client_config(watch_silence_timeout=silence))
    kube.put(COLLECTION, configmap("old-pod"))
    copy = Copy(client)
    copy.watch.start()
    try:
        await until(lambda: copy.names == {"old-pod"}, within=10)
        yield copy
    finally:
        await copy.watch.close()
        await client.close()


@pytest.mark.parametrize("copy", [2.0], indirect=True)
async def test_a_silent_watch_is_taken_for_dead_and_listed_again(kube: KubeStandIn, copy: Copy) -> None:
    """Finding 1 of issue 28: the watch stayed open and said nothing; the copy kept the replaced object until the
    client's 300 s deadline. Now it lasts at most watch_silence_timeout (2 s here) past the last byte."""
    before = silences()
    kube.silence_watches(CONFIGMAPS)
    kube.delete(COLLECTION, "old-pod")
    kube.put(COLLECTION, configmap("new-pod"))
    await until(lambda: copy.names == {"new-pod"}, within=15)
    assert silences() > before
    assert copy.errors == []  # a silent watch is listed again, not reported as the API failing


@pytest.mark.parametrize("copy", [5.0], indirect=True)
async def test_a_quiet_watch_that_sends_bookmarks_is_not_taken_for_silent(kube: KubeStandIn, copy: Copy) -> None:
    """The server ends each watch before the silence timeout (timeoutSeconds, 4 s here), with a bookmark 2 s
    before; a quiet, healthy watch is listed again then, never counted as silent."""
    before = silences()
    await asyncio.sleep(10)
    assert silences() == before
    watches = [path for method, path, _ in kube.requests if method == "GET" and "watch=1" in path]
    assert len(watches) >= 2, "ended by the server and watched again"
    assert all("allowWatchBookmarks=true" in path and "timeoutSeconds=4" in path for path in watches)


async def test_bookmarks_keep_a_long_watch_alive_and_carry_only_a_resource_version(kube: KubeStandIn) -> None:
    """As the real API server sends them (only when asked): type BOOKMARK, an object of the collection's kind
    whose metadata holds only resourceVersion."""
    kube.bookmark_interval = 0.5
    kube.put(COLLECTION, configmap("a"))
    # Silent for 3 s: 2.5 s past a bookmark, more than a loaded machine stalls the loop.
    client = KubeClient.from_config(kube.client_config(watch_silence_timeout=3))
    events: list[dict[str, Any]] = []

    async def follow() -> None:
        async for event in client.watch(COLLECTION, timeout_seconds=60):
            events.append(event)

    try:
        with pytest.raises(TimeoutError):  # 6 s of bookmarks only: twice the silence timeout, not silent
            await asyncio.wait_for(follow(), 6)
    finally:
        await client.close()
    assert events[0]["type"] == "ADDED"
    bookmarks = [event for event in events if event["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 4
    assert bookmarks[0]["object"] == {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}


async def test_the_stand_in_sends_no_bookmark_unless_asked(kube: KubeStandIn) -> None:
    kube.bookmark_interval = 0.2
    kube.put(COLLECTION, configmap("a"))
    client = KubeClient.from_config(kube.client_config())
    _, head = await client.request("GET", COLLECTION)
    lines: list[str] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", kube.port)
    try:
        path = f"{COLLECTION}?watch=1&timeoutSeconds=1&resourceVersion={head['metadata']['resourceVersion']}"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n".encode())
        async with asyncio.timeout(10):
            while line := await reader.readline():
                lines.append(line.decode())
    finally:
        writer.close()
        await client.close()
    assert lines[0].startswith("HTTP/1.1 200")
    assert not any("BOOKMARK" in line for line in lines)


async def test_relist_reads_the_collection_again_under_a_silent_watch(kube: KubeStandIn, copy: Copy) -> None:
    """What the activator's resync does with its inputs: it cannot tell a quiet watch from a stale one."""
    kube.silence_watches(CONFIGMAPS)
    kube.put(COLLECTION, configmap("new-pod"))
    await asyncio.sleep(0.3)
    assert copy.names == {"old-pod"}  # the silent watch said nothing
    await asyncio.wait_for(copy.watch.relist(), 10)
    assert copy.names == {"old-pod", "new-pod"}


class _CrashesOften(WatchTask):
    """Crashes at once `quick` times, then runs `long_run` seconds and crashes, then stays up."""

    watch_name = "test watch crashing often"
    # The first delay far under the longest, which is longer than a loaded machine stalls the loop (a stall only
    # lengthens a measured delay: the longest is told from the first by how much shorter the first is).
    restart_backoff = (0.1, 3.0)

    def __init__(self, quick: int, long_run: float) -> None:
        self.quick, self.long_run = quick, long_run
        self.starts: list[float] = []
        self.crashed_at: list[float] = []
        self.up = asyncio.Event()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self.starts.append(loop.time())
        runs = len(self.starts)
        if runs == self.quick + 1:
            await asyncio.sleep(self.long_run)
        elif runs > self.quick + 1:
            self.up.set()
            await asyncio.sleep(3600)
        self.crashed_at.append(loop.time())
        raise KeyError("metadata")


async def test_the_restart_back_off_starts_again_after_a_run_that_lasted() -> None:
    """Suspected in issue 28: after enough crashes every later one cost the longest delay (30 s by default), even a
    crash after a day of running. A run longer than the longest delay was a recovery: back to the first delay."""
    watch = _CrashesOften(quick=6, long_run=3.5)  # 0.1 doubling: the 6th restart waits the longest, 3 s
    watch.start()
    try:
        await asyncio.wait_for(watch.up.wait(), 60)
    finally:
        await watch.close()
    assert watch.starts[6] - watch.crashed_at[5] >= 2.7  # the back-off had reached its longest delay
    assert watch.starts[7] - watch.crashed_at[6] < 1.5  # and started from its first one (0.1 s) again
