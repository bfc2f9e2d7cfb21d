"""The external metrics API's routes (docs/protocols.md#external-metrics-api, docs/protocols.md#aggregator),
authentication and authorization in front.

Order of a request: health paths answer `ok` without credentials; `/openapi/*` answers 404
before authorization (docs/protocols.md#openapi); everything else is authenticated (401); the discovery documents
and the list call are then authorized (403) and answered; any other path is a 404 Status with no
authorization review (each distinct path would cost one).
"""

from __future__ import annotations

import json
import logging
import time
from urllib.parse import parse_qs, unquote

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer

from adapter.api import documents, negotiate
from adapter.api.authn import Authenticator, Unauthenticated, User
from adapter.api.authz import Attributes, Authorizer
from adapter.api.delegate import Delegate
from adapter.api.http import Request, Response
from adapter.api.inflight import ReviewsBusy
from adapter.k8s_wire.quantity import format_quantity
from adapter.kube.errors import KubeError
from adapter.metrics.cache import MetricCache, Reading
from adapter.metrics.catalogue import metric_name_problem, namespace_problem
from adapter.metrics.errors import MetricError
from adapter.redact import redact
from adapter.telemetry import api as telemetry
from adapter.telemetry import reads as spans
from adapter.telemetry import tracing
from adapter.telemetry.throttle import LogThrottle, held_back

log = logging.getLogger(__name__)
# One line per request at DEBUG: what the aggregator and the HPA controller ask, and what they got.
access_log = logging.getLogger("adapter.api.access")

HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
_OK = Response(200, b"ok", "text/plain; charset=utf-8")
_GROUP_PATH = f"/apis/{documents.GROUP}"
_VERSION_PATH = f"{_GROUP_PATH}/{documents.VERSION}"
_DISCOVERY = {"/apis": documents.API_GROUP_LIST, _GROUP_PATH: documents.API_GROUP}
# Rendered list answers, reused while the cache hands back the same Reading object.
_RENDERED_LIMIT = 4096
# Not traced (see _traced), and the http.route of the list call.
_PROBES = ("/healthz", "/livez", "/readyz")
_LIST_ROUTE = f"{_VERSION_PATH}/namespaces/{{namespace}}/{{metric}}"


def _status(code: int, reason: str, message: str, details: dict[str, str] | None = None) -> Response:
    return Response(code, documents.status(code, reason, message, details))


_OPENAPI_NOT_FOUND = _status(404, "NotFound", "this server does not publish an OpenAPI document")
_NOT_ACCEPTABLE = Response(406, negotiate.NOT_ACCEPTABLE)
_TOO_MANY_REVIEWS = _status(429, "TooManyRequests", "too many reviews in flight at once, please try again later")


class ExternalMetricsAPI:
    """The request handler. `authenticator`/`authorizer` None means authentication is off (loopback only)."""

    def __init__(
        self,
        cache: MetricCache,
        authenticator: Authenticator | None,
        authorizer: Authorizer | None,
        delegate: Delegate | None = None,
    ) -> None:
        self._cache = cache
        if (authenticator is None) != (authorizer is None):
            raise ValueError("authentication and authorization are on together or off together")
        self._authenticator = authenticator
        self._authorizer = authorizer
        self._ours = frozenset(cache.catalogue.names())
        self._resource_list = documents.api_resource_list(cache.catalogue.names())
        # Names outside ours go to the delegate; discovery is the union, rebuilt when its list changes.
        self._delegate = delegate
        self._union: tuple[tuple[str, ...], bytes] = ((), self._resource_list)
        # Keyed by the Reading's identity (held in the entry, so never reused while there), not by the request's
        # spelling: the many spellings of one series (up to a 16 KB selector each) share one small entry.
        self._rendered: dict[int, tuple[Reading, bytes]] = {}
        self._review_failures = LogThrottle(60.0)  # Kubernetes down: a line a minute, not one per request

    async def __call__(self, request: Request) -> Response:
        started = time.perf_counter()
        tracer = tracing.TRACER
        if tracer is None:
            route, response = await self._answer(request, None)
        else:
            route, response = await self._traced(tracer, request)
        telemetry.observe_request(route, response.status, time.perf_counter() - started)
        if access_log.isEnabledFor(logging.DEBUG):
            access_log.debug(
                "%s %r accept=%r user-agent=%r -> %d",
                request.method,
                redact(request.target),  # a query may carry a token
                request.header("accept"),
                request.header("user-agent"),
                response.status,
            )
        return response

    async def _traced(self, tracer: Tracer, request: Request) -> tuple[str, Response]:
        """`_answer` in a SERVER span continuing the caller's trace (the kube-apiserver's, when its tracing is on).
        Health probes are not traced: a trace every few seconds per kubelet would say nothing."""
        if request.target.startswith(_PROBES):
            return await self._answer(request, None)
        parent = tracing.parent_of(request.header("traceparent"), request.header("tracestate"))
        # Not made current: the handler may finish in another task than the one it started in (http.py's eager
        # first step), and a context attached in one cannot be detached in the other. The span is passed down.
        span = tracer.start_span(
            tracing.ADAPTER_REQUEST,
            context=parent or Context(),  # never the context the connection's callback happened to run in
            kind=SpanKind.SERVER,
            attributes={tracing.METHOD: request.method},
        )
        try:
            route, response = await self._answer(request, span)
            if route == "list":
                span.set_attribute(tracing.HTTP_ROUTE, _LIST_ROUTE)
            elif route == "discovery":  # one of three paths: its own template
                span.set_attribute(tracing.HTTP_ROUTE, request.target.partition("?")[0].rstrip("/"))
            span.set_attribute(tracing.STATUS_CODE, response.status)
            if response.status >= 500:  # a 4xx is the caller's error, not the server's (OpenTelemetry's rule)
                spans.failed(span, _message(response))
        except Exception as err:  # answered 500 by http.py
            span.record_exception(err)
            spans.failed(span, f"{type(err).__name__}: {err}")
            raise
        finally:
            span.end()
        return route, response

    async def _answer(self, request: Request, span: Span | None) -> tuple[str, Response]:
        path, _, query = request.target.partition("?")
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]
        if path in HEALTH_PATHS or path.startswith(("/healthz/", "/livez/", "/readyz/")):
            return "health", _OK
        if path == "/openapi" or path.startswith("/openapi/"):
            return "openapi", _OPENAPI_NOT_FOUND
        segments = path.split("/")
        if "%" in path:
            segments = [unquote(segment) for segment in segments]
        is_list = len(segments) == 7 and path.startswith(_VERSION_PATH + "/namespaces/")
        problem = (namespace_problem(segments[5]) or metric_name_problem(segments[6])) if is_list else None
        if problem is not None:
            # Before any review: a name that cannot be costs no TokenReview or SubjectAccessReview, and no cache entry.
            return "list", _status(400, "BadRequest", problem)
        route = "list" if is_list else "discovery" if path in _DISCOVERY or path == _VERSION_PATH else "other"
        # The name as client-go sends it (lower case): the one reviewed is the one answered, by us or the delegate
        # (reviewed `foo` but forwarded `FOO` would reach a name the caller was never checked for).
        metric = segments[6].lower() if is_list else ""
        if self._authenticator is not None:
            # A path we do not serve is a 404 once authenticated, with no review: each distinct path would cost
            # a SubjectAccessReview and key a cache entry (up to 16 KB), and every authenticated user may
            # get /apis/* anyway (the system:discovery role).
            attributes = (
                # Decoded names only, not the path as spelled: `%64efault` is the same question as `default`
                # (one review, one cache entry), however many ways a caller percent-encodes it.
                Attributes("list", "", segments[5], metric)
                if is_list
                else Attributes("get", path)
                if route == "discovery"
                else None
            )
            checked = await self._check(request, self._authenticator, attributes)
            if isinstance(checked, Response):
                return route, checked
            caller: str | None = checked.name
        else:
            caller = None
        if request.method not in ("GET", "HEAD"):
            return route, _status(405, "MethodNotAllowed", f"the server does not allow this method: {request.method}")
        if route != "other" and not negotiate.accepts_json(request.header("accept")):
            return route, _NOT_ACCEPTABLE
        if is_list:
            return route, await self._list(segments[5], metric, query, caller, span)
        if path == _VERSION_PATH:
            return route, Response(200, self._discovery())
        document = _DISCOVERY.get(path)
        if document is not None:
            return route, Response(200, document)
        return route, _status(404, "NotFound", f"the server could not find the requested resource {path}")

    async def _check(
        self, request: Request, authenticator: Authenticator, attributes: Attributes | None
    ) -> Response | User:
        """401 / 403 / 429 / 500 when the caller may not make this request; the caller when it may (`attributes`
        None: any authenticated caller may)."""
        assert self._authorizer is not None
        try:
            user = await authenticator.authenticate(request)
        except Unauthenticated:
            return _status(401, "Unauthorized", "Unauthorized")
        except ReviewsBusy:
            return _TOO_MANY_REVIEWS
        if attributes is None:
            return user
        try:
            decision = await self._authorizer.authorize(user, attributes)
        except ReviewsBusy:
            return _TOO_MANY_REVIEWS
        except KubeError as err:
            suppressed = self._review_failures.allow(None)
            if suppressed is not None:
                log.warning("SubjectAccessReview for %r failed: %s%s", user.name, err, held_back(suppressed))
            return _status(500, "InternalError", "Internal error occurred: the authorization check could not be made")
        if decision.allowed:
            return user
        return _forbidden(user, attributes, decision.reason)

    def _discovery(self) -> bytes:
        if self._delegate is None:
            return self._resource_list
        theirs = self._delegate.names()
        if theirs is not self._union[0]:
            self._union = (theirs, documents.api_resource_list(sorted(self._ours.union(theirs))))
        return self._union[1]

    async def _list(self, namespace: str, metric: str, query: str, caller: str | None, span: Span | None) -> Response:
        selector = parse_qs(query).get("labelSelector", [""])[0] if query else ""
        if span is not None:
            spans.describe_series(span, metric, namespace, selector)
        if self._delegate is not None and metric not in self._ours:
            if span is not None:
                span.set_attribute(tracing.CACHE_OUTCOME, "delegated")
            return await self._delegate.list(namespace, metric, selector, caller)
        try:
            reading = await self._cache.read(metric, namespace, selector, span)
        except MetricError as err:
            return _status(err.code, err.reason, err.message)
        key = id(reading)
        rendered = self._rendered.get(key)
        if rendered is None or rendered[0] is not reading:
            if len(self._rendered) >= _RENDERED_LIMIT:
                self._rendered.clear()
            body = documents.external_metric_value_list(
                reading.metric, reading.labels, reading.timestamp, format_quantity(reading.value)
            )
            rendered = (reading, body)
            self._rendered[key] = rendered
        return Response(200, rendered[1])


def _message(response: Response) -> str:
    """The message of a Status answer (what the HPA's event will say)."""
    try:
        message = json.loads(response.body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else response.body.decode("utf-8", "replace")


def _forbidden(user: User, attributes: Attributes, reason: str) -> Response:
    """The 403 Status the generic apiserver writes (docs/protocols.md#em-errors)."""
    suffix = f": {reason}" if reason else ""
    if attributes.resource is None:
        message = f'forbidden: User "{user.name}" cannot {attributes.verb} path "{attributes.path}"{suffix}'
        return _status(403, "Forbidden", message)
    resource = attributes.resource
    message = (
        f'{resource}.{documents.GROUP} is forbidden: User "{user.name}" cannot {attributes.verb} resource '
        f'"{resource}" in API group "{documents.GROUP}" in the namespace "{attributes.namespace}"{suffix}'
    )
    return _status(403, "Forbidden", message, {"group": documents.GROUP, "kind": resource})
