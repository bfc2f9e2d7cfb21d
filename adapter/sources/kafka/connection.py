"""The connection of one `kafka` source: an aiokafka client kept for the source's lifetime.

aiokafka keeps one connection per broker and reconnects on the next request after a failure;
this wrapper bootstraps lazily (so a broker that is down at start is retried on every read),
counts requests, and turns every failure into a SourceError that names the cause. aiokafka
logs connection failures but raises a generic "node not ready", so on a failure one probe
connection is opened to learn why (refused, TLS, wrong password).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError, NodeNotReadyError, RequestTimedOutError, SaslAuthenticationFailed
from aiokafka.helpers import create_ssl_context

from adapter.config.kafka import KafkaSource
from adapter.sources.base import SourceError
from adapter.telemetry import kafka as telemetry

# aiokafka's own background metadata refresh; ours is explicit (see offsets.MetadataReader).
_BACKGROUND_METADATA_MS = 300_000
_PROBE_REUSE = 1.0  # seconds
_DEFAULT_PORT = 9092


class KafkaConnection:
    def __init__(self, config: KafkaSource) -> None:
        self._config = config
        self._client: AIOKafkaClient | None = None
        self._lock = asyncio.Lock()
        self._probes: dict[str, asyncio.Task[str]] = {}

    @property
    def source_name(self) -> str:
        return self._config.name

    def _options(self) -> dict[str, Any]:
        """Client settings; secrets are read from their files here, at each (re)connect."""
        config = self._config
        options: dict[str, Any] = {
            "bootstrap_servers": config.bootstrap_servers,
            "client_id": config.client_id,
            "request_timeout_ms": int(config.request_timeout * 1000),
            "metadata_max_age_ms": _BACKGROUND_METADATA_MS,
        }
        context: ssl.SSLContext | None = None
        if config.tls is not None:
            try:
                context = create_ssl_context(
                    cafile=config.tls.ca_file, certfile=config.tls.cert_file, keyfile=config.tls.key_file
                )
            except (OSError, ssl.SSLError) as err:
                raise SourceError(f"cannot load the TLS files: {err}") from err
            context.check_hostname = config.tls.verify_hostname
            options["ssl_context"] = context
        if config.sasl is not None:
            try:
                username, password = config.sasl.read_username(), config.sasl.password.read()
            except OSError as err:
                raise SourceError(f"cannot read the SASL credentials file: {err.strerror} ({err.filename})") from err
            options |= {
                "sasl_mechanism": config.sasl.mechanism,
                "sasl_plain_username": username,
                "sasl_plain_password": password,
            }
        tls, sasl = context is not None, config.sasl is not None
        options["security_protocol"] = {
            (False, False): "PLAINTEXT",
            (True, False): "SSL",
            (False, True): "SASL_PLAINTEXT",
            (True, True): "SASL_SSL",
        }[(tls, sasl)]
        return options

    async def client(self) -> AIOKafkaClient:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                options = self._options()
                client = AIOKafkaClient(**options)
                telemetry.REQUESTS.labels(self.source_name, "Metadata").inc()
                try:
                    await client.bootstrap()
                except (KafkaError, OSError) as err:
                    await client.close()
                    telemetry.REQUEST_ERRORS.labels(self.source_name, "Metadata").inc()
                    cause = await self._probe(options, *_host_port(self._config.bootstrap_servers[0]))
                    raise SourceError(
                        f"cannot bootstrap from {', '.join(self._config.bootstrap_servers)}: {cause}"
                    ) from err
                self._client = client
        return self._client

    async def send(self, node_id: int, request: Any, api: str) -> Any:
        """Send one request to one broker; raise SourceError naming the API, the broker and the cause."""
        client = await self.client()
        # Counted once tried: a request the connection refuses to build (a version the broker lacks) is not.
        try:
            response = await client.send(node_id, request)
        except (KafkaError, OSError) as err:
            telemetry.REQUESTS.labels(self.source_name, api).inc()
            telemetry.REQUEST_ERRORS.labels(self.source_name, api).inc()
            raise SourceError(f"{api} request to broker {node_id} failed: {await self._cause(err, node_id)}") from err
        telemetry.REQUESTS.labels(self.source_name, api).inc()
        return response

    def any_broker(self) -> int:
        """A broker for cluster-wide requests (Metadata, FindCoordinator)."""
        assert self._client is not None, "client() first"
        node = self._client.get_random_node()
        if node is None:
            raise SourceError("the cluster metadata lists no brokers")
        return int(node)

    def counted_error(self, api: str) -> None:
        """Count an error code found inside an answer (the request itself succeeded)."""
        telemetry.REQUEST_ERRORS.labels(self.source_name, api).inc()

    async def _cause(self, err: Exception, node_id: int) -> str:
        if isinstance(err, RequestTimedOutError):
            return f"no answer within {self._config.request_timeout:g}s (request_timeout)"
        if not isinstance(err, NodeNotReadyError) or self._client is None:
            return f"{type(err).__name__}: {err}"
        broker = self._client.cluster.broker_metadata(node_id)
        if broker is None:
            return f"broker {node_id} is not in the cluster metadata"
        return await self._probe(self._options(), broker.host, broker.port)

    async def _probe(self, options: dict[str, Any], host: str, port: int) -> str:
        """Why connecting to host:port fails, learnt by trying once; one try answers for every
        request that failed at about the same time (a round of 200 groups during an outage)."""
        where = f"{host}:{port}"
        probe = self._probes.get(where)
        if probe is None:
            probe = self._probes[where] = asyncio.create_task(self._try(options, host, port))
            loop = asyncio.get_running_loop()
            probe.add_done_callback(lambda _: loop.call_later(_PROBE_REUSE, self._probes.pop, where, None))
        return await asyncio.shield(probe)

    async def _try(self, options: dict[str, Any], host: str, port: int) -> str:
        where = f"{host}:{port}"
        try:
            conn = await create_conn(
                host,
                port,
                client_id=options["client_id"],
                request_timeout_ms=options["request_timeout_ms"],
                ssl_context=options.get("ssl_context"),
                security_protocol=options["security_protocol"],
                sasl_mechanism=options.get("sasl_mechanism"),
                sasl_plain_username=options.get("sasl_plain_username"),
                sasl_plain_password=options.get("sasl_plain_password"),
            )
        except SaslAuthenticationFailed as err:
            # A rotated password is read again on the next connect.
            await self._reset()
            mechanism = self._config.sasl.mechanism if self._config.sasl else "SASL"
            return f"authentication ({mechanism}) failed at {where}: {err}"
        except ssl.SSLError as err:
            return f"TLS handshake with {where} failed: {err.reason or err}"
        except (OSError, TimeoutError) as err:
            return f"cannot connect to {where}: {err.strerror or err}"
        except KafkaError as err:
            return f"connecting to {where} failed: {type(err).__name__}: {err}"
        conn.close()
        return f"connection to {where} failed, but a new one just succeeded"

    async def _reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def close(self) -> None:
        await self._reset()


def _host_port(server: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or a bare host (Kafka's default port)."""
    host, colon, port = server.rpartition(":")
    if not colon or not port.isdigit() or (":" in host and not host.startswith("[")):
        return server.strip("[]"), _DEFAULT_PORT
    return host.strip("[]"), int(port)
