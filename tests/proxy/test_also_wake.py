"""A route's also_wake (docs/architecture.md#also-wake): its extra targets woken together with its target, each by its
own check of the route's wake policy, one loop per target however many routes name it; the route's readiness stays
its upstream's alone. Against the Kubernetes API stand-in and a real upstream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from adapter.config.route import RouteConfig
from adapter.kube.client import KubeClient
from tests.fixtures.kube_routes import (
    ScaleStandIn,
    endpoint_slice,
    hpa,
    hpas_collection,
    slices_collection,
    wake_standin,
)
from tests.fixtures.kube_routes import wake_route as one_target_route
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.netutil import refused_port
from tests.fixtures.proxy import Response, get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream

HPA_LIST = hpas_collection("default")
SLICES = slices_collection("default")


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with wake_standin() as standin:
        yield standin


def stack_route(name: str, also: tuple[str, ...] = ("api", "worker"), **overrides: Any) -> dict[str, Any]:
    """Route `name` to Service default/web waking Deployment default/web, and `also` (Deployments of default) with it,
    every 0.2 s while requests wait."""
    extra = [{"namespace": "default", "kind": "Deployment", "name": target} for target in also]
    return one_target_route(name, **{"also_wake": extra, "wake_retry_interval": 0.2, **overrides})


def choices(route: str, choice: str) -> float:
    labels = {"route": f"default/{route}", "choice": choice}
    return REGISTRY.get_sample_value("zeroscale_proxy_cold_choices_total", labels) or 0.0


def own_wakes(target: str) -> float | None:
    """Patches of Deployment default/`target` counted as an extra target's own (None: no such series)."""
    labels = {"route": f"also_wake:default/Deployment/{target}", "result": "patched"}
    return REGISTRY.get_sample_value("zeroscale_proxy_wakes_total", labels)


def scale_reads(kube: KubeStandIn, name: str) -> int:
    scale = f"/deployments/{name}/scale"
    return sum(1 for method, path, _ in kube.requests if method == "GET" and path.endswith(scale))


async def answered_once_web_is_ready(pending: asyncio.Task[Response], kube: KubeStandIn, port: int) -> Response:
    """Service web's one pod turns ready (a real upstream on `port`): the held request's answer. No other Service
    has a pod: the extra targets never get ready."""
    upstream = await Upstream(port).start()
    try:
        kube.put(SLICES, endpoint_slice("web-abc", "web", [("127.0.0.1", {"ready": True})], port))
        return await asyncio.wait_for(pending, 10)
    finally:
        await upstream.stop()


async def test_a_held_request_wakes_the_target_and_each_extra_target_once(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Three Deployments at 0, a route waking web with also_wake [api, worker]: one held request patches each Scale
    once (retries while it stays held find them awake), and it is answered once web alone is ready."""
    scales = {name: ScaleStandIn(kube, "default", name, replicas=0) for name in ("web", "api", "worker")}
    port = refused_port()
    kube.put(SLICES, endpoint_slice("web-abc", "web", [], port))
    sent = choices("stack", "also_wake")
    async with running_proxy([stack_route("stack")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: all(scale.replicas == 1 for scale in scales.values()))
        await until(lambda: scale_reads(kube, "worker") >= 3)  # two retries, still held
        assert not pending.done()
        assert own_wakes("worker") == 1  # the extra target's attempts, under its own label
        response = await answered_once_web_is_ready(pending, kube, port)
    assert response.status == 200
    assert {name: len(scale.patches) for name, scale in scales.items()} == {"web": 1, "api": 1, "worker": 1}
    assert choices("stack", "also_wake") - sent == 2
    assert own_wakes("worker") is None  # gone with the last route naming it


async def test_an_extra_target_above_zero_is_left_alone(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """api reads 2 (someone sized it): neither patched up nor down; worker, at 0, is woken."""
    scales = {name: ScaleStandIn(kube, "default", name, replicas=0) for name in ("web", "worker")}
    api = ScaleStandIn(kube, "default", "api", replicas=2)
    async with running_proxy([stack_route("sized")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: all(scale.replicas == 1 for scale in scales.values()))
        await until(lambda: scale_reads(kube, "api") >= 2)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
    assert api.patches == []
    assert api.replicas == 2


async def test_an_extra_target_a_person_stopped_stays_stopped_and_the_request_is_still_answered(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """worker's HPA did not scale it to zero (a person did): it is not woken because web and api were, at the first
    attempt or any retry; the refusal is counted, and the held request, not answered by it, is forwarded once web is
    ready."""
    scales = {name: ScaleStandIn(kube, "default", name, replicas=0) for name in ("web", "api", "worker")}
    kube.put(HPA_LIST, hpa("web", "web", "True"))
    kube.put(HPA_LIST, hpa("worker", "worker", "False"))
    port = refused_port()
    kube.put(SLICES, endpoint_slice("web-abc", "web", [], port))
    refused = choices("stopped", "also_wake_refused")
    async with running_proxy([stack_route("stopped")], kube=kube_client) as server:
        pending = asyncio.create_task(request(server.port, get()))
        await until(lambda: scales["web"].replicas == 1 and scales["api"].replicas == 1)
        await until(lambda: choices("stopped", "also_wake_refused") - refused >= 2)  # refused again on a retry
        assert not pending.done()
        response = await answered_once_web_is_ready(pending, kube, port)
    assert response.status == 200
    assert scales["worker"].patches == []
    assert scales["worker"].replicas == 0


async def test_a_target_a_person_stopped_wakes_none_of_the_extra_targets(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The route's own target is refused (stopped by hand): its held request is answered 503 as before, and its extra
    targets, which serve only it, stay at 0."""
    scales = {name: ScaleStandIn(kube, "default", name, replicas=0) for name in ("web", "api", "worker")}
    kube.put(HPA_LIST, hpa("web", "web", "False"))
    async with running_proxy([stack_route("front-stopped")], kube=kube_client) as server:
        response = await request(server.port, get())
        await asyncio.sleep(0.5)  # time for an extra target's attempt, were one made
    assert response.status == 503
    assert "stopped by hand" in response.body.decode()
    assert [scale.patches for scale in scales.values()] == [[], [], []]
    assert scale_reads(kube, "api") + scale_reads(kube, "worker") == 0  # not even read


@pytest.mark.parametrize("wake", ["hpa", "none"])
async def test_a_route_that_wakes_nothing_wakes_no_extra_target(
    kube: KubeStandIn, kube_client: KubeClient, wake: str
) -> None:
    api = ScaleStandIn(kube, "default", "api", replicas=0)
    route = stack_route(f"quiet-{wake}", also=("api",), wake=wake, limits={"hold_timeout": 1})
    async with running_proxy([route], kube=kube_client) as server:
        response = await request(server.port, get())
    assert response.status == 504
    assert api.patches == []


async def test_routes_naming_one_extra_target_share_its_wake(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """Two routes cold together, both waking worker (the same policy): one loop reads and patches it for both, not
    one per route. With retries 30 s apart, each loop makes one attempt in the test: one read of worker's Scale."""
    for name in ("web", "worker"):
        ScaleStandIn(kube, "default", name, replicas=0)
    routes = [stack_route(name, also=("worker",), hosts=[f"{name}.example"], wake_retry_interval=30) for name in "ab"]
    async with running_proxy(routes, kube=kube_client) as server:
        pending = [asyncio.create_task(request(server.port, get(host=f"{name}.example"))) for name in "ab"]
        # Each route's own waker read web (one woke it, the other found it awake) and asked for worker after.
        await until(lambda: scale_reads(kube, "web") >= 4 and scale_reads(kube, "worker") >= 1)
        await asyncio.sleep(0.2)
        assert scale_reads(kube, "worker") == 1
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        assert server.control.services.also_wakes  # the routes still name it: its loop stays until they are closed
    assert server.control.services.also_wakes == {}


def test_also_wake_names_each_workload_once_and_not_the_target() -> None:
    base = stack_route("dup", also=())
    api = {"namespace": "default", "name": "api"}
    for also_wake in ([api, {**api, "kind": "Deployment"}], [{"namespace": "default", "name": "web"}]):
        with pytest.raises(ValidationError, match="also_wake names each workload once, and not the route's target"):
            RouteConfig.model_validate({**base, "also_wake": also_wake})
    # The same name in another namespace, or of another kind, is another workload.
    other = [api, {"namespace": "jobs", "name": "api"}, {"namespace": "default", "kind": "StatefulSet", "name": "web"}]
    assert len(RouteConfig.model_validate({**base, "also_wake": other}).also_wake) == 3


def test_a_wake_retry_interval_of_zero_is_refused() -> None:
    """The waker and every also_wake loop read the Scale once per wake_retry_interval while requests wait (pods take
    tens of seconds to get ready): at 0 each loop read and, for a target reading 0, patched back to back, as fast as
    the API answered, for the whole cold start."""
    with pytest.raises(ValidationError, match="wake_retry_interval"):
        RouteConfig.model_validate(stack_route("busy", wake_retry_interval=0))
