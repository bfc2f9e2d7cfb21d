"""The proxy's `Local` scale target (development mode) against the demo's local scaler, both real.

The proxy's own Waker talks to the scaler over loopback HTTP with the scale subresource calls of SPEC 8.2.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from adapter.config.proxy import LocalScaleTarget, RouteConfig
from adapter.demo.scaler import answer, start_scaler
from adapter.demo.workloads import LocalWorkload
from adapter.proxy.route import Route
from adapter.proxy.wake import Waker
from tests.demo.conftest import until


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
    """SPEC 8.2: spec.replicas is omitted at 0; a PATCH with an old resourceVersion is a 409 Status."""
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
