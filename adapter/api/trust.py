"""Where the trusted client CAs and front-proxy settings come from, kept current.

Either files (`auth.request_header.client_ca_file` with the configured allowed names and
header names, `auth.client_ca_file`), re-read when they change, or the
`kube-system/extension-apiserver-authentication` ConfigMap (docs/protocols.md#authn-configmap), listed and then
watched so that rotated CAs apply without a restart. `auth.client_ca_file`, when set,
overrides the ConfigMap's `client-ca-file`. Each new TrustBundle goes to `publish`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509

from adapter.api.authn import TrustBundle, load_pem_bundle
from adapter.api.tls import file_state
from adapter.config.server import AuthConfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeError
from adapter.kube.watching import field
from adapter.telemetry import api as telemetry

log = logging.getLogger(__name__)

CONFIGMAP_NAMESPACE = "kube-system"
CONFIGMAP_NAME = "extension-apiserver-authentication"
CONFIGMAPS = f"/api/v1/namespaces/{CONFIGMAP_NAMESPACE}/configmaps"
WHERE = f"{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}"
_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)

Publish = Callable[[TrustBundle], None]


def _lower(names: list[str]) -> tuple[str, ...]:
    return tuple(name.lower() for name in names)


def _file_bundle(path: Path | None, what: str) -> tuple[x509.Certificate, ...]:
    if path is None:
        return ()
    try:
        return load_pem_bundle(path.read_bytes(), f"{what} {path}")
    except OSError as err:
        raise ValueError(f"{what} {path}: {err.strerror}") from None


def bundle_from_files(config: AuthConfig) -> TrustBundle:
    """The bundle the config's files describe; raise ValueError naming the bad file."""
    header = config.request_header
    return TrustBundle(
        requestheader_cas=_file_bundle(header.client_ca_file, "auth.request_header.client_ca_file"),
        allowed_names=frozenset(header.allowed_names),
        username_headers=_lower(header.username_headers),
        uid_headers=_lower(header.uid_headers),
        group_headers=_lower(header.group_headers),
        extra_prefixes=_lower(header.extra_headers_prefix),
        client_cas=_file_bundle(config.client_ca_file, "auth.client_ca_file"),
    )


def bundle_from_configmap(data: dict[str, Any], config: AuthConfig) -> TrustBundle:
    """The bundle an extension-apiserver-authentication ConfigMap describes; raise ValueError."""

    def text(key: str) -> str:
        raw = data.get(key)
        if raw is not None and not isinstance(raw, str):
            raise ValueError(f"ConfigMap key {key} is not a string")
        return raw or ""

    def names(key: str) -> list[str]:
        raw = text(key)
        if not raw:
            return []
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValueError(f"ConfigMap key {key} is not a JSON array") from None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"ConfigMap key {key} is not a JSON array of strings")
        return value

    def cas(key: str) -> tuple[x509.Certificate, ...]:
        pem = text(key)
        return load_pem_bundle(pem.encode(), f"ConfigMap key {key}") if pem else ()

    return TrustBundle(
        requestheader_cas=cas("requestheader-client-ca-file"),
        allowed_names=frozenset(names("requestheader-allowed-names")),
        username_headers=_lower(names("requestheader-username-headers")),
        uid_headers=_lower(names("requestheader-uid-headers")),
        group_headers=_lower(names("requestheader-group-headers")),
        extra_prefixes=_lower(names("requestheader-extra-headers-prefix")),
        client_cas=(
            _file_bundle(config.client_ca_file, "auth.client_ca_file")
            if config.client_ca_file
            else cas("client-ca-file")
        ),
    )


def uses_configmap(config: AuthConfig) -> bool:
    return config.request_header.client_ca_file is None and config.request_header.from_configmap


class TrustWatcher:
    def __init__(self, config: AuthConfig, client: KubeClient | None, publish: Publish, poll_seconds: float) -> None:
        self._config = config
        self._client = client
        self._publish = publish
        self._poll = poll_seconds
        self._files_seen: object = None

    async def load(self) -> None:
        """The first bundle, before serving. Files must be readable; an unreadable ConfigMap is retried later."""
        if not uses_configmap(self._config):
            self._files_seen = self._files_state()
            self._publish(bundle_from_files(self._config))
            return
        try:
            await self._read_configmap()
        except (KubeError, ValueError) as err:
            log.error("cannot read %s yet (front-proxy auth off until it can): %s", WHERE, err)

    async def run(self) -> None:
        """Keep the bundle current until cancelled."""
        if uses_configmap(self._config):
            await self._watch_configmap()
        else:
            await self._poll_files()

    def _files_state(self) -> tuple[object, ...]:
        paths = (self._config.request_header.client_ca_file, self._config.client_ca_file)
        return tuple(file_state(path) if path else None for path in paths)

    async def _poll_files(self) -> None:
        while True:
            await asyncio.sleep(self._poll)
            state = self._files_state()
            if state == self._files_seen:
                continue
            try:
                bundle = bundle_from_files(self._config)
            except ValueError as err:
                telemetry.TLS_RELOADS.labels("client-cas", "failure").inc()
                log.warning("client CA files changed but cannot be loaded, keeping the previous ones: %s", err)
                continue
            self._files_seen = state
            self._publish(bundle)

    async def _read_configmap(self) -> str:
        assert self._client is not None
        _, configmap = await self._client.request("GET", f"{CONFIGMAPS}/{CONFIGMAP_NAME}")
        self._apply(configmap)
        return str(field(configmap, "metadata").get("resourceVersion", ""))

    def _apply(self, configmap: dict[str, Any]) -> None:
        try:
            bundle = bundle_from_configmap(field(configmap, "data"), self._config)
        except ValueError as err:
            telemetry.TLS_RELOADS.labels("client-cas", "failure").inc()
            log.error("%s refused, keeping the previous trust: %s", WHERE, err)
            return
        self._publish(bundle)

    async def _watch_configmap(self) -> None:
        assert self._client is not None
        failures = 0
        while True:
            try:
                version = await self._read_configmap()
                path = f"{CONFIGMAPS}?fieldSelector=metadata.name%3D{CONFIGMAP_NAME}"
                async for event in self._client.watch(path, version):
                    failures = 0
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._apply(field(event, "object"))
            except KubeError as err:
                failures += 1
                log.warning("watch of %s failed: %s", WHERE, err)
            await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
