"""The delegate: another external metrics API server answering every metric name Zeroscale does not serve.

Only one APIService can serve `v1beta1.external.metrics.k8s.io`. With `delegate:` set, Zeroscale holds it
and forwards the list call for any name outside its own catalogue to the other server (KEDA's metrics
server, prometheus-adapter), so the HPAs that server fed keep working.

- Authorization stays ours: the routes check the original caller with our SubjectAccessReview before a
  request reaches `list()`. The delegate is then called as Zeroscale itself (its service-account token):
  GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC, which a generic API server (KEDA's)
  authorizes as `list` of resource METRIC, so Zeroscale needs exactly that (resources "*") there.
- Our names win a collision; the first discovery that finds one logs a warning naming each.
- The delegate's discovery is fetched at start and every `delegate.discovery_refresh` (sooner after a
  failure). A failed fetch, or one that lists nothing (a metrics server with nothing is broken, not
  empty), keeps the last good list and is logged; it never empties discovery.
- Delegate down: its metrics answer 503 naming it; ours never wait on it. Every call has one deadline
  (`delegate.timeout`, connect to last byte), a size bound and a cap on calls in flight, of which one caller
  (a user) holds at most a quarter: past it, that caller is answered 429 at once, so one caller's flood of
  slow calls never makes the HPA controller's wait out `delegate.timeout`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

from adapter.api import documents
from adapter.api.http import Response
from adapter.config.delegate import DelegateConfig
from adapter.k8s_wire.quantity import QuantityError, parse_quantity, unservable
from adapter.kube.client import KubeClient
from adapter.kube.errors import KubeAPIError, KubeError, ResponseTooLarge
from adapter.kube.kubeconfig import APIServer, client_tls_context
from adapter.metrics.catalogue import metric_name_problem
from adapter.telemetry import delegate as telemetry

log = logging.getLogger(__name__)

_VERSION_PATH = f"/apis/{documents.GROUP_VERSION}"
# After a failed discovery, try again this soon (or at discovery_refresh, if that is sooner).
_RETRY_SECONDS = 5.0


class DiscoveryError(Exception):
    """The delegate's discovery document could not be had, or lists no metric."""


def _endpoint(config: DelegateConfig) -> APIServer:
    host, port = config.address()
    tls = client_tls_context(config.ca_file, None, None, None, False)
    return APIServer("https", host, port, tls, config.server_name or host, config.token_file)


def _status(code: int, reason: str, message: str) -> Response:
    return Response(code, documents.status(code, reason, message))


class Delegate:
    def __init__(self, config: DelegateConfig, ours: Iterable[str]) -> None:
        self.name = config.describe()
        self._config = config
        self._ours = frozenset(name.lower() for name in ours)
        self._client = KubeClient(
            _endpoint(config),
            config.timeout,
            peer=f"the external metrics delegate ({self.name})",
            max_response_bytes=config.max_response_bytes,
        )
        self._slots = asyncio.Semaphore(config.max_in_flight)
        self._share = max(1, config.max_in_flight // 4)  # of the slots, for one caller
        self._callers: dict[str, int] = {}  # calls in flight by caller
        self._names: tuple[str, ...] = ()  # the delegate's names, ours removed; the last good discovery
        self._collisions: frozenset[str] = frozenset()

    def names(self) -> tuple[str, ...]:
        """The delegate's metric names from its last good discovery, without those we serve ourselves."""
        return self._names

    async def refresh(self) -> None:
        """Fetch the delegate's discovery once; raise DiscoveryError (the last good list is kept)."""
        try:
            _, document = await self._call(_VERSION_PATH)
        except KubeError as err:
            telemetry.DISCOVERIES.labels("error").inc()
            raise DiscoveryError(f"discovery of the external metrics delegate ({self.name}) failed: {err}") from None
        listed = _resource_names(document)
        if not listed:
            telemetry.DISCOVERIES.labels("empty").inc()
            raise DiscoveryError(
                f"the external metrics delegate ({self.name}) lists no metric in {documents.GROUP_VERSION}: "
                "a working metrics server lists what it serves; check it (keeping its last good list)"
            )
        telemetry.DISCOVERIES.labels("ok").inc()
        collisions = frozenset(listed) & self._ours
        new = collisions - self._collisions
        if new:
            log.warning(
                "metric names served both by Zeroscale and by the external metrics delegate (%s): %s; Zeroscale "
                "answers them, the delegate's are unreachable (rename one side's metric)",
                self.name,
                ", ".join(sorted(new)),
            )
        self._collisions = collisions
        self._names = tuple(sorted(frozenset(listed) - self._ours))
        telemetry.METRICS.set(len(self._names))

    async def run(self) -> None:
        """Keep the discovery fresh until cancelled."""
        while True:
            try:
                await self.refresh()
                delay = self._config.discovery_refresh
            except DiscoveryError as err:
                log.error("%s", err)
                delay = min(_RETRY_SECONDS, self._config.discovery_refresh)
            await asyncio.sleep(delay)

    async def list(self, namespace: str, metric: str, selector: str, caller: str | None = None) -> Response:
        """Forward one list call for `caller` (None: authentication is off); the delegate's answer, or a Status
        naming the delegate."""
        if caller is None:
            return await self._task(namespace, metric, selector)
        started = self._callers.get(caller, 0)
        if started >= self._share:
            telemetry.SATURATED.inc()
            return _status(
                429,
                "TooManyRequests",
                f"{started} calls of {caller!r} to the external metrics delegate ({self.name}) already in flight, "
                f"a quarter of delegate.max_in_flight; try again later",
            )
        self._callers[caller] = started + 1
        try:
            return await self._task(namespace, metric, selector)
        finally:
            left = self._callers[caller] - 1
            if left:
                self._callers[caller] = left
            else:
                del self._callers[caller]

    async def _task(self, namespace: str, metric: str, selector: str) -> Response:
        # A task of its own: deadlines need one, and a handler's first step runs outside any (api/http.py).
        return await asyncio.get_running_loop().create_task(self._list(namespace, metric, selector))

    async def _list(self, namespace: str, metric: str, selector: str) -> Response:
        path = f"{_VERSION_PATH}/namespaces/{namespace}/{quote(metric, safe='')}"
        if selector:
            path += "?" + urlencode({"labelSelector": selector})
        try:
            status, document = await self._call(path)
        except KubeAPIError as err:
            # The delegate's own refusal (404 for a name it does not know either, 400, 500): passed on, named.
            # A 401 or 403 is about Zeroscale's identity, not the caller's (whom we authorized): a 502, or the
            # caller would take it for a verdict on its own credentials.
            telemetry.REQUESTS.labels(f"{err.status // 100}xx").inc()
            if err.status in (401, 403):
                return _status(
                    502,
                    "BadGateway",
                    f"the external metrics delegate ({self.name}) refused Zeroscale's own identity ({err.status}: "
                    f"{err.message}); check delegate.token_file and Zeroscale's RBAC there",
                )
            code = err.status if 400 <= err.status < 600 else 502
            return _status(
                code, err.reason or "Unknown", f"from the external metrics delegate ({self.name}): {err.message}"
            )
        except ResponseTooLarge as err:
            telemetry.REQUESTS.labels("too-large").inc()
            return _status(502, "BadGateway", f"{err} (delegate.max_response_bytes)")
        except KubeError as err:
            telemetry.REQUESTS.labels("unavailable").inc()
            return _status(
                503, "ServiceUnavailable", f"the external metrics delegate ({self.name}) is unavailable: {err}"
            )
        problem = _list_problem(status, document, metric)
        if problem is not None:
            telemetry.REQUESTS.labels("malformed").inc()
            return _status(502, "BadGateway", f"the external metrics delegate ({self.name}) answered {problem}")
        telemetry.REQUESTS.labels("ok").inc()
        return Response(200, documents.encode(document))

    async def close(self) -> None:
        await self._client.close()

    async def _call(self, path: str) -> tuple[int, dict[str, Any]]:
        # One deadline for the wait for a slot and the call together; a slot is held only once acquired.
        acquired = False
        try:
            async with asyncio.timeout(self._config.timeout):
                await self._slots.acquire()
                acquired = True
                return await self._client.request("GET", path)
        except TimeoutError:
            if not acquired:
                telemetry.SATURATED.inc()
                raise KubeError(
                    f"{self._config.max_in_flight} calls already in flight for longer than "
                    f"{self._config.timeout:g}s (delegate.max_in_flight)"
                ) from None
            raise KubeError(f"no answer within {self._config.timeout:g}s (delegate.timeout)") from None
        finally:
            if acquired:
                self._slots.release()


def _list_problem(status: int, document: dict[str, Any], metric: str) -> str | None:
    """Why the delegate's answer must not reach the HPA, or None. The HPA sums the items' values as they come:
    an item of another metric, or a value that is no Quantity (NaN and Infinity pass Python's JSON decoder and
    would be written back as invalid JSON), or one whose milli-value overflows int64, becomes a wrong number."""
    items = document.get("items")
    if status != 200 or document.get("kind") != "ExternalMetricValueList" or not isinstance(items, list):
        return f"{status} without an ExternalMetricValueList"
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("metricName"), str):
            return f"item {index} without a metricName"
        if item["metricName"].lower() != metric:
            return f"item {index} for metric {item['metricName'][:64]!r}, not {metric!r}"
        value = item.get("value")
        try:
            problem = unservable(parse_quantity(value)) if isinstance(value, str) else "is not a Quantity string"
        except QuantityError:
            problem = "is not a Quantity"
        if problem is not None:
            return f"item {index} with value {str(value)[:64]!r}, which {problem}"
        # Go writes a nil map as null (KEDA's metrics server does, for items without labels): no labels.
        labels = item.get("metricLabels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            return f"item {index} with metricLabels that are not strings"
    return None


def _resource_names(document: dict[str, Any]) -> list[str]:
    """The metric names of an APIResourceList; subresource entries ("x/status") are not metrics."""
    resources = document.get("resources")
    if document.get("kind") != "APIResourceList" or not isinstance(resources, list):
        return []
    names = []
    for resource in resources:
        name = resource.get("name") if isinstance(resource, dict) else None
        # Subresources have a '/'; a name no caller could ask for (metric_name_problem) is not listed either.
        if isinstance(name, str) and metric_name_problem(name) is None:
            names.append(name.lower())
    return names
