"""The proxy's `Local` scale target (development mode) against the demo's local scaler, all real.

The proxy's own Waker talks to the scaler over loopback HTTP with the scale subresource calls of
docs/protocols.md#scale-subresource;
end to end, a request to a proxy in front of the demo's HTTP app at zero is held, wakes it, and is answered.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from pydantic import ValidationError

from adapter.children import shared_port
from adapter.config.proxy import ProxyConfig
from adapter.config.route import LocalScaleTarget, RouteConfig
from adapter.demo.processes import Supervisor
from adapter.demo.scaler import answer, start_scaler
from adapter.demo.workloads import LocalWorkload
from adapter.proxy.app import Proxy
from adapter.proxy.route import Route
from adapter.proxy.wake import Waker
from tests.demo.fixtures import until


def test_route_accepts_a_local_target_on_loopback_only() -> None:
    route = RouteConfig.model_validate(
        {
            "name": "web",
            "upstream": {"address": "127.0.0.1:8081"},
            "target": {"kind": "Local", "name": "web", "url": "http://127.0.0.1:9999"},
        }
    )
    assert isinstance(route.target, LocalScaleTarget)
    for url in ("http://10.0.0.1:9999", "https://127.0.0.1:9999", "http://127.0.0.1"):
        with pytest.raises(ValidationError, match="loopback only"):
            LocalScaleTarget.model_validate({"kind": "Local", "name": "web", "url": url})


def test_scale_at_zero_omits_replicas_and_stale_patch_conflicts(sleeper: LocalWorkload) -> None:
    """docs/protocols.md#scale-subresource: spec.replicas is omitted at 0; a PATCH with an old resourceVersion is a 409
    Status."""
    workloads = {"sleeper": sleeper}
    path = "/apis/apps/v1/namespaces/local/deployments/sleeper/scale"
    code, scale = answer(workloads, "GET", path, b"")
    assert code == 200
    assert scale["spec"] == {}
    assert scale["status"]["replicas"] == 0
    stale = json.dumps({"metadata": {"resourceVersion": "0"}, "spec": {"replicas": 1}}).encode()
    code, status = answer(workloads, "PATCH", path, stale)
    assert code == 409
    assert status["kind"] == "Status"
    assert status["reason"] == "Conflict"
    assert sleeper.spec_replicas == 0
    code, _ = answer(workloads, "GET", "/apis/apps/v1/namespaces/local/deployments/nobody/scale", b"")
    assert code == 404


async def test_proxy_waker_wakes_a_local_workload_once(sleeper: LocalWorkload) -> None:
    woken: list[tuple[str, int, int]] = []
    server = await start_scaler({"sleeper": sleeper}, lambda *change: woken.append(change))
    port = server.sockets[0].getsockname()[1]
    route_config = RouteConfig.model_validate(
        {
            "name": "sleeper",
            "upstream": {"address": "127.0.0.1:9"},
            "target": {"kind": "Local", "name": "sleeper", "url": f"http://127.0.0.1:{port}"},
        }
    )
    assert isinstance(route_config.target, LocalScaleTarget)
    route = Route(route_config)
    waker = Waker.local(route, route_config.target, 1, 1.0)
    try:
        assert await waker.wake_once() == "patched"
        await until(lambda: sleeper.ready_replicas == 1)
        # Awake now: the proxy never overrides a size someone else chose.
        sleeper.scale(2)
        assert await waker.wake_once() == "already_awake"
        assert woken == [("sleeper", 0, 1)]
    finally:
        await waker.close()
        await route.close()
        server.close()


async def test_a_request_held_at_zero_wakes_the_local_app_through_the_proxy(supervisor: Supervisor) -> None:
    holder = shared_port()  # the app's port, as the demo holds it
    app_port = holder.getsockname()[1]
    command = [sys.executable, "-m", "adapter.demo.apps", "http", "--port", str(app_port), "--start-delay", "0.2"]
    web = LocalWorkload("web", lambda index: [*command, "--replica", f"web-{index}"], supervisor)
    woken: list[tuple[str, int, int]] = []
    scaler = await start_scaler({"web": web}, lambda *change: woken.append(change))
    scaler_port = scaler.sockets[0].getsockname()[1]
    config = ProxyConfig.model_validate(
        {
            "bind": "127.0.0.1",
            "port": 0,
            "admin_bind": "127.0.0.1",
            "admin_port": 0,
            "allow_loopback_endpoints": True,
            "routes": [
                {
                    "name": "web",
                    "upstream": {"address": f"127.0.0.1:{app_port}"},
                    "target": {"kind": "Local", "name": "web", "url": f"http://127.0.0.1:{scaler_port}"},
                    "readiness": "probe",
                }
            ],
        }
    )
    proxy = Proxy(config)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(30):
            response = await reader.read()
        writer.close()
        assert response.startswith(b"HTTP/1.1 200")
        assert b"hello from web-0" in response
        assert woken == [("web", 0, 1)]  # no HPA here: the proxy woke it
    finally:
        await proxy.shutdown(grace=0)
        await web.close()
        scaler.close()
        holder.close()
