"""May this user do this? Delegated to Kubernetes with a SubjectAccessReview (docs/protocols.md#subject-access-review),
answers cached.

Reviews are bounded as TokenReviews are (adapter.api.inflight): one in flight per (user, request), at
most `max_access_reviews` at once (more are answered 429), and allows are cached apart from denials, so an
authenticated caller asking about made-up namespaces and metrics cannot evict the HPA's cached allows.

Groups in `always_allow_groups` (default `system:masters`) skip the review, as upstream's
delegating authorizer does. `allowed: true` allows; anything else (denied, or no opinion)
is refused with 403. A review that cannot be made, or that answers both allowed and denied,
is an error (KubeError; answered 500 by the API).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter.api.authn import User
from adapter.api.documents import GROUP, VERSION
from adapter.api.inflight import InFlight, ReviewsBusy
from adapter.api.ttlcache import TTLCache
from adapter.config.server import AuthConfig
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeError
from adapter.telemetry import api as telemetry

SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class Attributes:
    """What a request does: a resource request (the list call) or a non-resource path (discovery)."""

    verb: str
    path: str  # for a non-resource request only: a resource request is its decoded names
    namespace: str = ""
    resource: str | None = None  # the lower-cased metric name; None for non-resource paths

    def review(self) -> dict[str, Any]:
        if self.resource is None:
            return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        return {
            "resourceAttributes": {
                "namespace": self.namespace,
                "verb": self.verb,
                "group": GROUP,
                "version": VERSION,
                "resource": self.resource,
                "subresource": "",
                "name": "",
            }
        }


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class Authorizer:
    def __init__(self, client: KubeClient, config: AuthConfig) -> None:
        self._client = client
        self._config = config
        self._always = frozenset(config.always_allow_groups)
        self._allowed: TTLCache[tuple[User, Attributes], Decision] = TTLCache(config.cache_size)
        self._denied: TTLCache[tuple[User, Attributes], Decision] = TTLCache(config.cache_size)
        self._in_flight: InFlight[tuple[User, Attributes], Decision] = InFlight(
            config.max_access_reviews, "SubjectAccessReviews", "server.auth.max_access_reviews"
        )

    async def authorize(self, user: User, attributes: Attributes) -> Decision:
        """Allow or refuse; raise KubeError when Kubernetes could not be asked, ReviewsBusy past the bound."""
        if self._always.intersection(user.groups):
            telemetry.AUTHORIZATIONS.labels("allow", "always-allow-group").inc()
            return Decision(True)
        key = (user, attributes)
        cached = self._allowed.get(key) or self._denied.get(key)
        if cached is not None:
            telemetry.AUTHORIZATIONS.labels("allow" if cached.allowed else "deny", "cache").inc()
            return cached
        try:
            return await self._in_flight.run(key, user.name, lambda: self._decide(user, attributes))
        except ReviewsBusy:
            telemetry.AUTHORIZATIONS.labels("busy", "review").inc()
            raise

    async def _decide(self, user: User, attributes: Attributes) -> Decision:
        try:
            decision = await self._review(user, attributes)
        except Exception:
            telemetry.AUTHORIZATIONS.labels("error", "review").inc()
            raise
        if decision.allowed:
            self._allowed.put((user, attributes), decision, self._config.allow_cache_ttl)
        else:
            self._denied.put((user, attributes), decision, self._config.deny_cache_ttl)
        telemetry.AUTHORIZATIONS.labels("allow" if decision.allowed else "deny", "review").inc()
        return decision

    async def _review(self, user: User, attributes: Attributes) -> Decision:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "uid": user.uid,
                "groups": list(user.groups),
                "extra": {key: list(values) for key, values in user.extra},
                **attributes.review(),
            },
        }
        _, review = await self._client.request("POST", SUBJECTACCESSREVIEWS, body)
        status = review.get("status") or {}
        reason = str(status.get("reason", ""))
        if status.get("allowed") and status.get("denied"):
            # docs/protocols.md#subject-access-review: both set is an error, never an allow (and not cached as a
            # decision).
            raise KubeError("the SubjectAccessReview answered both allowed and denied")
        return Decision(bool(status.get("allowed")), reason)
