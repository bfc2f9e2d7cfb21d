"""Only IP endpoints (docs/architecture.md#only-ip-endpoints), issue 28 finding 5: an FQDN EndpointSlice is ignored as
kube-proxy ignores it, and a loopback, link-local or unspecified address is refused wherever an endpoint comes from
(a slice, the config, a name's DNS answer), said in the log and zeroscale_proxy_refused_endpoints_total. The
activator's copy of the pods' slices is in tests/proxy/test_activator.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from adapter.config.proxy import ProxyConfig
from adapter.kube.client import KubeClient
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn
from tests.fixtures.proxy import get, request, route, running_proxy, until
from tests.fixtures.upstream_app import Upstream

SLICES = slices_collection("default")


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn(tls=False, token="proxy-token") as standin:
        standin.serve_collection(SLICES_V1, "EndpointSliceList")
        yield standin


def slice_route(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "upstream": {"service": "web", "namespace": "default", "port": "http"},
        "wake": "none",
        "readiness": "endpointslice",
        "limits": {"hold_timeout": 0.5},
    }


def refused(route_name: str, source: str, reason: str) -> float:
    labels = {"route": f"default/{route_name}" if route_name else "", "source": source, "reason": reason}
    return REGISTRY.get_sample_value("zeroscale_proxy_refused_endpoints_total", labels) or 0.0


def fqdn_slice(name: str, port: int) -> dict[str, Any]:
    """An FQDN slice labelled for Service web, as anyone who may write slices in its namespace can make one."""
    return {**endpoint_slice("web-fqdn", "web", [(name, {"ready": True})], port), "addressType": "FQDN"}


async def test_an_fqdn_slice_is_ignored_even_where_loopback_is_allowed(
    kube: KubeStandIn, kube_client: KubeClient, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    """Its `localhost` was resolved and dialled: the proxy's own pod answered the client."""
    kube.put(SLICES, fqdn_slice("localhost", upstream.port))
    before = refused("fqdn", "endpointslice", "fqdn_slice")
    async with running_proxy([slice_route("fqdn")], kube=kube_client) as server:  # the fixture allows loopback
        await until(lambda: refused("fqdn", "endpointslice", "fqdn_slice") == before + 1)
        assert server.routes["default/fqdn"].endpoints == []
        response = await request(server.port, get("/echo?to=localhost"))
        assert response.status == 504  # held for hold_timeout, no endpoint: never sent
    assert upstream.requests == []
    assert any("'localhost'" in r.getMessage() and "fqdn_slice" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("address", "reason", "allow_loopback"),
    [("127.0.0.1", "loopback", False), ("169.254.169.254", "link_local", True), ("0.0.0.0", "unspecified", True)],
)
async def test_an_address_the_api_refuses_in_a_slice_is_refused_from_one(
    kube: KubeStandIn, kube_client: KubeClient, address: str, reason: str, allow_loopback: bool
) -> None:
    """The API refuses them in IPv4 and IPv6 slices; the proxy does not take them from one either (a stand-in, an
    API that did not check), link-local and unspecified ones even where loopback is allowed (development)."""
    name = f"refuse-{reason}"
    kube.put(SLICES, endpoint_slice("web-abc", "web", [(address, {"ready": True}), ("10.0.0.9", {"ready": True})], 80))
    before = refused(name, "endpointslice", reason)
    async with running_proxy([slice_route(name)], kube=kube_client, allow_loopback_endpoints=allow_loopback) as server:
        await until(lambda: server.routes[f"default/{name}"].endpoints != [])
        assert [(ep.host, ep.port) for ep in server.routes[f"default/{name}"].endpoints] == [("10.0.0.9", 80)]
        assert refused(name, "endpointslice", reason) == before + 1
        # The same slice again (any change of it) is no new refusal: counted and logged once while it stays.
        kube.put(SLICES, endpoint_slice("web-abc", "web", [(address, {"ready": True}), ("10.0.0.9", {})], 80))
        await asyncio.sleep(0.2)
        assert refused(name, "endpointslice", reason) == before + 1


async def test_a_name_that_resolves_to_loopback_is_not_dialled(upstream: Upstream) -> None:
    """A configured name may be a Service of type ExternalName, whose target anyone who may write Services chooses."""
    before = refused("dns", "dns", "loopback")
    # Held 3 s, longer than a loaded machine stalls the loop: the name is resolved and refused while it is held.
    routes = [route("dns", f"localhost:{upstream.port}", limits={"hold_timeout": 3})]
    async with running_proxy(routes, allow_loopback_endpoints=False) as server:
        pending = asyncio.create_task(request(server.port, get("/echo?to=localhost")))
        await until(lambda: refused("dns", "dns", "loopback") == before + 1)
        assert (await pending).status == 504
    assert upstream.requests == []


async def test_a_name_is_still_dialled_where_loopback_is_allowed(upstream: Upstream) -> None:
    async with running_proxy([route("dev", f"localhost:{upstream.port}")]) as server:
        assert (await request(server.port, get("/echo?dev"))).status == 200


async def test_a_name_with_several_answers_is_dialled_at_each_that_may_be_an_endpoint_in_turn(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name with several A records (a headless Service, an external host): the refused answer is never dialled,
    and one that does not answer is passed over for the next, as create_connection does with a name it resolves
    itself. The system resolver answers from /etc/hosts or DNS, neither of which a test may change: its answers for
    one name are given here, at socket.getaddrinfo, which the event loop calls."""
    answers = ["169.254.169.254", "127.0.0.2", "127.0.0.1"]  # refused, nothing listening, the upstream
    system_getaddrinfo = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "several.example":
            return system_getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in answers]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    before = refused("several", "dns", "link_local")
    routes = [route("several", f"several.example:{upstream.port}", limits={"hold_timeout": 10})]
    async with running_proxy(routes) as server:  # loopback allowed: the test's upstream is on it
        assert (await request(server.port, get("/echo?several"))).status == 200
    assert refused("several", "dns", "link_local") == before + 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"routes": [route("meta", "169.254.169.254:80")]}, "route meta: upstream address 169.254.169.254:80 is link"),
        ({"routes": [route("any", "0.0.0.0:80")]}, "is unspecified"),
        ({"routes": [route("self", "127.0.0.1:9090")]}, "is loopback.*proxy.allow_loopback_endpoints"),
        ({"routes": [route("v6", "[::1]:80")]}, "is loopback"),
        ({"sidecar": {"upstream": "169.254.169.254:80"}}, "proxy.sidecar: upstream address 169.254.169.254:80"),
    ],
)
def test_an_address_that_may_not_be_an_endpoint_is_refused_at_load(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ProxyConfig.model_validate(settings)


def test_loopback_at_load_only_where_it_is_meant() -> None:
    ProxyConfig.model_validate({"routes": [route("dev", "127.0.0.1:8081")], "allow_loopback_endpoints": True})
    ProxyConfig.model_validate({"sidecar": {"upstream": "127.0.0.1:8081"}})  # the app beside it in the pod
    ProxyConfig.model_validate({"routes": [route("named", "web.default.svc:80")]})  # judged when it resolves
