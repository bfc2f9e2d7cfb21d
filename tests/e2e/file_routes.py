"""`zeroscale proxy` with routes from its config file (no route objects), as the scenarios that wake a Deployment
through the proxy run it: the proxy's token of the session (deploy/base's RBAC) and its pending counts served where
the session's adapter subscribes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapter.children import port_outside_ephemeral
from tests.e2e.cluster import ControlPlane, Kube
from tests.e2e.fixtures import Installed, kube_api
from tests.e2e.processes import Zeroscale


def wake_route(kube: Kube, namespace: str, name: str, host: str, port_name: str) -> dict[str, Any]:
    """A route for `host` to the Service `name`'s port `port_name`, holding while the Deployment `name` has no ready
    endpoint and waking it through the scale subresource."""
    return {
        "name": name,
        "hosts": [host],
        "upstream": {"service": name, "namespace": namespace, "port": port_name},
        "target": {"namespace": namespace, "kind": "Deployment", "name": name},
        # Before v1.37 the HPA records no ScaledToZero: `wake: scale` would take every zero for a person's.
        "wake": "scale" if kube.records_scaled_to_zero() else "always",
        "readiness": "endpointslice",
    }


def start_proxy(
    plane: ControlPlane, installed: Installed, counts_port: int, directory: Path, routes: list[dict[str, Any]]
) -> Zeroscale:
    """The proxy serving `routes` on loopback, its counts stream on `counts_port`; its config and log in
    `directory`."""
    port = port_outside_ephemeral()
    config = {
        "proxy": {
            "bind": "127.0.0.1",
            "port": port,
            "admin_bind": "127.0.0.1",
            "admin_port": port_outside_ephemeral(),
            "kubernetes": kube_api(plane, installed.proxy_token),
            "routes": routes,
        },
        "grpc": {"counts": {"enabled": True, "bind": "127.0.0.1", "port": counts_port}},
    }
    directory.mkdir(exist_ok=True)
    return Zeroscale("proxy", directory, config, port).start()
