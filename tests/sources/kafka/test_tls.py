"""TLS to the broker with a client certificate, all from files."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from adapter.sources.base import SourceError
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, lag_metric, read_lag, source_config

pytestmark = pytest.mark.kafka


async def test_lag_over_mutual_tls(kafka: KafkaDriver, broker: KafkaBroker, tls_dir: Path, name: str) -> None:
    await kafka.topic(name, 1)
    await kafka.produce(name, {0: 6})
    await kafka.commit(name, {(name, 0): 2})
    tls = {"ca_file": tls_dir / "ca.pem", "cert_file": tls_dir / "client.pem", "key_file": tls_dir / "client.key"}
    source = KafkaLag(source_config(broker.tls_bootstrap, tls=tls))
    try:
        assert await read_lag(source, lag_metric(source.name), f"group={name}") == 4
    finally:
        await source.close()


async def test_untrusted_broker_certificate_is_named(broker: KafkaBroker, tmp_path: Path, name: str) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    source = KafkaLag(source_config(broker.tls_bootstrap, tls={"ca_file": other_ca}))
    try:
        with pytest.raises(SourceError, match=r"TLS handshake with 127\.0\.0\.1:\d+ failed: CERTIFICATE_VERIFY_FAILED"):
            await read_lag(source, lag_metric(source.name), f"group={name}")
    finally:
        await source.close()


async def test_unreadable_tls_files_are_named(tmp_path: Path, name: str) -> None:
    source = KafkaLag(source_config("127.0.0.1:1", tls={"ca_file": tmp_path / "absent.pem"}))
    try:
        with pytest.raises(SourceError, match="cannot load the TLS files"):
            await read_lag(source, lag_metric(source.name), f"group={name}")
    finally:
        await source.close()
