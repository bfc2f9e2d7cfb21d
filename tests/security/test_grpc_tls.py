"""A rotated certificate is checked before gRPC gets it: a broken pair keeps the previous one (issue 20 item 6)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from adapter.config.grpc import GRPCServerTLS
from adapter.rpc.tls import ReloadingServerCredentials, TLSFilesError
from tests.fixtures.grpc_servers import Routes, StartCounts, start_counts
from tests.fixtures.replicas import ROOT
from tests.rpc.test_tls import NAME, mutual_tls, write_pair

__all__ = ["start_counts"]  # fixture used here


def reloads(result: str) -> float:
    return REGISTRY.get_sample_value("zeroscale_grpc_tls_reloads_total", {"server": "counts", "result": result}) or 0


async def serving(port: int, ca: trustme.CA) -> bool:
    """Whether a fresh TLS connection (a new handshake, so a reload check) gets an answer."""
    credentials = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
    options = [("grpc.ssl_target_name_override", NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError:
            return False
        return True


async def test_a_broken_pair_is_refused_counted_and_the_previous_one_kept(
    tmp_path: Path, start_counts: StartCounts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ca = trustme.CA()
    cert, key = write_pair(ca, tmp_path, "server", NAME)
    good_cert, good_key = cert.read_bytes(), key.read_bytes()
    server = await start_counts(Routes("web"), tls={"cert_file": cert, "key_file": key, "reload_interval": 0.05})
    assert await serving(server.port, ca)
    other = ca.issue_cert(NAME)
    breakages = {
        "truncated certificate": (good_cert[: len(good_cert) // 2], good_key),
        "key of another certificate": (good_cert, other.private_key_pem.bytes()),
        "garbage key": (good_cert, b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"),
    }
    for what, (cert_pem, key_pem) in breakages.items():
        errors, oks = reloads("error"), reloads("ok")
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        await asyncio.sleep(0.1)
        assert await serving(server.port, ca), f"{what}: the previous pair should still serve"
        assert reloads("error") > errors, what
        assert reloads("ok") == oks, what
    assert any("keeping the previous pair" in record.getMessage() for record in caplog.records)
    # A good pair again is taken.
    oks = reloads("ok")
    cert.write_bytes(other.cert_chain_pems[0].bytes())
    key.write_bytes(other.private_key_pem.bytes())
    await asyncio.sleep(0.1)
    assert await serving(server.port, ca)
    assert reloads("ok") == oks + 1


def test_a_broken_pair_stops_the_start(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write_pair(ca, tmp_path, "server", NAME)
    key.write_bytes(ca.issue_cert(NAME).private_key_pem.bytes())
    with pytest.raises(TLSFilesError, match=r"grpc\.counts\.tls: .*the key does not belong to the certificate"):
        ReloadingServerCredentials(GRPCServerTLS(cert_file=cert, key_file=key), "counts")


_FAILED_HANDSHAKES = """
import asyncio, ssl, sys
from pathlib import Path
from adapter.config.grpc import CountsServerConfig  # the package is imported first, as `zeroscale proxy` does
from adapter.proxy.counts_stream import start_counts_server

async def main() -> None:
    tls = {"cert_file": sys.argv[1], "key_file": sys.argv[2], "client_ca_file": sys.argv[3]}
    config = CountsServerConfig(enabled=True, bind="127.0.0.1", port=0, tls=tls)
    server = await start_counts_server(config, lambda listener: lambda: None)
    anonymous = ssl.create_default_context()
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    for _ in range(30):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=anonymous, server_hostname="x")
            writer.close()
        except (OSError, ssl.SSLError):
            pass
    await asyncio.sleep(0.3)
    await server.stop()
    print("done")

asyncio.run(main())
"""


def test_failed_handshakes_do_not_flood_the_log(tmp_path: Path) -> None:
    """Review finding 8: gRPC's C core wrote an unthrottled stderr line per failed TLS handshake (300 in 0.8 s)."""
    tls = mutual_tls(tmp_path)
    server = tls.server
    args = [str(server["cert_file"]), str(server["key_file"]), str(server["client_ca_file"])]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GRPC_")}
    done = subprocess.run(
        [sys.executable, "-c", _FAILED_HANDSHAKES, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        cwd=ROOT,
        check=False,
    )
    assert done.stdout.strip() == "done", done.stderr[-2000:]
    core_lines = [line for line in done.stderr.splitlines() if ".cc:" in line]
    assert not core_lines, f"{len(core_lines)} lines from gRPC's C core, e.g. {core_lines[:3]}"
