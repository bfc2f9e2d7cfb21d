"""How to reach the Kubernetes API (TokenReview, SubjectAccessReview, ConfigMap, scale, EndpointSlices)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from adapter.config.base import Duration, Strict, credential_in_url

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeAPIConfig(Strict):
    """Defaults are the in-cluster ones; outside a cluster set `kubeconfig` or `url` and the files."""

    kubeconfig: Path | None = None
    """A kubeconfig file to read the API's address and credentials from (outside a cluster)."""
    url: str | None = None
    """The API server's URL; unset: the in-cluster one (or the kubeconfig's)."""
    ca_file: Path | None = None
    """The CA of the API server's certificate; unset: the service account's."""
    token_file: Path | None = None
    """A bearer token file (re-read as it rotates); unset: the service account's."""
    client_cert_file: Path | None = None
    """A client certificate to authenticate with instead of a token."""
    client_key_file: Path | None = None
    """The client certificate's private key."""
    timeout: Duration = 10.0
    """The longest one API request may take (watches excepted)."""
    watch_silence_timeout: Duration = Field(default=30.0, ge=2)
    """The most a watch's copy of the world may lag behind the API when the stream goes silent (open, but nothing sent:
    no event, no bookmark): the watch is then taken for dead, and its collection listed and watched again. The server is
    asked to end each watch a little sooner (docs/architecture.md#staleness-bounds)."""

    @field_validator("url")
    @classmethod
    def _no_credential(cls, url: str | None) -> str | None:
        found = credential_in_url(url) if url is not None else None
        if found is not None:
            raise ValueError(f"url must not hold a credential ({found}): use token_file or client_cert_file")
        return url
