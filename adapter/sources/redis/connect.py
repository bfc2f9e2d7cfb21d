"""One redis-py asyncio client (with its one connection pool) per configured source, in any of the three modes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.credentials import CredentialProvider

from adapter.config.base import SecretFile, split_address
from adapter.config.redis import RedisSource

# One quick reconnect inside a query (a failover or a dropped idle connection), then the error
# goes to the cache, which keeps the last good value and tries again next interval.
_RETRY = Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1)


@dataclass
class RedisConnection:
    """The client reads go through, plus what else must be closed with it."""

    client: Redis | RedisCluster
    target: str  # host:port list for messages: never credentials
    extra: list[Redis] = field(default_factory=list)  # Sentinel clients

    async def close(self) -> None:
        await self.client.aclose()
        for other in self.extra:
            await other.aclose()


class FileCredentials(CredentialProvider):
    """Reads the ACL user and password from their files at every new connection, so a rotated secret
    is picked up on the next reconnect without a restart."""

    def __init__(self, username: SecretFile | None, password: SecretFile | None) -> None:
        self._username = username
        self._password = password

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self._password.read() if self._password is not None else ""
        if self._username is None:
            return (password,)
        return self._username.read(), password

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()

    def __repr__(self) -> str:
        return "FileCredentials(...)"  # never the secrets


def _auth(username: SecretFile | None, password: SecretFile | None) -> dict[str, Any]:
    if username is None and password is None:
        return {}
    return {"credential_provider": FileCredentials(username, password)}


def _tls(config: RedisSource) -> dict[str, Any]:
    if config.tls is None:
        return {}
    tls = config.tls
    kwargs: dict[str, Any] = {"ssl": True, "ssl_check_hostname": tls.verify_hostname}
    if tls.ca_file is not None:
        kwargs["ssl_ca_certs"] = str(tls.ca_file)
    if tls.cert_file is not None:
        kwargs["ssl_certfile"] = str(tls.cert_file)
    if tls.key_file is not None:
        kwargs["ssl_keyfile"] = str(tls.key_file)
    return kwargs


def _common(config: RedisSource) -> dict[str, Any]:
    return {
        "socket_connect_timeout": config.connect_timeout,
        # No per-reply read timeout: it would cost a timer per command of a 1,000-command pipeline.
        # The batcher bounds each whole pipeline by `timeout` instead.
        "socket_timeout": None,
        "decode_responses": True,
        "retry": _RETRY,
        "health_check_interval": 30,
        **_auth(config.username, config.password),
        **_tls(config),
    }


def connect(config: RedisSource) -> RedisConnection:
    """Build the client; no connection is opened until the first command."""
    common = _common(config)
    match config.mode:
        case "standalone":
            assert config.url is not None
            # from_url picks TLS by the scheme: a `tls:` section means rediss:// whatever the URL says.
            url = config.url
            if common.pop("ssl", False):
                url = "rediss://" + url.removeprefix("redis://").removeprefix("rediss://")
            client = Redis.from_url(url, db=config.db, max_connections=config.max_connections, **common)
            kwargs = client.get_connection_kwargs()  # type: ignore[no-untyped-call]
            return RedisConnection(client, f"redis {kwargs.get('host')}:{kwargs.get('port')}")
        case "sentinel":
            sentinel_config = config.sentinel
            assert sentinel_config is not None
            sentinel_kwargs = {
                "socket_connect_timeout": config.connect_timeout,
                "socket_timeout": config.timeout,
                "decode_responses": True,
                **_auth(sentinel_config.username, sentinel_config.password),
                **_tls(config),
            }
            addresses = [split_address(a) for a in sentinel_config.addresses]
            sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
            master = sentinel.master_for(
                sentinel_config.master_name, db=config.db, max_connections=config.max_connections, **common
            )
            target = f"master {sentinel_config.master_name!r} via Sentinel {','.join(sentinel_config.addresses)}"
            return RedisConnection(master, target, extra=list(sentinel.sentinels))
        case "cluster":
            nodes = [ClusterNode(*split_address(a)) for a in config.cluster_nodes]
            cluster = RedisCluster(startup_nodes=nodes, max_connections=config.max_connections, **common)
            return RedisConnection(cluster, f"Redis Cluster {','.join(config.cluster_nodes)}")


def node_client(config: RedisSource, host: str, port: int) -> Redis:
    """A client for one Cluster node, with the source's credentials and TLS (for its keyspace subscriber)."""
    return Redis(host=host, port=port, max_connections=2, **_common(config))
