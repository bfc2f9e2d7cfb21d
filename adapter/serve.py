"""`zeroscale serve`, wired: the external metrics API on HTTPS, Prometheus /metrics on plain HTTP and, when
enabled, KEDA's external scaler on gRPC, over the series cache and the configured sources, on uvloop.

The composition root of the adapter process: it builds each part, and every part it builds or starts is
pushed on one AsyncExitStack right there, so teardown is setup read backwards (listeners stop before the
cache they read, the cache before the sources it reads, the sources before the Kubernetes client).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvloop

from adapter.api.authn import Authenticator, TokenReviewer, TrustBundle
from adapter.api.authz import Authorizer
from adapter.api.delegate import Delegate
from adapter.api.http import HTTPServer
from adapter.api.listeners import MetricsPage, listener_limits
from adapter.api.routes import ExternalMetricsAPI
from adapter.api.tls import ServingTLS, TLSError
from adapter.api.trust import TrustWatcher
from adapter.config import ZeroscaleConfig
from adapter.config.base import is_loopback
from adapter.fdlimit import raise_open_files_limit
from adapter.gcfreeze import freeze_after_full_collections
from adapter.keda.scaler import start_scaler
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeConfigError
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.ready import address, announce
from adapter.sources import Source, build_source
from adapter.telemetry.probe import start_probe

log = logging.getLogger(__name__)

# Descriptors beyond the two listeners' caps: connections to sources and Kubernetes, the gRPC scaler, files.
_SPARE_DESCRIPTORS = 1024
# How long one rendering of /metrics is served: far below any scrape interval, far above a flood's spacing.
_PAGE_SECONDS = 1.0


class _CannotStart(Exception):
    """Startup cannot go on; the message is logged and the process exits with `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


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


async def _reload_certificates(tls: ServingTLS, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        tls.reload_if_changed()


def _background(stack: contextlib.AsyncExitStack, work: Coroutine[Any, Any, None], name: str) -> None:
    """Run `work` as a task that the stack cancels (and waits for) on the way out."""
    task = asyncio.create_task(work, name=name)

    async def cancel() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    stack.push_async_callback(cancel)


async def _close_quietly(source: Source) -> None:
    with contextlib.suppress(Exception):  # one source failing to close must not keep the others open
        await source.close()


async def _authentication(
    stack: contextlib.AsyncExitStack, config: ZeroscaleConfig, tls: ServingTLS
) -> tuple[Authenticator | None, Authorizer | None]:
    """The Kubernetes client, TokenReview/SubjectAccessReview and the trust bundle watch, when auth is on."""
    server, auth = config.server, config.server.auth
    if not auth.enabled:
        log.warning(
            "AUTHENTICATION IS OFF (server.auth.enabled: false): anyone who can reach %s:%d reads every metric; "
            "allowed only because every listener is on loopback",
            server.bind,
            server.port,
        )
        return None, None
    try:
        client = KubeClient.from_config(auth.kubernetes)
    except KubeConfigError as err:
        raise _CannotStart(f"authentication needs the Kubernetes API: {err} (server.auth.kubernetes)") from None
    stack.push_async_callback(client.close)
    authenticator = Authenticator(
        TokenReviewer(client, auth.token_cache_ttl, auth.cache_size, auth.max_token_reviews)
        if auth.token_review
        else None
    )
    authorizer = Authorizer(client, auth)

    def publish(bundle: TrustBundle) -> None:
        authenticator.bundle = bundle
        tls.set_client_cas(bundle.tls_pem())

    watcher = TrustWatcher(auth, client, publish, server.tls.reload_interval)
    try:
        await watcher.load()
    except ValueError as err:
        raise _CannotStart(str(err)) from None
    _background(stack, watcher.run(), "trust watcher")
    return authenticator, authorizer


async def _metrics(stack: contextlib.AsyncExitStack, config: ZeroscaleConfig) -> tuple[MetricCache, Delegate | None]:
    """The sources, the series cache over them and, with a `delegate:`, the delegate for other names."""
    sources = {source.name: build_source(source) for source in config.sources}
    for source in sources.values():
        stack.push_async_callback(_close_quietly, source)
    catalogue = Catalogue(config.metrics)
    cache = MetricCache(catalogue, sources, config.cache)
    stack.push_async_callback(cache.close)
    delegate = None if config.delegate is None else Delegate(config.delegate, catalogue.names())
    if delegate is not None:
        stack.push_async_callback(delegate.close)
        log.info("metric names Zeroscale does not serve go to the external metrics delegate (%s)", delegate.name)
        _background(stack, delegate.run(), "delegate discovery")
    return cache, delegate


async def _listen(
    stack: contextlib.AsyncExitStack,
    config: ZeroscaleConfig,
    tls: ServingTLS,
    cache: MetricCache,
    handler: ExternalMetricsAPI,
) -> dict[str, str]:
    """The HTTPS API, the plain metrics port and KEDA's scaler (when enabled), each stopped by the stack;
    returns what each bound (name -> host:port: a port 0 in the config is the kernel's pick)."""
    server = config.server
    api = HTTPServer(handler, listener_limits(server, "api"), "api")
    metrics = HTTPServer(MetricsPage(_PAGE_SECONDS), listener_limits(server, "metrics"), "metrics")
    stack.push_async_callback(api.stop)  # stopping a server that never started is a no-op
    port = await api.start(server.bind, server.port, tls.listener_context)
    stack.push_async_callback(metrics.stop)
    metrics_port = await metrics.start(server.metrics_bind, server.metrics_port, None)
    bound = {"api": address(server.bind, port), "metrics": address(server.metrics_bind, metrics_port)}
    scaler = await start_scaler(config.grpc.scaler, cache)  # KEDA's external scaler, when enabled
    if scaler is not None:
        stack.push_async_callback(scaler.stop)
        bound["scaler"] = address(config.grpc.scaler.bind, scaler.port)
    log.info(
        "serving external.metrics.k8s.io on https://%s:%d, Prometheus metrics on http://%s:%d/metrics",
        server.bind,
        port,
        server.metrics_bind,
        metrics_port,
    )
    return bound


async def serve(config: ZeroscaleConfig, stop: asyncio.Event, ready_file: Path | None = None) -> int:
    """Serve until `stop` is set; return the process exit code. With `ready_file`, the bound ports are
    written there once every listener is up (adapter/ready.py)."""
    server = config.server
    try:
        tls = ServingTLS(server.tls, verify_clients=server.auth.enabled)
    except TLSError as err:
        log.error("%s", err)
        return 2
    async with contextlib.AsyncExitStack() as stack:
        try:
            authenticator, authorizer = await _authentication(stack, config, tls)
        except _CannotStart as cannot:
            log.error("%s", cannot)
            return cannot.code
        _background(stack, _reload_certificates(tls, server.tls.reload_interval), "certificate reload")
        cache, delegate = await _metrics(stack, config)
        try:
            bound = await _listen(
                stack, config, tls, cache, ExternalMetricsAPI(cache, authenticator, authorizer, delegate)
            )
        except OSError as err:
            log.error("cannot listen: %s", err)
            return 1
        if ready_file is not None:
            announce(stack, ready_file, bound)
        await stop.wait()
        log.info("stopping")
    return 0


async def _main(config: ZeroscaleConfig, ready_file: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    probe = start_probe()  # a debug aid, off unless ZEROSCALE_LOOP_PROBE is set
    # The process's own policy, not serve()'s (tests run that in their process): what is loaded by now
    # (modules, the configuration) lives as long as the process, the series as long as they are asked
    # for; out of full collections' sight (adapter.gcfreeze).
    gc.collect()
    gc.freeze()
    undo = freeze_after_full_collections()
    try:
        return await serve(config, stop, ready_file)
    finally:
        undo()
        if probe is not None:
            probe.stop()


def run_adapter(config: ZeroscaleConfig, ready_file: Path | None = None) -> int:
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
    return uvloop.run(_main(config, ready_file))
