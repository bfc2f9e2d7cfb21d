"""Who is calling: front-proxy client certificate + X-Remote-* headers, ordinary client certificate, or bearer token.

Tried in the order the generic apiserver uses (docs/protocols.md#front-proxy-auth, docs/protocols.md#token-review):

1. Front proxy: the client certificate must be issued by a CA of the request-header bundle
   (re-verified here with `cryptography`: the TLS handshake trusted the union of both CA
   bundles and cannot say which one signed), its CN must be in the allowed names when that
   list is non-empty; only then are the username / uid / group / extra headers read.
2. Ordinary client certificate issued by a `client-ca-file` CA: the user is its CN, the
   groups its O values. X-Remote-* headers are never read for these.
3. `Authorization: Bearer <token>`: a TokenReview, cached by a hash of the token. Reviews are
   bounded: one in flight per distinct token (callers with the same token share it), at most
   `auth.max_token_reviews` at once (more are answered 429), and accepted tokens are cached apart
   from refused ones, so a flood of made-up tokens cannot evict the callers who have real ones.

Every authenticated user gets the group `system:authenticated`. A request with none of
these is refused (401); anonymous access is not offered. The certificate checks accept a
leaf issued directly by a bundle CA; intermediate CAs are not followed.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from dataclasses import dataclass
from urllib.parse import unquote

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from adapter.api.http import Request
from adapter.api.inflight import InFlight, ReviewsBusy
from adapter.api.ttlcache import TTLCache
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeError
from adapter.telemetry import api as telemetry
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)

AUTHENTICATED_GROUP = "system:authenticated"
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    # Sorted (key, values) pairs: hashable, so users can key the authorization cache.
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def with_authenticated_group(self) -> User:
        if AUTHENTICATED_GROUP in self.groups:
            return self
        return User(self.name, self.uid, (*self.groups, AUTHENTICATED_GROUP), self.extra)


@dataclass(frozen=True)
class TrustBundle:
    """What client certificates and front-proxy headers are trusted; replaced whole when it changes."""

    requestheader_cas: tuple[x509.Certificate, ...] = ()
    allowed_names: frozenset[str] = frozenset()
    username_headers: tuple[str, ...] = ()  # lower case
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ()
    extra_prefixes: tuple[str, ...] = ()
    client_cas: tuple[x509.Certificate, ...] = ()

    def tls_pem(self) -> bytes:
        """Every CA a client certificate may come from, for the TLS handshake."""
        seen: dict[bytes, None] = {}
        for ca in (*self.requestheader_cas, *self.client_cas):
            seen.setdefault(ca.public_bytes(serialization.Encoding.PEM), None)
        return b"".join(seen)


def load_pem_bundle(pem: bytes, origin: str) -> tuple[x509.Certificate, ...]:
    """Parse a PEM CA bundle; raise ValueError naming `origin` when it holds no certificate."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise ValueError(f"{origin}: not a PEM certificate bundle: {err}") from None
    return tuple(certificates)


class Unauthenticated(Exception):
    """No credentials, or credentials that did not check out: answered 401."""


def _issued_by_any(certificate: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> bool:
    for ca in cas:
        try:
            certificate.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def _names(certificate: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(attribute.value) for attribute in certificate.subject.get_attributes_for_oid(oid)]


@dataclass(frozen=True)
class _PeerVerdict:
    """What a connection's client certificate proves, under one trust bundle (memoized per connection)."""

    bundle: TrustBundle
    front_proxy: bool
    user: User | None
    expires: datetime.datetime | None


def _judge_peer(der: bytes | None, bundle: TrustBundle) -> _PeerVerdict:
    if der is None:
        return _PeerVerdict(bundle, False, None, None)
    certificate = x509.load_der_x509_certificate(der)
    now = datetime.datetime.now(datetime.UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        return _PeerVerdict(bundle, False, None, None)
    common_names = _names(certificate, NameOID.COMMON_NAME)
    common_name = common_names[0] if common_names else ""
    front_proxy = _issued_by_any(certificate, bundle.requestheader_cas) and (
        not bundle.allowed_names or common_name in bundle.allowed_names
    )
    user = None
    if common_name and _issued_by_any(certificate, bundle.client_cas):
        user = User(common_name, groups=tuple(_names(certificate, NameOID.ORGANIZATION_NAME)))
    return _PeerVerdict(bundle, front_proxy, user, certificate.not_valid_after_utc)


def _from_headers(request: Request, bundle: TrustBundle) -> User | None:
    """docs/protocols.md#front-proxy-auth steps 2-4: the user the front proxy vouches for, or None when it names
    none."""

    def first(names: tuple[str, ...]) -> str:
        for name in names:
            value = request.header(name)
            if value:
                return value
        return ""

    username = first(bundle.username_headers)
    if not username:
        return None
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    for name, value in request.headers:
        if name in bundle.group_headers:
            if value:
                groups.append(value)
            continue
        for prefix in bundle.extra_prefixes:
            if name.startswith(prefix):
                if value:  # as for groups (and as the generic apiserver does): an empty value says nothing
                    extra.setdefault(unquote(name[len(prefix) :]), []).append(value)
                break
    return User(
        username,
        first(bundle.uid_headers),
        tuple(groups),
        tuple(sorted((key, tuple(values)) for key, values in extra.items())),
    )


class TokenReviewer:
    """Bearer tokens checked by TokenReview; answers cached for `ttl` seconds, accepted and refused apart."""

    def __init__(self, client: KubeClient, ttl: float, size: int, max_in_flight: int) -> None:
        self._client = client
        self._ttl = ttl
        # The cache never holds a token itself, only its hash.
        self._accepted: TTLCache[bytes, User] = TTLCache(size)
        self._refused: TTLCache[bytes, bool] = TTLCache(size)
        self._in_flight: InFlight[bytes, User | None] = InFlight(
            max_in_flight, "TokenReviews", "server.auth.max_token_reviews"
        )

    async def review(self, token: str, source: str) -> User | None:
        """The token's user, None when it is refused; raise KubeError, or ReviewsBusy past the bound or the
        share of it one `source` (the caller's address) may take."""
        key = hashlib.sha256(token.encode()).digest()
        user = self._accepted.get(key)
        if user is not None:
            return user
        if self._refused.get(key):
            return None
        return await self._in_flight.run(key, source, lambda: self._review(token, key))

    async def _review(self, token: str, key: bytes) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        _, review = await self._client.request("POST", TOKENREVIEWS, body, secret=token)
        status = review.get("status") or {}
        info = status.get("user") or {}
        name = str(info.get("username", ""))
        if not status.get("authenticated") or not name:
            # An authenticated answer without a username names nobody: refused, as the apiserver does.
            self._refused.put(key, True, self._ttl)
            return None
        extra = info.get("extra") or {}
        user = User(
            name,
            str(info.get("uid", "")),
            tuple(info.get("groups") or ()),
            tuple(sorted((str(field), tuple(values)) for field, values in extra.items())),
        )
        self._accepted.put(key, user, self._ttl)
        return user


class Authenticator:
    def __init__(self, tokens: TokenReviewer | None) -> None:
        self._tokens = tokens
        self.bundle = TrustBundle()
        self._warnings = LogThrottle(60.0)  # a failing review path logs a line a minute

    async def authenticate(self, request: Request) -> User:
        """The caller, with `system:authenticated` added; raise Unauthenticated."""
        connection = request.connection
        verdict = connection.auth_memo
        now = datetime.datetime.now(datetime.UTC)
        if (
            not isinstance(verdict, _PeerVerdict)
            or verdict.bundle is not self.bundle
            or (verdict.expires is not None and now > verdict.expires)
        ):
            verdict = _judge_peer(connection.peer_certificate, self.bundle)
            connection.auth_memo = verdict
        if verdict.front_proxy:
            user = _from_headers(request, self.bundle)
            if user is not None:
                telemetry.AUTHENTICATIONS.labels("front-proxy", "success").inc()
                return user.with_authenticated_group()
        if verdict.user is not None:
            telemetry.AUTHENTICATIONS.labels("client-certificate", "success").inc()
            return verdict.user.with_authenticated_group()
        authorization = request.header("authorization")
        if authorization:
            return await self._bearer(authorization, connection.source)
        telemetry.AUTHENTICATIONS.labels("none", "failure").inc()
        raise Unauthenticated("no client certificate, front-proxy identity or bearer token")

    async def _bearer(self, authorization: str, source: str) -> User:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or self._tokens is None:
            telemetry.AUTHENTICATIONS.labels("token", "failure").inc()
            raise Unauthenticated("only bearer tokens are accepted")
        try:
            user = await self._tokens.review(token, source)
        except ReviewsBusy:
            telemetry.AUTHENTICATIONS.labels("token", "busy").inc()
            raise
        except KubeError as err:
            telemetry.AUTHENTICATIONS.labels("token", "error").inc()
            suppressed = self._warnings.allow(None)
            if suppressed is not None:
                log.warning("TokenReview failed: %s%s", err, held_back(suppressed))
            raise Unauthenticated("the token could not be reviewed") from None
        if user is None:
            telemetry.AUTHENTICATIONS.labels("token", "failure").inc()
            raise Unauthenticated("invalid bearer token")
        telemetry.AUTHENTICATIONS.labels("token", "success").inc()
        return user.with_authenticated_group()
