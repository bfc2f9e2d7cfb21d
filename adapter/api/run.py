"""`zeroscale serve`: the external metrics API on HTTPS, Prometheus /metrics on plain HTTP and, when enabled,
KEDA's external scaler on gRPC, on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

import uvloop
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from adapter.api.authn import Authenticator, TokenReviewer, TrustBundle
from adapter.api.authz import Authorizer
from adapter.api.delegate import Delegate
from adapter.api.http import HTTPServer, Limits, Request, Response
from adapter.api.routes import HEALTH_PATHS, ExternalMetricsAPI
from adapter.api.tls import ServingTLS, TLSError
from adapter.api.trust import TrustWatcher
from adapter.config import ZeroscaleConfig
from adapter.config.base import is_loopback
from adapter.config.server import ServerConfig
from adapter.fdlimit import raise_open_files_limit
from adapter.keda.scaler import start_scaler
from adapter.kube.client import KubeClient, KubeConfigError
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.rpc.server import RunningServer
from adapter.sources import build_source

log = logging.getLogger(__name__)

# Descriptors beyond the two listeners' caps: connections to sources and Kubernetes, the gRPC scaler, files.
_SPARE_DESCRIPTORS = 1024
_NOT_FOUND = Response(404, b"not found\n", "text/plain; charset=utf-8")
_OK = Response(200, b"ok", "text/plain; charset=utf-8")
# How long one rendering of /metrics is served: far below any scrape interval, far above a flood's spacing.
_PAGE_SECONDS = 1.0


def unsafe_without_auth(config: ZeroscaleConfig) -> str | None:
    """Why running without authentication is refused, or None when it is allowed (or auth is on)."""
    server, scaler = config.server, config.grpc.scaler
    if server.auth.enabled:
        return None
    listeners = [("bind", server.bind), ("metrics_bind", server.metrics_bind)]
    if scaler.enabled:
        listeners.append(("grpc.scaler.bind", scaler.bind))
    if all(is_loopback(host) for _, host in listeners):
        return None
    exposed = ", ".join(f"{key}={host!r}" for key, host in listeners)
    return (
        "server.auth.enabled is false, which is allowed only when every listener binds to loopback "
        f"(127.0.0.1, ::1 or localhost); got {exposed}"
    )


def listener_limits(server: ServerConfig, listener: str) -> Limits:
    """The bounds of the HTTPS API (`api`) or the plain metrics port (`metrics`), from `server:`."""
    metrics_port = listener == "metrics"
    return Limits(
        max_header_bytes=server.max_header_bytes,
        max_connections=server.metrics_max_connections if metrics_port else server.max_connections,
        max_connections_per_source=(
            server.metrics_max_connections_per_source if metrics_port else server.max_connections_per_source
        ),
        header_timeout=server.header_timeout,
        idle_timeout=server.idle_timeout,
        body_timeout=server.body_timeout,
        response_timeout=server.response_timeout,
        max_body_bytes=server.max_body_bytes,
        max_buffered_bytes=server.max_buffered_bytes,
        connections_key="server.metrics_max_connections" if metrics_port else "server.max_connections",
        per_source_key=(
            "server.metrics_max_connections_per_source" if metrics_port else "server.max_connections_per_source"
        ),
    )


class MetricsPage:
    """The Prometheus page, rendered at most once per `ttl` seconds and shared by every scrape in between.

    The metrics port answers anyone, and rendering runs on the event loop: over 10,000 series the page is
    about 1 MB and 70 ms of CPU, so each scrape rendering its own would let one peer stall the API.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._page = Response(200, b"", CONTENT_TYPE_LATEST)
        self._rendered_at = -ttl

    async def __call__(self, request: Request) -> Response:
        path = request.target.partition("?")[0]
        if path == "/metrics":
            now = time.monotonic()
            if now - self._rendered_at >= self._ttl:
                self._page = Response(200, generate_latest(), CONTENT_TYPE_LATEST)
                self._rendered_at = now
            return self._page
        if path in HEALTH_PATHS:
            return _OK
        return _NOT_FOUND


async def _reload_certificates(tls: ServingTLS, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        tls.reload_if_changed()


async def serve(config: ZeroscaleConfig, stop: asyncio.Event) -> int:
    """Serve until `stop` is set; return the process exit code."""
    server, auth = config.server, config.server.auth
    try:
        tls = ServingTLS(server.tls, verify_clients=auth.enabled)
    except TLSError as err:
        log.error("%s", err)
        return 2
    client: KubeClient | None = None
    authenticator: Authenticator | None = None
    authorizer: Authorizer | None = None
    background: list[asyncio.Task[None]] = []
    if auth.enabled:
        try:
            client = KubeClient.from_config(auth.kubernetes)
        except KubeConfigError as err:
            log.error("authentication needs the Kubernetes API: %s (server.auth.kubernetes)", err)
            return 2
        authenticator = Authenticator(
            TokenReviewer(client, auth.token_cache_ttl, auth.cache_size, auth.max_token_reviews)
            if auth.token_review
            else None
        )
        authorizer = Authorizer(client, auth)
        trusted = authenticator

        def publish(bundle: TrustBundle) -> None:
            trusted.bundle = bundle
            tls.set_client_cas(bundle.tls_pem())

        watcher = TrustWatcher(auth, client, publish, server.tls.reload_interval)
        try:
            await watcher.load()
        except ValueError as err:
            log.error("%s", err)
            await client.close()
            return 2
        background.append(asyncio.create_task(watcher.run(), name="trust watcher"))
    else:
        log.warning(
            "AUTHENTICATION IS OFF (server.auth.enabled: false): anyone who can reach %s:%d reads every metric; "
            "allowed only because every listener is on loopback",
            server.bind,
            server.port,
        )
    background.append(asyncio.create_task(_reload_certificates(tls, server.tls.reload_interval)))

    sources = {source.name: build_source(source) for source in config.sources}
    catalogue = Catalogue(config.metrics)
    cache = MetricCache(catalogue, sources, config.cache)
    delegate = None if config.delegate is None else Delegate(config.delegate, catalogue.names())
    if delegate is not None:
        log.info("metric names Zeroscale does not serve go to the external metrics delegate (%s)", delegate.name)
        background.append(asyncio.create_task(delegate.run(), name="delegate discovery"))
    handler = ExternalMetricsAPI(cache, authenticator, authorizer, delegate)
    api = HTTPServer(handler, listener_limits(server, "api"), "api")
    metrics = HTTPServer(MetricsPage(_PAGE_SECONDS), listener_limits(server, "metrics"), "metrics")
    code = 0
    scaler: RunningServer | None = None
    try:
        port = await api.start(server.bind, server.port, tls.listener_context)
        metrics_port = await metrics.start(server.metrics_bind, server.metrics_port, None)
        scaler = await start_scaler(config.grpc.scaler, cache)  # KEDA's external scaler, when enabled
    except OSError as err:
        log.error("cannot listen: %s", err)
        code = 1
    else:
        log.info(
            "serving external.metrics.k8s.io on https://%s:%d, Prometheus metrics on http://%s:%d/metrics",
            server.bind,
            port,
            server.metrics_bind,
            metrics_port,
        )
        await stop.wait()
        log.info("stopping")
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await api.stop()
    await metrics.stop()
    if scaler is not None:
        await scaler.stop()
    await cache.close()
    if delegate is not None:
        await delegate.close()
    for source in sources.values():
        with contextlib.suppress(Exception):
            await source.close()
    if client is not None:
        await client.close()
    return code


async def _main(config: ZeroscaleConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return await serve(config, stop)


def run_adapter(config: ZeroscaleConfig) -> int:
    problem = unsafe_without_auth(config)
    if problem is not None:
        log.error("refusing to start: %s", problem)
        return 2
    server = config.server
    raise_open_files_limit(
        server.max_connections + server.metrics_max_connections + _SPARE_DESCRIPTORS,
        f"server.max_connections + server.metrics_max_connections ({server.max_connections} + "
        f"{server.metrics_max_connections}) and connections to sources",
    )
    return uvloop.run(_main(config))
