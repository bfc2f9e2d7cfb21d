"""TLS and mutual TLS on both gRPC servers, with certificate files re-read when they change."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme

from adapter.config.grpc import GRPCServerTLS
from adapter.metrics.errors import MetricUnavailable
from adapter.rpc.tls import ReloadingServerCredentials, TLSFilesError
from tests.fixtures.grpc_servers import (
    MakeCache,
    Routes,
    StartAdapter,
    StartCounts,
    eventually,
    ref,
    scaler_stub,
    value,
)

NAME = "proxy.zeroscale.test"


def write_pair(ca: trustme.CA, directory: Path, stem: str, *names: str) -> tuple[Path, Path]:
    leaf = ca.issue_cert(*names)
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    return cert, key


def write_ca(ca: trustme.CA, path: Path) -> Path:
    ca.cert_pem.write_to_path(str(path))
    return path


@dataclass
class MutualTLS:
    """Files for a count server that requires client certificates, and for an adapter that has one."""

    servers: trustme.CA
    clients: trustme.CA
    server: dict[str, Any]  # grpc.counts.tls
    client: dict[str, Any]  # the http source's tls


def mutual_tls(directory: Path) -> MutualTLS:
    servers, clients = trustme.CA(), trustme.CA()
    cert, key = write_pair(servers, directory, "server", NAME)
    client_cert, client_key = write_pair(clients, directory, "client", "adapter")
    server = {"cert_file": cert, "key_file": key, "client_ca_file": write_ca(clients, directory / "clients.pem")}
    client = {"ca_file": write_ca(servers, directory / "servers.pem"), "cert_file": client_cert, "key_file": client_key}
    return MutualTLS(servers, clients, server, client)


async def test_mutual_tls_between_adapter_and_proxy(
    tmp_path: Path, start_counts: StartCounts, make_cache: MakeCache
) -> None:
    tls = mutual_tls(tmp_path)
    routes = Routes("web")
    routes.add("web", held=2)
    server = await start_counts(routes, tls=tls.server)
    address = [f"127.0.0.1:{server.port}"]

    trusted = await make_cache("mtls", proxies=address, tls=tls.client, tls_server_name=NAME)
    await eventually(trusted, 2)

    # No client certificate: the handshake fails, so there are no counts (an error, never a zero).
    anonymous = await make_cache(
        "anonymous", proxies=address, tls={"ca_file": tls.client["ca_file"]}, tls_server_name=NAME
    )
    with pytest.raises(MetricUnavailable):
        await value(anonymous)


async def test_server_certificate_is_reloaded(tmp_path: Path, start_counts: StartCounts, make_cache: MakeCache) -> None:
    old, new = trustme.CA(), trustme.CA()
    cert, key = write_pair(old, tmp_path, "server", NAME)
    routes = Routes("web")
    routes.add("web", inflight=5)
    server = await start_counts(routes, tls={"cert_file": cert, "key_file": key, "reload_interval": 0.1})
    # The adapter trusts only the new CA: nothing until the proxy's files are replaced.
    cache = await make_cache(
        "reload",
        proxies=[f"127.0.0.1:{server.port}"],
        tls={"ca_file": write_ca(new, tmp_path / "new.pem")},
        tls_server_name=NAME,
    )
    with pytest.raises(MetricUnavailable):
        await value(cache)
    write_pair(new, tmp_path, "server", NAME)
    await eventually(cache, 5, within=8, through_errors=True)


async def test_keda_over_tls(tmp_path: Path, start_adapter: StartAdapter) -> None:
    """KEDA's `caCert` trigger setting: the scaler server's certificate is checked."""
    ca = trustme.CA()
    cert, key = write_pair(ca, tmp_path, "scaler", "zeroscale.zeroscale.svc")
    adapter = await start_adapter(tls={"cert_file": str(cert), "key_file": str(key)})
    credentials = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
    options = [("grpc.ssl_target_name_override", "zeroscale.zeroscale.svc")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{adapter.grpc_port}", credentials, options) as channel:
        assert (await scaler_stub(channel).IsActive(ref())).result is True
    async with grpc.aio.insecure_channel(f"127.0.0.1:{adapter.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await scaler_stub(channel).IsActive(ref(), timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_unreadable_files_stop_the_start(tmp_path: Path) -> None:
    missing = GRPCServerTLS(cert_file=tmp_path / "nope.crt", key_file=tmp_path / "nope.key")
    with pytest.raises(TLSFilesError, match=r"grpc\.scaler\.tls: cannot read .*nope"):
        ReloadingServerCredentials(missing, "scaler")
