"""`wake: scale` decides from the HPAs as the API holds them just before it patches (docs/architecture.md#wake):
not from a watch gone silent, not before the first list answered, and only from the one HPA that names the target's
group, kind and name."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.kube.client import KubeClient
from adapter.kube.hpas import HPA
from adapter.proxy.intent import NamespaceHPAs
from tests.fixtures.kube_routes import (
    HPAS,
    PagedLists,
    ScaleStandIn,
    SlowLists,
    hpa,
    hpas_collection,
    wake_route,
    wake_standin,
)
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.fixtures.proxy import Response, get, request, running_proxy, until

HPA_LIST = hpas_collection("default")


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


def scale_route(name: str, **overrides: Any) -> dict[str, Any]:
    """A wake: scale route in front of Deployment default/web, trying again every 0.2 s while requests wait."""
    return wake_route(name, **{"wake_retry_interval": 0.2, "limits": {"hold_timeout": 30}, **overrides})


def refusals(route: str, reason: str) -> float:
    labels = {"route": f"default/{route}", "reason": reason}
    return REGISTRY.get_sample_value("zeroscale_proxy_wake_refusals_total", labels) or 0.0


async def refused(port: int, scale: ScaleStandIn) -> Response:
    """A request answered at once (well before its hold_timeout) with the proxy's own 503, and no patch."""
    patches = len(scale.patches)
    pending = asyncio.create_task(request(port, get()))
    try:
        await until(lambda: pending.done() or len(scale.patches) > patches)
        assert scale.patches[patches:] == [], "woken"
        response = pending.result()
    finally:
        pending.cancel()
    assert response.status == 503, response.body
    return response


async def not_woken(kube_client: KubeClient, scale: ScaleStandIn, name: str, **overrides: Any) -> str:
    """One request to route `name`, held until its 1 s hold_timeout with nothing woken: its 504's body, which must
    say why (`not woken: ...`)."""
    route = scale_route(name, limits={"hold_timeout": 1}, **overrides)
    async with running_proxy([route], kube=kube_client) as server:
        response = await request(server.port, get())
    assert response.status == 504, response.body
    assert scale.conflicts == len(scale.patches), scale.patches  # no patch went through
    body = response.body.decode()
    assert "did not become ready in 1 s (limits.hold_timeout); not woken:" in body
    return body


async def test_a_silent_hpa_watch_does_not_wake_what_a_person_stopped(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Finding 2: the HPA said ScaledToZero=True, its watch went silent (open, no events), the HPA rescaled
    (NotScaledToZero) and a person scaled the workload to 0: a request must not start it again (it did: the
    watch's copy still said ScaledToZero=True)."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web", "web", "True"))
    async with running_proxy([scale_route("stale")], kube=kube_client) as server:
        first = asyncio.create_task(request(server.port, get()))
        await until(lambda: scale.replicas == 1)  # the HPA scaled it to zero itself: woken
        await until(lambda: any("horizontalpodautoscalers" in path for _, path, _ in kube.requests))
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)

        kube.silence_watches(HPAS)
        scale.set(2)
        kube.put(HPA_LIST, hpa("web", "web", "False"))  # the HPA rescaled: NotScaledToZero
        scale.set(0)  # kubectl scale --replicas=0
        response = await refused(server.port, scale)
        assert "Deployment default/web was stopped by hand" in response.body.decode()
        assert len(scale.patches) == 1
        assert scale.replicas == 0
        assert refusals("stale", "stopped_by_hand") >= 1


async def test_held_requests_wait_for_the_first_hpa_list(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Finding 3: at start, while the first list of HPAs is in flight (a slow API server), a held request is
    neither woken nor refused; the list, once answered, decides (it was woken at once, its HPA saying
    NotScaledToZero)."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web", "web", "False"))
    slow = SlowLists(kube, HPAS)
    try:
        async with running_proxy([scale_route("early")], kube=kube_client) as server:
            pending = asyncio.create_task(request(server.port, get()))
            await until(lambda: server.routes["default/early"].counts.held == 1 and slow.waiting >= 1)
            await asyncio.sleep(0.5)  # time enough to wake it, were the wake not waiting for the list
            assert scale.patches == []
            assert not pending.done()
            slow.answer()
            response = await asyncio.wait_for(pending, 10)
            assert response.status == 503
            assert "stopped by hand" in response.body.decode()
            assert scale.patches == []
    finally:
        slow.answer()


async def test_an_hpa_for_another_groups_kind_of_the_same_name_does_not_count(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Finding 9: an HPA whose scaleTargetRef names `Deployment web` of another API group scales another
    workload; it counted (and its ScaledToZero=True woke apps/v1 Deployment web). Another version of the apps
    group is the same group."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("crd-web", "web", "True", api_version="example.com/v1"))
    strict = scale_route("strict", wake_without_hpa=False)
    async with running_proxy([strict], kube=kube_client) as server:
        response = await refused(server.port, scale)
        assert "no HorizontalPodAutoscaler scales it" in response.body.decode()
        assert refusals("strict", "no_hpa") >= 1

        kube.put(HPA_LIST, hpa("web", "web", "False", api_version="apps/v1beta2"))
        response = await refused(server.port, scale)
        assert "its HorizontalPodAutoscaler web did not scale it there" in response.body.decode()
    assert scale.patches == []


async def test_two_hpas_on_one_target_refuse_to_wake_it(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 9: two HPAs scale Deployment web; the HPA controller acts on neither (AmbiguousSelector), and a
    ScaledToZero=True on one of them (stale, or the other's opposite) woke it. Refused, with a warning, a metric
    and the held requests' answer saying which HPAs and what to do."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web-a", "web", "True"))
    kube.put(HPA_LIST, hpa("web-b", "web", "False"))
    async with running_proxy([scale_route("twice")], kube=kube_client) as server:
        with caplog.at_level(logging.WARNING, logger="adapter.proxy.wake"):
            response = await refused(server.port, scale)
    body = response.body.decode()
    assert "AmbiguousSelector" in body
    assert "(web-a, web-b)" in body
    assert "Delete all but one" in body
    assert scale.patches == []
    assert refusals("twice", "ambiguous_hpas") >= 1
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "AmbiguousSelector" in r.getMessage()]
    assert warned, "the refusal is logged as a warning"


async def test_hpas_that_cannot_be_read_now_wake_nothing_and_the_requests_wait(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The read before the patch fails (the API server errs): nothing is woken on what was read before, and
    the held request is not refused either; it waits, and the next attempt, once the read succeeds, wakes."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web", "web", "True"))
    failures: list[str] = []

    def unavailable(req: StandInRequest, _match: object) -> Reply | None:
        if req.param("watch") in ("1", "true"):
            return None
        failures.append(req.path)
        return Reply(500, status_body(500, "InternalError", "etcdserver: request timed out"))

    remove = kube.add_route("GET", HPAS, unavailable)
    async with running_proxy([scale_route("blip")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: len(failures) >= 3)  # three attempts, 0.2 s apart
        assert scale.patches == []
        assert not pending.done()
        remove()
        await until(lambda: scale.replicas == 1)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


async def test_a_request_whose_hold_ends_while_the_hpas_cannot_be_read_is_told_so(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The API stays down past the request's hold_timeout: its 504 says the workload was not woken and why,
    not only that it did not become ready."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    down = Reply(503, status_body(503, "ServiceUnavailable", "the server is currently unable to handle the request"))
    kube.add_route("GET", HPAS, lambda _req, _match: down)
    body = await not_woken(kube_client, scale, "outage")
    assert "HorizontalPodAutoscalers could not be read (503 ServiceUnavailable" in body


async def test_the_hpas_are_read_a_page_at_a_time_to_the_last_page(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """A namespace with 1200 HPAs: the list was one answer of every HPA (12 MB parsed at once in the event loop for
    thousands of real ones, on every wake attempt); it is read in pages of at most 500, and every page counts: the
    HPA that says NotScaledToZero is on the last one (a partial list would have woken the target)."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    for i in range(1200):
        kube.put(HPA_LIST, hpa(f"other-{i:04}", f"other-{i:04}", "True"))
    kube.put(HPA_LIST, hpa("web", "web", "False"))
    paged = PagedLists(kube, HPAS, "HorizontalPodAutoscalerList", "autoscaling/v2")
    async with running_proxy([scale_route("many")], kube=kube_client) as server:
        response = await refused(server.port, scale)
    assert "its HorizontalPodAutoscaler web did not scale it there" in response.body.decode()
    assert max(paged.pages) <= 500, paged.pages
    assert sum(paged.pages[:3]) == 1201, paged.pages
    assert REGISTRY.get_sample_value("zeroscale_proxy_hpas_listed", {"namespace": "default"}) == 1201


def listing(*items: object, **overrides: object) -> Reply:
    """An HPA list answer carrying `items` as given (objects no API server would send, too)."""
    body = {"kind": "HorizontalPodAutoscalerList", "apiVersion": "autoscaling/v2", "metadata": {}, "items": list(items)}
    return Reply(200, {**body, **overrides})


async def test_an_hpa_list_without_items_wakes_nothing(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """An answer to the HPA list that holds no `items` list is not a list: it read as a namespace without HPAs,
    and woke the target (wake_without_hpa: true). Nothing is woken; the request waits, then is told why."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.add_route("GET", HPAS, lambda _req, _match: listing(items="junk"))
    assert "HorizontalPodAutoscalers could not be read" in await not_woken(kube_client, scale, "junk")


async def test_an_hpa_without_a_name_still_counts(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """An HPA object without metadata.name (no real API server sends one) was skipped: its NotScaledToZero was not
    seen and the target woken. It counts as any other; a malformed one scaling nothing does not matter."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    nameless = hpa("web", "web", "False")
    del nameless["metadata"]["name"]
    kube.add_route("GET", HPAS, lambda _req, _match: listing(nameless, "junk", {"spec": []}))
    async with running_proxy([scale_route("nameless")], kube=kube_client) as server:
        response = await refused(server.port, scale)
    assert "was stopped by hand" in response.body.decode()


def lists_counted() -> float:
    return REGISTRY.get_sample_value("zeroscale_proxy_hpa_lists_total", {"namespace": "default"}) or 0.0


class Readers:
    """How many wakers wait for an answer of `hpas.read` now: the instance's own read, counted."""

    def __init__(self, hpas: NamespaceHPAs) -> None:
        self.waiting = 0
        read = hpas.read

        async def counted() -> list[HPA]:
            self.waiting += 1
            try:
                return await read()
            finally:
                self.waiting -= 1

        hpas.read = counted  # type: ignore[method-assign]


def hpa_lists(kube: KubeStandIn) -> int:
    return sum(1 for method, path, _ in kube.requests if method == "GET" and "horizontalpodautoscalers" in path)


async def test_routes_waking_at_once_in_one_namespace_share_the_hpa_lists(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Ten routes of one namespace go cold at once: each waker listed the namespace's HPAs itself (ten lists of the
    whole namespace at once, each parsed in the event loop). A read never joins a list already in flight (it may
    have been sent before the reader read its Scale), but all that arrive meanwhile share the next one: two lists."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web", "web", "True"))
    slow = SlowLists(kube, HPAS)
    routes = [scale_route(f"r{i}", hosts=[f"r{i}.example"]) for i in range(10)]
    counted = lists_counted()
    try:
        async with running_proxy(routes, kube=kube_client) as server:
            readers = Readers(server.control.services.hpas["default"])
            pending = [asyncio.create_task(request(server.port, get(host=f"r{i}.example"))) for i in range(10)]
            # Every waker has read its Scale and asked for a list (the client waits 5 s for the one held); a sleep
            # instead left a waker that a loaded machine kept from asking until the second list was sent: a third.
            await until(lambda: slow.waiting >= 1 and readers.waiting == 10)
            slow.answer()
            await until(lambda: scale.replicas == 1)
            # Every waker has seen it awake since: none has a list still to send.
            await until(lambda: all(wakes(f"r{i}", "already_awake") for i in range(10)))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        slow.answer()
    assert hpa_lists(kube) <= 2, hpa_lists(kube)
    assert lists_counted() - counted == hpa_lists(kube)


async def test_a_wake_never_decides_from_a_list_sent_before_it_read_the_scale(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Route a's list is in flight with the HPA's ScaledToZero=True; meanwhile the HPA rescaled (NotScaledToZero) and
    a person scaled the Deployment to 0. Route b reads the Scale after that: were it to share a's list, the Scale it
    read would let it wake what the person stopped. It waits for a list of its own time; a's patch meets a conflict
    and a reads again: neither wakes it."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.put(HPA_LIST, hpa("web", "web", "True"))
    release, held = threading.Event(), threading.Event()

    def answered_late(req: StandInRequest, _match: object) -> Reply | None:
        if req.param("watch") in ("1", "true") or held.is_set():
            return None  # later lists: the collection as the store holds it now
        held.set()
        items = kube.objects(HPA_LIST)  # what the server read when the list arrived, answered later
        release.wait(30)
        return listing(*items)

    kube.add_route("GET", HPAS, answered_late)
    routes = [scale_route(name, hosts=[f"{name}.example"]) for name in ("a", "b")]
    try:
        async with running_proxy(routes, kube=kube_client) as server:
            first = asyncio.create_task(request(server.port, get(host="a.example")))
            await until(held.is_set)
            scale.set(2)
            kube.put(HPA_LIST, hpa("web", "web", "False"))  # the HPA rescaled: NotScaledToZero
            scale.set(0)  # kubectl scale --replicas=0
            second = asyncio.create_task(request(server.port, get(host="b.example")))
            await until(lambda: second.done() or server.routes["default/b"].counts.held == 1)
            await asyncio.sleep(1)  # time for b to read the Scale and ask for the HPAs
            release.set()
            answers = await asyncio.gather(first, second)
    finally:
        release.set()
    assert [answer.status for answer in answers] == [503, 503], answers
    assert scale.replicas == 0
    assert all(patch["metadata"]["resourceVersion"] != "102" for patch in scale.patches), scale.patches


def wakes(route: str, result: str) -> float:
    return (
        REGISTRY.get_sample_value("zeroscale_proxy_wakes_total", {"route": f"default/{route}", "result": result}) or 0.0
    )


async def test_a_scale_that_keeps_changing_is_counted_once_a_conflict_and_the_request_told_why(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Every patch meets a conflict (the Scale changes between each read and patch, still at 0): three tries, three
    conflicts in zeroscale_proxy_wakes_total (the last was counted twice), and the request whose hold ends says
    why the workload was not woken (it said nothing)."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    scale.before_patch = lambda current: current.set(0)
    body = await not_woken(kube_client, scale, "churn", wake_retry_interval=60)
    assert scale.conflicts == 3
    assert wakes("churn", "conflict") == 3
    assert "not woken: the Scale of Deployment default/web changed between each read and patch" in body


async def test_a_scale_without_a_resource_version_is_not_patched(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """A Scale answered without metadata.resourceVersion was patched with an empty one, which the API server takes
    as no precondition at all: the patch could override a size the HPA chose meanwhile. It is not patched."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    bare = {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "web"}, "spec": {}, "status": {}}
    kube.add_route("GET", r".*/deployments/web/scale", lambda _req, _match: Reply(200, bare))
    assert "with no resourceVersion" in await not_woken(kube_client, scale, "bare")
    assert scale.patches == []


@pytest.mark.parametrize(
    ("status", "reason", "fix"),
    [
        (403, "Forbidden", "grant the proxy list on horizontalpodautoscalers (API group autoscaling) in default"),
        (404, "NotFound", "the API server does not serve autoscaling/v2 (Kubernetes 1.23 and later do)"),
        (401, "Unauthorized", "fix the proxy's credentials"),
    ],
)
async def test_an_hpa_list_refused_says_what_to_fix(
    kube: KubeStandIn, kube_client: KubeClient, status: int, reason: str, fix: str
) -> None:
    """The refusal's words named the fix for a 403 alone (grant list, without the API group) whatever the API said:
    a 404 (autoscaling/v2 not served) or a 401 (credentials) was told to grant RBAC."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    kube.add_route("GET", HPAS, lambda _req, _match: Reply(status, status_body(status, reason, "no")))
    async with running_proxy([scale_route("blind")], kube=kube_client) as server:
        response = await refused(server.port, scale)
    body = response.body.decode()
    assert fix in body
    assert "or set the route's wake: always" in body
    assert refusals("blind", "hpas_unreadable") >= 1


async def test_a_list_whose_continue_goes_round_in_circles_wakes_nothing_and_says_so(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """An answer whose `continue` names a page already read (no API server sends one): the wake listed the same
    page for ever, and the request whose hold ended was not told why. That list fails like no answer."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)
    looping = listing(hpa("other", "other", "True"), metadata={"continue": "again"})
    kube.add_route("GET", HPAS, lambda _req, _match: looping)
    assert "HorizontalPodAutoscalers could not be read" in await not_woken(kube_client, scale, "circle")


async def test_a_continue_that_expired_keeps_the_requests_held(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """A list's later page answered 410 Expired (its `continue` older than the compaction window): a failure that
    passes by itself (the next attempt lists again from the start), not a refusal answered at once."""
    scale = ScaleStandIn(kube, "default", "web", replicas=0)

    def expired(req: StandInRequest, _match: object) -> Reply:
        if req.param("continue"):
            return Reply(410, status_body(410, "Expired", "The provided continue parameter is too old"))
        return listing(hpa("other", "other", "True"), metadata={"continue": "page-2"})

    kube.add_route("GET", HPAS, expired)
    body = await not_woken(kube_client, scale, "expired")
    assert "could not be read (410 Expired" in body
    assert refusals("expired", "hpas_unreadable") == 0
