"""A rotated certificate is checked before gRPC gets it: a broken pair keeps the previous one (issue 20 item 6)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from adapter.config.grpc import GRPCServerTLS
from adapter.rpc.tls import ReloadingServerCredentials, TLSFilesError
from tests.rpc.conftest import Routes, StartCounts, start_counts
from tests.rpc.test_tls import NAME, write_pair

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
