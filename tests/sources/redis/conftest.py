"""Fixtures of the Redis source tests: real redis-server / redis-sentinel processes on loopback ports outside
the ephemeral range (docs/architecture.md#no-port-races)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from adapter.config.redis import RedisSource
from adapter.sources.redis.source import RedisQueues
from tests.fixtures.redis_servers import RedisProcess, require_binaries
from tests.sources.redis.fixtures import Make

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs Debian's redis-server: `-m "not redis"` skips them all."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.redis)


@pytest.fixture(scope="session")
def redis_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_binaries()
    return tmp_path_factory.mktemp("redis")


@pytest.fixture(scope="session")
def standalone_server(redis_dir: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(redis_dir, ['notify-keyspace-events ""']).start()
    yield server
    server.stop()


@pytest.fixture
def server(standalone_server: RedisProcess) -> RedisProcess:
    """The shared standalone server, emptied, with keyspace events off and only the default user."""
    client = standalone_server.client()
    client.flushall()
    client.config_set("notify-keyspace-events", "")
    for user in client.acl_users():
        if user != "default":
            client.acl_deluser(str(user))
    client.close()
    return standalone_server


@pytest.fixture(scope="session")
def tls_files(redis_dir: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as files."""
    ca = trustme.CA(organization_name="redis-test-ca")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("zeroscale-client")
    files = {
        "ca": redis_dir / "ca.pem",
        "server_cert": redis_dir / "server.pem",
        "server_key": redis_dir / "server.key",
        "client_cert": redis_dir / "client.pem",
        "client_key": redis_dir / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


@pytest.fixture
def secret(tmp_path: Path) -> Callable[[str], dict[str, str]]:
    """Write a secret to a file and return the config value naming it."""
    counter = iter(range(1000))

    def write(value: str) -> dict[str, str]:
        path = tmp_path / f"secret-{next(counter)}"
        path.write_text(value + "\n", encoding="utf-8")
        return {"file": str(path)}

    return write


@pytest.fixture
async def make_source() -> AsyncIterator[Make]:
    """Build RedisQueues from config keys (as in the YAML file); every one is closed after the test."""
    made: list[RedisQueues] = []

    def make(**config: Any) -> RedisQueues:
        config.setdefault("name", "q")
        source = RedisQueues(RedisSource(type="redis", **config))
        made.append(source)
        return source

    yield make
    for source in made:
        await source.close()
