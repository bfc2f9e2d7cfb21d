"""The proxy's data plane: listeners, admission of client connections, the deadline sweeper, the drain.

It knows routes only through the table the control plane installs (adapter/proxy/table.py) and the listeners it
routes by; everything Kubernetes (readiness, wake, the activator, route objects, status) is the control plane's
(adapter/proxy/control.py). After accept, a connection is adapter/proxy/client.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

from adapter.config.proxy import ProxyConfig
from adapter.proxy.admin import start_admin
from adapter.proxy.client import ClientConnection
from adapter.proxy.h2client import H2ClientConnection
from adapter.proxy.table import Listener, RouteTable
from adapter.ready import address
from adapter.telemetry import proxy as telemetry

log = logging.getLogger(__name__)
_BACKLOG = 4096
# Refused connections are counted each; logged at most this often (seconds).
_REFUSAL_LOG_INTERVAL = 10.0


class ProxyServer:
    """The data plane's one object: it owns the sockets, never a route. Its one job is to keep the ports and the
    connections on them: it binds the proxy port, the admin port and the activator routes' ports, admits client
    connections up to `proxy.max_connections` (each a client.py `ClientConnection`, or the h2client.py one it
    became), sweeps all their deadlines in one task, and drains them at shutdown.

    Routes reach it as a whole `RouteTable` that the control plane (control.py) `install`s; a connection looks its
    `Route` up there per request, and the route's endpoints hold the `UpstreamConnection`s. app.py starts and
    stops it together with the control plane."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.via = config.via
        self.draining = False
        # HTTP/1.1 connections, and the HTTP/2 ones they became (ClientConnection hands them over).
        self.connections: set[ClientConnection | H2ClientConnection] = set()
        self.loop = asyncio.get_running_loop()
        # The main port's routing; activator routes' ports have listeners of their own (`listen`).
        self.listener = Listener()
        self._table = RouteTable()
        self._server: asyncio.Server | None = None
        self._admin: asyncio.Server | None = None
        self._route_servers: dict[str, asyncio.Server] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._tick_changed = asyncio.Event()
        self._refusals_logged_at = -_REFUSAL_LOG_INTERVAL
        # Whether the control plane knows the routes (the route objects listed once): until then /readyz says no,
        # so a new pod of a rollout takes no request it would answer 404 for want of a route it has not read yet.
        self.routes_known: Callable[[], bool] = lambda: True
        telemetry.CONNECTIONS.set_function(lambda: len(self.connections))

    # --- what the control plane calls ---

    def install(self, table: RouteTable) -> None:
        """Serve `table` from the next request on (requests already admitted keep their route)."""
        self._table = table
        self.listener.router = table.router
        self._tick_changed.set()

    async def listen(self, name: str, port: int, listener: Listener) -> None:
        """Open a port routed by `listener` alone (an activator route's); OSError when it cannot be bound."""
        self._route_servers[name] = await self.loop.create_server(
            functools.partial(ClientConnection, self, listener), self.config.bind, port, backlog=_BACKLOG
        )

    def unlisten(self, name: str) -> None:
        """Close the port `listen` opened under `name` (its connections go on, routed by their listener)."""
        server = self._route_servers.pop(name, None)
        if server is not None:
            server.close()

    # --- connections ---

    def admit(self, connection: ClientConnection) -> bool:
        if len(self.connections) >= self.config.max_connections:
            now = time.monotonic()
            if now >= self._refusals_logged_at + _REFUSAL_LOG_INTERVAL:
                self._refusals_logged_at = now
                log.warning(
                    "refusing client connections: proxy.max_connections=%d are open (raise it to admit more)",
                    self.config.max_connections,
                )
            return False
        self.connections.add(connection)
        return True

    def forget(self, connection: ClientConnection | H2ClientConnection) -> None:
        self.connections.discard(connection)

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def admin_port(self) -> int:
        assert self._admin is not None
        port: int = self._admin.sockets[0].getsockname()[1]
        return port

    def bound(self) -> dict[str, str]:
        """Each listener's name -> the host:port it bound (docs/architecture.md#no-port-races)."""
        bound = {
            "proxy": address(self.config.bind, self.port),
            "admin": address(self.config.admin_bind, self.admin_port),
        }
        for name, server in self._route_servers.items():
            bound[f"activator/{name}"] = address(self.config.bind, server.sockets[0].getsockname()[1])
        return bound

    # --- start and stop ---

    async def start(self) -> None:
        self._server = await self.loop.create_server(
            lambda: ClientConnection(self, self.listener), self.config.bind, self.config.port, backlog=_BACKLOG
        )
        self._admin = await start_admin(
            self.config.admin_bind,
            self.config.admin_port,
            lambda: not self.draining and self.routes_known(),
            self.config.admin_max_connections,
        )
        self._sweeper = self.loop.create_task(self._sweep())
        log.info("proxy listening on %s:%d, admin on %d", self.config.bind, self.port, self.admin_port)

    async def _sweep(self) -> None:
        """Every connection's deadlines (head, body, response, send, idle, tunnel idle): set on the hot path as
        plain numbers, checked here a few times a second (RouteTable.sweep_tick).

        Deliberate, see docs/architecture.md#hot-lazy-deadline. Why not one timer design everywhere: the API
        server follows the same per-connection number with one lazy timer each (it holds few connections,
        the proxy up to max_connections, most idle); a held request keeps its own timer (Exchange.timer):
        only held ones pay for it, off the warm path, and their 504 must not come up to 25% late.
        """
        config = self.config
        while True:
            self._tick_changed.clear()
            tick = self._table.sweep_tick(config.header_timeout, config.idle_timeout, config.send_timeout)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await self._tick_changed.wait()  # a new table may have a shorter timeout: sweep now
            now = time.monotonic()
            for connection in list(self.connections):
                connection.check_deadlines(now)

    async def stop_accepting(self, grace: float) -> None:
        """SIGTERM's first half: say not ready, keep accepting for `stop_delay` (the data plane learning this pod
        is going), then close the listeners and the idle connections; held and in-flight requests go on."""
        self.draining = True  # /readyz answers 503 from now on, and answered connections are not kept alive
        if self.config.stop_delay and grace:
            # Still accepting: connections made while the data plane learns this pod is going find a listener.
            await asyncio.sleep(self.config.stop_delay)
        for listener in (self._server, *self._route_servers.values()):
            if listener is not None:
                listener.close()
        for connection in list(self.connections):
            connection.close_if_idle()

    def close(self) -> None:
        """The end: every connection shut (their answers already written still flush), the admin port closed."""
        for connection in list(self.connections):
            connection.shut_down()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in list(self.connections):
            # Lingering closes end here (the sweeper that would end them is gone); written answers still flush.
            connection.transport.close()
        for listener in (self._server, *self._route_servers.values()):
            if listener is not None:
                listener.close()
        if self._admin is not None:
            self._admin.close()
