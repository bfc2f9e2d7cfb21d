"""Failures name their cause and never become zeros; ACL users; TLS with client certificates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from adapter.children import port_outside_ephemeral
from adapter.config.server import CacheConfig
from adapter.metrics.cache import MetricCache
from adapter.metrics.catalogue import Catalogue
from adapter.metrics.errors import MetricUnavailable
from adapter.sources.base import SourceError
from tests.fixtures.netutil import refused_port
from tests.fixtures.redis_servers import RedisProcess
from tests.sources.redis.fixtures import Make, query_for, redis_metric


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def own_server(redis_dir: Path) -> Iterator[RedisProcess]:
    """A server this test may stop and start again on the same port."""
    server = RedisProcess(redis_dir / "own", []).start()  # a directory per port below it
    yield server
    server.stop()


async def test_server_down_is_an_error_naming_the_address(make_source: Make) -> None:
    port = refused_port()
    source = make_source(url=f"redis://127.0.0.1:{port}", connect_timeout=1)
    with pytest.raises(SourceError, match=rf"cannot reach redis 127\.0\.0\.1:{port}"):
        await source.query(query_for(redis_metric("length"), "key=jobs"))
    with pytest.raises(SourceError, match="cannot reach"):
        await source.check()


async def test_last_good_value_then_503_then_reconnect(own_server: RedisProcess, make_source: Make) -> None:
    own_server.client().rpush("jobs", 1, 2, 3)
    source = make_source(url=f"redis://{own_server.address}", connect_timeout=1, timeout=1)
    metric = redis_metric("length", interval=60, max_staleness=30)
    clock = Clock()
    cache = MetricCache(Catalogue([metric]), {"q": source}, CacheConfig(), clock=clock)
    try:
        assert (await cache.read(metric.name, "default", "key=jobs")).value == 3
        own_server.stop()
        clock.now += 20  # younger than max_staleness: the last good value
        assert (await cache.read(metric.name, "default", "key=jobs")).value == 3
        clock.now += 20  # now older: an error naming the cause, never a zero
        with pytest.raises(MetricUnavailable, match="cannot reach redis"):
            await cache.read(metric.name, "default", "key=jobs")
        own_server.start()
        own_server.client().rpush("jobs", 1, 2, 3, 4, 5)
        clock.now += 61  # past the failure back-off: the next read reconnects
        assert (await cache.read(metric.name, "default", "key=jobs")).value == 5
    finally:
        await cache.close()


@pytest.fixture
def acl_users(server: RedisProcess) -> RedisProcess:
    r = server.client()
    r.acl_setuser("reader", enabled=True, passwords=["+s3cret-pass"], keys=["*"], commands=["+@read", "+ping"])
    r.acl_setuser("lister", enabled=True, passwords=["+other-pass"], keys=["*"], commands=["+type", "+llen", "+ping"])
    return server


async def test_acl_user_with_password_from_files(
    acl_users: RedisProcess, make_source: Make, secret: Callable[[str], dict[str, str]]
) -> None:
    acl_users.client().rpush("jobs", "a", "b")
    source = make_source(url=f"redis://{acl_users.address}", username=secret("reader"), password=secret("s3cret-pass"))
    samples = await source.query(query_for(redis_metric("length"), "key=jobs"))
    assert samples[0].value == Decimal(2)


async def test_wrong_password_names_authentication_and_hides_the_secret(
    acl_users: RedisProcess, make_source: Make, secret: Callable[[str], dict[str, str]]
) -> None:
    source = make_source(url=f"redis://{acl_users.address}", username=secret("reader"), password=secret("guessed-pw"))
    with pytest.raises(SourceError, match=r"authentication to redis .* failed") as raised:
        await source.query(query_for(redis_metric("length"), "key=jobs"))
    assert "guessed-pw" not in str(raised.value)


async def test_missing_acl_permission_is_named(
    acl_users: RedisProcess, make_source: Make, secret: Callable[[str], dict[str, str]]
) -> None:
    acl_users.client().xadd("events", {"a": 1})
    source = make_source(url=f"redis://{acl_users.address}", username=secret("lister"), password=secret("other-pass"))
    with pytest.raises(SourceError, match="ACL user may not run XLEN on key 'events'"):
        await source.query(query_for(redis_metric("stream_length"), "key=events"))


@pytest.fixture(scope="module")
def tls_server(redis_dir: Path, tls_files: dict[str, Path]) -> Iterator[RedisProcess]:
    port = port_outside_ephemeral()
    server = RedisProcess(
        redis_dir,
        [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {tls_files['server_cert']}",
            f"tls-key-file {tls_files['server_key']}",
            f"tls-ca-cert-file {tls_files['ca']}",
            "tls-auth-clients yes",
        ],
        port=port,
    ).start()
    yield server
    server.stop()


async def test_tls_with_client_certificate(
    tls_server: RedisProcess, tls_files: dict[str, Path], make_source: Make
) -> None:
    tls = {"ca_file": tls_files["ca"], "cert_file": tls_files["client_cert"], "key_file": tls_files["client_key"]}
    setup = make_source(name="setup", url=f"rediss://{tls_server.address}", tls=tls)
    await setup._connection.client.rpush("jobs", "a", "b", "c")
    source = make_source(url=f"rediss://{tls_server.address}", tls=tls)
    samples = await source.query(query_for(redis_metric("length"), "key=jobs"))
    assert samples[0].value == Decimal(3)


async def test_tls_without_client_certificate_is_refused(
    tls_server: RedisProcess, tls_files: dict[str, Path], make_source: Make
) -> None:
    source = make_source(url=f"rediss://{tls_server.address}", tls={"ca_file": tls_files["ca"]}, connect_timeout=2)
    with pytest.raises(SourceError, match=f"redis 127.0.0.1:{tls_server.port}"):
        await source.query(query_for(redis_metric("length"), "key=jobs"))


async def test_a_rotated_password_is_read_again_from_its_file(
    acl_users: RedisProcess, make_source: Make, tmp_path: Path
) -> None:
    acl_users.client().rpush("jobs", "a")
    password = tmp_path / "password"
    password.write_text("s3cret-pass\n", encoding="utf-8")
    source = make_source(
        url=f"redis://{acl_users.address}",
        username={"file": str(secret_file(tmp_path))},
        password={"file": str(password)},
    )
    query = query_for(redis_metric("length"), "key=jobs")
    assert (await source.query(query))[0].value == 1
    admin = acl_users.client()
    admin.acl_setuser("reader", enabled=True, reset_passwords=True, passwords=["+rotated-pass"])
    admin.client_kill_filter(user="reader")  # the server drops the old sessions
    with pytest.raises(SourceError, match="authentication"):
        await source.query(query)
    password.write_text("rotated-pass\n", encoding="utf-8")
    assert (await source.query(query))[0].value == 1


def secret_file(directory: Path) -> Path:
    path = directory / "username"
    path.write_text("reader\n", encoding="utf-8")
    return path
