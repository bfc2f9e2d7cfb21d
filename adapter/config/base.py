"""Building blocks shared by every part of the configuration."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def _parse_duration(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 500ms, 5s, 2m, 1h")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration: use seconds or a string like 500ms, 5s, 2m, 1h")
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return value


# Seconds, written in the config as a number or "500ms" / "5s" / "2m" / "1h". The JSON schema says both
# (the Helm chart's values.schema.json is generated from these models).
Duration = Annotated[
    float,
    BeforeValidator(_parse_duration),
    Field(ge=0),
    WithJsonSchema(
        {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": _DURATION.pattern}]},
        mode="validation",
    ),
]


_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port), brackets dropped; ValueError naming `address` otherwise."""
    match = _HOST_PORT.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return match.group(1).strip("[]"), int(match.group(2))


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches only this machine: `localhost` or a loopback IP."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Query parameters that carry a credential in the URL forms our clients accept (redis-py reads
# ?password= and ?username=; tokens and keys by other names are refused too).
_CREDENTIAL_PARAMETERS = frozenset(
    {"password", "passwd", "pass", "pwd", "secret", "token", "access_token", "auth", "apikey", "api_key", "api-key"}
)


def credential_in_url(url: str) -> str | None:
    """Where `url` carries a credential (its user-info password, a query parameter or fragment), or None.

    A secret in the config file is printed wherever the config is; credentials come from files.
    """
    parts = urlsplit(url)
    if parts.password is not None:
        return "a password in the user-info (user:password@)"
    for part, text in (("query", parts.query), ("fragment", parts.fragment)):
        for name, _ in parse_qsl(text, keep_blank_values=True):
            if name.strip().lower() in _CREDENTIAL_PARAMETERS:
                return f"a {name!r} parameter in the {part}"
    return None


class Strict(BaseModel):
    """Every config model refuses unknown keys, so a typo is an error and not a silent default."""

    # A string under a field is its description (the JSON schemas the chart and the CRD are generated with carry it).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class SecretFile(Strict):
    """A secret is named by the file that holds it; its content is read when needed and never logged."""

    file: Path
    """The file holding the secret; its content, without surrounding whitespace, is the value."""

    def read(self) -> str:
        return self.file.read_text(encoding="utf-8").strip()

    def __repr__(self) -> str:
        return f"SecretFile(file={str(self.file)!r})"


class TLSClientFiles(Strict):
    """TLS towards a queue system: CA bundle and optional client certificate and key, all files."""

    ca_file: Path | None = None
    """CA bundle the server's certificate is checked against; unset: the system CAs."""
    cert_file: Path | None = None
    """Client certificate (PEM), for a server that asks for one."""
    key_file: Path | None = None
    """The client certificate's private key (PEM)."""
    verify_hostname: bool = True
    """Check that the server's certificate names the host dialled."""


# In a selector label's pattern, this stands for the namespace the request comes from (regex-escaped).
NAMESPACE_PLACEHOLDER = "{namespace}"
# The namespace a pattern holding the placeholder is compiled with at config load (any DNS-1123 label would do).
_SAMPLE_NAMESPACE = "team-a"


class SelectorLabel(Strict):
    """A label the HPA's selector may (or must) give, and the pattern its values must match.

    The pattern keeps an HPA from making the adapter read arbitrary keys or groups. `{namespace}` in it stands for
    the namespace asking (an HPA's, a ScaledObject's), so `{namespace}_.+` lets each team read only its own groups
    or keys. Follow it with a character no namespace name holds (`_` or `.`): after `-`, namespace `team` would
    match team-a's `team-a-orders`.
    """

    pattern: str = ".+"
    """A regular expression each value the selector gives for the label must match in full; `{namespace}` stands for the
    namespace asking."""
    required: bool = False
    """The selector must give this label: a read without it is refused."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern.replace(NAMESPACE_PLACEHOLDER, re.escape(_SAMPLE_NAMESPACE)))
        except re.error as err:
            raise ValueError(f"not a valid regular expression: {err}") from err
        return pattern

    def bound(self, namespace: str) -> str:
        """The pattern as it applies to a request from `namespace`."""
        return self.pattern.replace(NAMESPACE_PLACEHOLDER, re.escape(namespace))

    def allows(self, value: str, namespace: str) -> bool:
        # re caches compiled patterns (a bounded cache): one per metric label and namespace asking at most.
        return re.fullmatch(self.bound(namespace), value) is not None


class SourceBase(Strict):
    """Connection settings for one queue system; subclasses add `type` and their own keys."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    """The source's name, which metrics give as their `source`."""


class MetricBase(Strict):
    """One external metric the HPA can ask for; subclasses add `type`, `query` and fixed parameters."""

    name: str = Field(pattern=r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
    """The metric name an HPA or ScaledObject asks for (matched case-insensitively)."""
    source: str
    """The name of the source (in `sources`) the metric reads: one of the metric's type."""
    labels: dict[str, SelectorLabel] = Field(default_factory=dict)
    """Labels the HPA's selector supplies; anything else in an `=`/`in` requirement is refused."""
    namespaces: list[str] = Field(default_factory=list)
    """Empty: every namespace may read this metric."""
    interval: Duration | None = None
    """How often each series of this metric is read from its source; unset: `cache.interval`."""
    max_staleness: Duration | None = None
    """A read whose last good value is older than this is answered 503; unset: `cache.max_staleness`."""
    activation_threshold: float = Field(default=1.0, allow_inf_nan=False)
    """A workload is active (KEDA IsActive) when the value is at least this. A number: NaN compares with no value, and
    the cache compares every reading with it (docs/architecture.md#edge-from-zero)."""

    @property
    def key(self) -> str:
        """Metric names are matched case-insensitively: the HPA always asks in lower case."""
        return self.name.lower()
