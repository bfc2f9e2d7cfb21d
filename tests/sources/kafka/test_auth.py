"""SASL on the broker's second listener: each mechanism works, a wrong password says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter.sources.base import SourceError
from adapter.sources.kafka.source import KafkaLag
from tests.fixtures.kafka_broker import PASSWORD, USER, KafkaBroker
from tests.sources.kafka.helpers import KafkaDriver, lag_metric, read_lag, source_config

pytestmark = pytest.mark.kafka


def sasl_source(broker: KafkaBroker, tmp_path: Path, mechanism: str, password: str) -> KafkaLag:
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    sasl = {"mechanism": mechanism, "username": USER, "password": {"file": secret}}
    return KafkaLag(source_config(broker.sasl_bootstrap, sasl=sasl))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
async def test_sasl_mechanisms(
    kafka: KafkaDriver, broker: KafkaBroker, tmp_path: Path, name: str, mechanism: str
) -> None:
    await kafka.topic(name, 2)
    await kafka.produce(name, {0: 4, 1: 2})
    await kafka.commit(name, {(name, 0): 1, (name, 1): 0})
    source = sasl_source(broker, tmp_path, mechanism, PASSWORD)
    try:
        assert await read_lag(source, lag_metric(source.name), f"group={name}") == 5
    finally:
        await source.close()


async def test_wrong_password_is_a_clear_error(broker: KafkaBroker, tmp_path: Path, name: str) -> None:
    source = sasl_source(broker, tmp_path, "SCRAM-SHA-512", "not-the-password")
    try:
        with pytest.raises(SourceError) as raised:
            await read_lag(source, lag_metric(source.name), f"group={name}")
        message = str(raised.value)
        assert "authentication (SCRAM-SHA-512) failed" in message
        assert broker.sasl_bootstrap in message
        assert "not-the-password" not in message
    finally:
        await source.close()


async def test_missing_password_file_is_named(broker: KafkaBroker, tmp_path: Path, name: str) -> None:
    sasl = {"mechanism": "PLAIN", "username": USER, "password": {"file": tmp_path / "absent"}}
    source = KafkaLag(source_config(broker.sasl_bootstrap, sasl=sasl))
    try:
        with pytest.raises(SourceError, match="cannot read the SASL credentials file"):
            await read_lag(source, lag_metric(source.name), f"group={name}")
    finally:
        await source.close()
