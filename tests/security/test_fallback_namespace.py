"""A fallback Service is in its route's namespace only (docs/architecture.md#fallback): a ZeroscaleRoute cannot name
another namespace for it (the schema has no such field, and a Service name cannot carry one), and a route served
from an object reads its fallback's slices in the object's own namespace, never another team's Service of that name;
a config-file route's fallback is in the route's namespace (`home`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter.config.route import RouteConfig
from adapter.config.route_object import parse_route
from adapter.kube.client import KubeClient
from adapter.proxy.route import fallback_config
from tests.fixtures.kube_routes import endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.proxy import get, kube_client, request, until
from tests.fixtures.route_crd import schema_errors
from tests.fixtures.upstream_app import Upstream
from tests.proxy.test_route_objects import kube, route_object, route_proxy, routes_collection

__all__ = ["kube", "kube_client"]


def with_fallback(where: str, **fallback: Any) -> dict[str, Any]:
    """Route object `shop` in namespace `where` whose fallback is Service `static` with `fallback` on top."""
    obj = route_object(
        where, "shop", ["shop.example"], fallback={"service": "static", "port": "http", "after": 0.1, **fallback}
    )
    obj["spec"]["limits"] = {"hold_timeout": 0.8}
    return obj


@pytest.mark.parametrize(
    "fallback",
    [{"namespace": "team-b"}, {"service": "static.team-b"}, {"service": "static.team-b.svc.cluster.local"}],
)
def test_a_route_object_cannot_name_a_fallback_in_another_namespace(fallback: dict[str, Any]) -> None:
    obj = with_fallback("team-a", **fallback)
    assert schema_errors(obj) != []
    with pytest.raises(ValueError, match=r"spec\.fallback"):
        parse_route(obj)


def test_a_route_objects_fallback_is_in_its_namespace_and_a_file_routes_in_its_home() -> None:
    from_object = fallback_config(parse_route(with_fallback("team-a")))
    assert (from_object.upstream.service, from_object.upstream.namespace) == ("static", "team-a")  # type: ignore[union-attr]
    file_route = RouteConfig.model_validate(
        {
            "name": "web",
            "namespace": "shop",
            "upstream": {"service": "web", "namespace": "backend", "port": "http"},
            "wake": "none",
            "fallback": {"service": "static", "port": 80},
        }
    )
    assert fallback_config(file_route).upstream.namespace == "shop"  # type: ignore[union-attr]


async def test_another_teams_ready_service_of_the_fallbacks_name_is_never_used(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    theirs, ours = await Upstream().start(), await Upstream().start()
    try:
        kube.put(slices_collection("team-a"), endpoint_slice("web-1", "web", [], 80))
        kube.put(slices_collection("team-a"), endpoint_slice("static-1", "static", [], 80))
        ready = [("127.0.0.1", {"ready": True})]
        kube.put(slices_collection("team-b"), endpoint_slice("static-1", "static", ready, theirs.port))
        kube.put(routes_collection("team-a"), with_fallback("team-a"))
        async with route_proxy(kube, kube_client) as proxy:
            await until(lambda: "team-a/shop" in proxy.routes)
            fallback = proxy.routes["team-a/shop"].fallback
            assert fallback is not None
            await until(lambda: fallback.readiness_known)
            refused = await request(proxy.port, get(host="shop.example"))
            kube.put(slices_collection("team-a"), endpoint_slice("static-1", "static", ready, ours.port))
            await until(fallback.has_usable)
            served = await request(proxy.port, get(host="shop.example"))
    finally:
        await asyncio.gather(theirs.stop(), ours.stop())
    assert refused.status == 504
    assert served.status == 200
    assert theirs.requests == []
    assert len(ours.requests) == 1
