"""One proxy: its data plane (adapter/proxy/server.py: listeners, connections, deadlines) and its control plane
(adapter/proxy/control.py: routes, table, Kubernetes), started and stopped together on one AsyncExitStack."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from adapter.config.proxy import ProxyConfig
from adapter.kube.client import KubeClient
from adapter.proxy.activator import Activator
from adapter.proxy.control import ControlPlane
from adapter.proxy.counts import CountsListener
from adapter.proxy.leader import LeaderElector
from adapter.proxy.route import Route
from adapter.proxy.server import ProxyServer


class Proxy:
    def __init__(self, config: ProxyConfig, *, kube: KubeClient | None = None) -> None:
        self.config = config
        self.data = ProxyServer(config)
        self.control = ControlPlane(config, self.data, kube=kube)
        self.data.routes_known = self.control.routes_known
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        """Routes first (the table is installed before any port accepts), then the listeners; OSError when a port
        cannot be bound (what started is stopped again by shutdown())."""
        self._stack.push_async_callback(self.control.close)
        await self.control.start()
        self._stack.callback(self.data.close)
        await self.data.start()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting; let held and in-flight requests finish within the grace period; 503 the rest."""
        grace = self.config.grace_period if grace is None else grace
        await self.data.stop_accepting(grace)
        await self.control.drained(grace)
        self.control.fail_held(503, "the proxy is shutting down")
        await self._stack.aclose()

    # --- what the process and tests read ---

    def subscribe(self, listener: CountsListener) -> Callable[[], None]:
        return self.control.subscribe(listener)

    @property
    def routes(self) -> dict[str, Route]:
        return self.control.routes

    @property
    def activators(self) -> dict[str, Activator]:
        return self.control.activators

    @property
    def leader(self) -> LeaderElector | None:
        return self.control.leader

    @property
    def port(self) -> int:
        return self.data.port

    @property
    def admin_port(self) -> int:
        return self.data.admin_port

    def bound(self) -> dict[str, str]:
        return self.data.bound()
