"""`delegate:`: another external metrics API server (KEDA's, prometheus-adapter's) that answers every metric
name Zeroscale does not serve itself, so both can live behind the one `v1beta1.external.metrics.k8s.io`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from adapter.config.base import Duration, Strict, credential_in_url
from adapter.config.kube import SERVICE_ACCOUNT_DIR


class DelegateService(Strict):
    """A Service in the cluster, reached at `https://<name>.<namespace>.svc:<port>`."""

    namespace: str
    """The Service's namespace."""
    name: str
    """The Service's name."""
    port: int = Field(default=443, ge=1, le=65535)
    """The Service's port."""


class DelegateConfig(Strict):
    """Exactly one of `service` or `url`; always HTTPS, its certificate checked against `ca_file`."""

    service: DelegateService | None = None
    """The delegate as a Service in the cluster (or give url)."""
    url: str | None = None
    """The delegate's `https://host[:port]` (or give service)."""
    ca_file: Path | None = None
    """The CA that signed the delegate's serving certificate (KEDA: ca.crt of the Secret kedaorg-certs)."""
    server_name: str | None = None
    """The name the delegate's certificate must carry; default: the Service's DNS name, or the URL's host."""
    token_file: Path = SERVICE_ACCOUNT_DIR / "token"
    """Zeroscale's own identity towards the delegate (re-read every minute: projected tokens rotate)."""
    timeout: Duration = Field(default=5.0, gt=0, le=55)
    """One deadline for the whole call: connect, TLS handshake, request and the complete answer."""
    max_response_bytes: int = Field(default=1_048_576, ge=4096)
    """The largest answer read from the delegate; a larger one fails the call."""
    max_in_flight: int = Field(default=64, ge=1)
    """Calls to the delegate at once; more wait for a slot within `timeout`."""
    discovery_refresh: Duration = Field(default=60.0, gt=0)
    """How often the delegate's discovery document is fetched again (sooner after a failure)."""

    @field_validator("url")
    @classmethod
    def _https_without_credentials(cls, url: str | None) -> str | None:
        if url is None:
            return url
        found = credential_in_url(url)
        if found is not None:
            raise ValueError(f"url must not hold a credential ({found}): the delegate is called with token_file")
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"url {url!r} must be https://host[:port] (the delegate is always called over TLS)")
        return url

    @model_validator(mode="after")
    def _one_target(self) -> DelegateConfig:
        if (self.service is None) == (self.url is None):
            raise ValueError("set exactly one of delegate.service or delegate.url")
        return self

    def address(self) -> tuple[str, int]:
        """(host, port) to connect to."""
        if self.service is not None:
            return f"{self.service.name}.{self.service.namespace}.svc", self.service.port
        parts = urlsplit(self.url or "")
        return parts.hostname or "", parts.port or 443

    def describe(self) -> str:
        """How the delegate is named in messages, logs and metrics."""
        if self.service is not None:
            return f"service {self.service.namespace}/{self.service.name}"
        return f"{self.url}"
