"""The checks, in the order the aggregator itself goes (docs/protocols.md#aggregator-availability): APIService, Service,
endpoints, TLS, discovery.

They cover the reasons users most often meet `FailedDiscoveryCheck` or `unable to fetch metrics`: another
provider owns the APIService, the Service port or its name does not match, no endpoint is ready, the
certificate does not name `<svc>.<ns>.svc` or is not signed by the caBundle, and RBAC for the HPA or the
adapter. Everything runs with the user's kubeconfig; nothing is changed in the cluster.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from dataclasses import dataclass, field
from typing import Any

from adapter.doctor import certificates, scale_to_zero
from adapter.doctor.activator import check_activator_lease
from adapter.doctor.findings import Finding
from adapter.doctor.grpc import check_grpc_authentication
from adapter.doctor.routes import check_routes
from adapter.kube.client import KubeClient
from adapter.kube.endpointslices import list_slices
from adapter.kube.errors import KubeAPIError, KubeError

GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
APISERVICE_PATH = f"/apis/apiregistration.k8s.io/v1/apiservices/{VERSION}.{GROUP}"
DISCOVERY_PATH = f"/apis/{GROUP}/{VERSION}"
SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
HPA_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]

# What each `Available=False` reason of the aggregator means and what to do (docs/protocols.md#aggregator-availability).
_REASON_HINTS = {
    "ServiceNotFound": "the Service the APIService names does not exist",
    "ServicePortError": "the APIService's port is not a port of the Service",
    "EndpointsNotFound": "the Service has no EndpointSlices: is its selector right and the Deployment running?",
    "MissingEndpoints": "no ready endpoint carries the Service port's name: pods not ready, or port names differ",
    "FailedDiscoveryCheck": "the aggregator reached a pod but GET /apis/external.metrics.k8s.io/v1beta1 failed: "
    "a TLS error (names, caBundle), a 401/403 (the adapter's RBAC) or a timeout (NetworkPolicy, wrong port)",
}


@dataclass(frozen=True)
class Installation:
    """Where the adapter is expected to be."""

    service: str = "zeroscale-adapter"
    namespace: str = "zeroscale"
    service_account: str = "zeroscale-adapter"
    deployment: str = "zeroscale-adapter"
    # The proxy's Deployment, whose mounted config says which Lease its activator routes are written under.
    proxy_deployment: str = "zeroscale-proxy"
    serving_secret: str = "zeroscale-adapter-serving"
    # The namespace whose HPAs are checked for access (any namespace works the same with the shipped RBAC).
    hpa_namespace: str = "default"


@dataclass
class _State:
    """What earlier checks learned and later ones need."""

    apiservice: dict[str, Any] = field(default_factory=dict)
    port_name: str | None = None
    # The aggregator checks endpoints only for a ClusterIP Service (ExternalName: it dials the name).
    has_endpoints: bool = True
    cert: Any = None
    metric_names: list[str] = field(default_factory=list)


class Doctor:
    def __init__(self, client: KubeClient, where: Installation, now: datetime.datetime | None = None) -> None:
        self._client = client
        self._where = where
        self._now = now
        self._state = _State()

    async def run(self) -> list[Finding]:
        findings: list[Finding] = []
        for check in (
            self._check_scale_to_zero,
            self._check_apiservice,
            self._check_service,
            self._check_endpoints,
            self._check_certificate,
            self._check_discovery,
            self._check_hpa_access,
            self._check_adapter_access,
            self._check_grpc,
            self._check_activator_lease,
            self._check_routes,
        ):
            findings.extend(await check())
        return findings

    async def _check_scale_to_zero(self) -> list[Finding]:
        return await scale_to_zero.check(self._client, self._where.hpa_namespace)

    async def _get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist; other errors propagate."""
        try:
            _, obj = await self._client.request("GET", path)
        except KubeAPIError as err:
            if err.status == 404:
                return None
            raise
        return obj

    # --- APIService ---

    async def _check_apiservice(self) -> list[Finding]:
        check, where = "APIService", self._where
        try:
            apiservice = await self._get(APISERVICE_PATH)
        except KubeError as err:
            return [Finding("fail", check, f"cannot read the APIService {VERSION}.{GROUP}: {err}")]
        if apiservice is None:
            return [
                Finding(
                    "fail",
                    check,
                    f"no APIService {VERSION}.{GROUP}: the cluster has no external metrics API, so every HPA on "
                    "an External metric reports `unable to fetch metrics`",
                    "apply an installation overlay (deploy/overlays/cert-manager or deploy/overlays/certs)",
                )
            ]
        self._state.apiservice = apiservice
        spec = apiservice.get("spec") or {}
        service = spec.get("service") or {}
        owner = f"{service.get('namespace')}/{service.get('name')}"
        findings = []
        if not service:
            findings.append(Finding("fail", check, "the APIService names no Service: the kube-apiserver serves it"))
        elif (service.get("namespace"), service.get("name")) != (where.namespace, where.service):
            labels = (apiservice.get("metadata") or {}).get("labels") or {}
            by = labels.get("app.kubernetes.io/name") or labels.get("app.kubernetes.io/managed-by") or owner
            findings.append(
                Finding(
                    "fail",
                    check,
                    f"another provider owns {VERSION}.{GROUP}: it sends HPAs to {owner} ({by}), not to "
                    f"{where.namespace}/{where.service}. Only one APIService can own the group per cluster",
                    "remove the other provider's external metrics (e.g. KEDA or prometheus-adapter external rules) "
                    "or serve those metrics from Zeroscale, then re-apply Zeroscale's overlay",
                )
            )
        else:
            findings.append(
                Finding("ok", check, f"{VERSION}.{GROUP} is served by {owner} port {service.get('port', 443)}")
            )
        if spec.get("insecureSkipTLSVerify"):
            findings.append(
                Finding(
                    "warn",
                    check,
                    "insecureSkipTLSVerify is true: the aggregator does not verify the adapter's certificate",
                    "set a caBundle instead",
                )
            )
        elif not spec.get("caBundle"):
            annotations = (apiservice.get("metadata") or {}).get("annotations") or {}
            injector = annotations.get("cert-manager.io/inject-ca-from")
            hint = (
                f"cert-manager should inject it from {injector}: is cainjector running and the Certificate Ready?"
                if injector
                else "apply an overlay that sets it (deploy/overlays/certs after `zeroscale certs`)"
            )
            findings.append(
                Finding(
                    "fail",
                    check,
                    "the APIService has no caBundle: the aggregator then trusts only the system roots, which did "
                    "not sign the adapter's certificate",
                    hint,
                )
            )
        findings.append(self._availability(apiservice))
        return findings

    @staticmethod
    def _availability(apiservice: dict[str, Any]) -> Finding:
        check = "APIService Available"
        conditions = (apiservice.get("status") or {}).get("conditions") or []
        available = next((c for c in conditions if c.get("type") == "Available"), None)
        if available is None:
            return Finding("warn", check, "the aggregator has not reported availability yet")
        reason, message = available.get("reason", ""), available.get("message", "")
        if available.get("status") == "True":
            return Finding("ok", check, f"Available ({reason or 'Passed'})")
        return Finding(
            "fail",
            check,
            f"not Available: {reason}: {message}".rstrip(": "),
            _REASON_HINTS.get(reason, "see the checks below"),
        )

    # --- Service and endpoints ---

    def _service_ref(self) -> tuple[str, str, int]:
        service = (self._state.apiservice.get("spec") or {}).get("service") or {}
        return self._where.namespace, self._where.service, int(service.get("port") or 443)

    async def _check_service(self) -> list[Finding]:
        namespace, name, port = self._service_ref()
        check = f"Service {namespace}/{name}"
        try:
            service = await self._get(f"/api/v1/namespaces/{namespace}/services/{name}")
        except KubeError as err:
            return [Finding("fail", check, f"cannot read it: {err}")]
        if service is None:
            return [
                Finding("fail", check, "does not exist (the aggregator reports ServiceNotFound)", "apply the overlay")
            ]
        ports = (service.get("spec") or {}).get("ports") or []
        match = next((p for p in ports if p.get("port") == port), None)
        if match is None:
            listed = ", ".join(f"{p.get('name') or '(unnamed)'}={p.get('port')}" for p in ports) or "none"
            return [
                Finding(
                    "fail",
                    check,
                    f"has no port {port}, which the APIService names (its ports: {listed}); the aggregator reports "
                    "ServicePortError",
                    "make the APIService's spec.service.port one of the Service's ports",
                )
            ]
        self._state.port_name = str(match.get("name") or "")
        self._state.has_endpoints = (service.get("spec") or {}).get("type", "ClusterIP") == "ClusterIP"
        shown = self._state.port_name or "(unnamed)"
        return [Finding("ok", check, f"port {port} is named {shown} and targets {match.get('targetPort', port)}")]

    async def _check_endpoints(self) -> list[Finding]:
        namespace, name, _ = self._service_ref()
        check = "ready endpoints"
        port_name = self._state.port_name
        if port_name is None:
            return [Finding("skip", check, "skipped: the Service check failed")]
        if not self._state.has_endpoints:
            return [
                Finding("ok", check, f"{namespace}/{name} is not a ClusterIP Service: the aggregator dials its name")
            ]
        try:
            _, by_name, _ = await list_slices(self._client, namespace, name)
        except KubeError as err:
            return [Finding("fail", check, f"cannot list the Service's EndpointSlices: {err}")]
        slices = list(by_name.values())
        if not slices:
            return [
                Finding(
                    "fail",
                    check,
                    f"{namespace}/{name} has no EndpointSlices (the aggregator reports EndpointsNotFound)",
                    "check that the Service's selector matches the adapter pods' labels",
                )
            ]
        ready = not_ready = 0
        other_names: set[str] = set()
        for item in slices:
            names = {str(p.get("name") or "") for p in item.get("ports") or []}
            if port_name not in names:
                other_names |= names
                continue
            for endpoint in item.get("endpoints") or []:
                # The aggregator counts nil as ready (docs/protocols.md#endpointslices).
                if (endpoint.get("conditions") or {}).get("ready") in (None, True):
                    ready += 1
                else:
                    not_ready += 1
        if ready:
            return [Finding("ok", check, f"{ready} ready endpoint(s) with the port named {port_name or '(unnamed)'}")]
        if not_ready:
            return [
                Finding(
                    "fail",
                    check,
                    f"{not_ready} endpoint(s), none ready (the aggregator reports MissingEndpoints)",
                    f"see why the pods are not ready: kubectl -n {namespace} describe pods -l "
                    "app.kubernetes.io/name=zeroscale-adapter",
                )
            ]
        shown = ", ".join(sorted(n or "(unnamed)" for n in other_names)) or "none"
        return [
            Finding(
                "fail",
                check,
                f"no EndpointSlice port is named {port_name or '(unnamed)'} like the Service port (they have: "
                f"{shown}); the aggregator reports MissingEndpoints",
                "name the Service port and the container port alike (the shipped manifests use `https`)",
            )
        ]

    # --- TLS ---

    async def _check_certificate(self) -> list[Finding]:
        where = self._where
        check = f"Secret {where.namespace}/{where.serving_secret}"
        try:
            secret = await self._get(f"/api/v1/namespaces/{where.namespace}/secrets/{where.serving_secret}")
        except KubeError as err:
            if isinstance(err, KubeAPIError) and err.status == 403:
                return [Finding("skip", check, "you may not read it, so the certificate checks are skipped")]
            return [Finding("fail", check, f"cannot read it: {err}")]
        if secret is None:
            return [
                Finding(
                    "fail",
                    check,
                    "does not exist, so the adapter pods cannot start (their certificate volume is missing)",
                    "cert-manager: kubectl -n zeroscale describe certificate zeroscale-adapter-serving; "
                    "otherwise run `zeroscale certs` and apply deploy/overlays/certs",
                )
            ]
        try:
            pem = base64.b64decode((secret.get("data") or {}).get("tls.crt", ""), validate=True)
        except (binascii.Error, ValueError):
            pem = b""
        chain = certificates.load_pem_chain(pem)
        if not chain:
            return [Finding("fail", check, "has no PEM certificate under tls.crt")]
        cert = chain[0]
        now = self._now or datetime.datetime.now(datetime.UTC)
        findings = [
            certificates.check_names(cert, where.service, where.namespace),
            certificates.check_validity(cert, now),
        ]
        spec = self._state.apiservice.get("spec") or {}
        if spec.get("caBundle") and not spec.get("insecureSkipTLSVerify"):
            findings.append(certificates.check_ca_bundle(cert, str(spec["caBundle"])))
        return findings

    # --- through the aggregator ---

    async def _check_discovery(self) -> list[Finding]:
        check = f"discovery GET {DISCOVERY_PATH}"
        try:
            _, document = await self._client.request("GET", DISCOVERY_PATH)
        except KubeAPIError as err:
            hints = {
                503: "the aggregator considers the APIService unavailable: see the failures above",
                404: "the group is not registered: the APIService is missing",
                403: "your own user may not read discovery; the HPA check below is what matters",
            }
            return [Finding("fail", check, f"answered {err.status}: {err.message}", hints.get(err.status, ""))]
        except KubeError as err:
            return [Finding("fail", check, str(err))]
        resources = [r.get("name", "") for r in document.get("resources") or []]
        self._state.metric_names = [r for r in resources if r and "/" not in r]
        if document.get("kind") != "APIResourceList":
            return [Finding("fail", check, f"answered with a {document.get('kind')!r}, not an APIResourceList")]
        return [Finding("ok", check, f"the adapter answers through the aggregator ({len(resources)} metric(s))")]

    # --- RBAC ---

    async def _review(self, user: str, groups: list[str], attributes: dict[str, str]) -> bool | str:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        }
        try:
            _, review = await self._client.request("POST", SAR_PATH, body)
        except KubeError as err:
            return f"cannot ask the API server (SubjectAccessReview): {err}"
        return bool((review.get("status") or {}).get("allowed"))

    async def _check_hpa_access(self) -> list[Finding]:
        check = "HPA controller RBAC"
        resource = self._state.metric_names[0] if self._state.metric_names else "any-metric"
        namespace = self._where.hpa_namespace
        allowed = await self._review(
            HPA_USER,
            HPA_GROUPS,
            {"namespace": namespace, "verb": "list", "group": GROUP, "version": VERSION, "resource": resource},
        )
        if isinstance(allowed, str):
            return [Finding("fail", check, allowed)]
        if allowed:
            return [Finding("ok", check, f"the HPA controller may list {GROUP} ({resource} in {namespace})")]
        return [
            Finding(
                "fail",
                check,
                f"the HPA controller ({HPA_USER}) may not list {GROUP}: HPAs show `unable to fetch metrics` with a 403",
                "apply deploy/base/hpa-rbac.yaml (ClusterRole get,list on external.metrics.k8s.io, bound to it)",
            )
        ]

    async def _check_grpc(self) -> list[Finding]:
        return await check_grpc_authentication(self._get, self._where.namespace, self._where.deployment)

    async def _check_activator_lease(self) -> list[Finding]:
        return await check_activator_lease(self._get, self._where.namespace, self._where.proxy_deployment)

    async def _check_routes(self) -> list[Finding]:
        now = self._now or datetime.datetime.now(datetime.UTC)
        return await check_routes(self._get, self._where.namespace, self._where.proxy_deployment, now)

    async def _check_adapter_access(self) -> list[Finding]:
        where = self._where
        user = f"system:serviceaccount:{where.namespace}:{where.service_account}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{where.namespace}", "system:authenticated"]
        needs = [
            (
                "create TokenReviews",
                {"verb": "create", "group": "authentication.k8s.io", "resource": "tokenreviews"},
                "bind ClusterRole system:auth-delegator to it",
            ),
            (
                "create SubjectAccessReviews",
                {"verb": "create", "group": "authorization.k8s.io", "resource": "subjectaccessreviews"},
                "bind ClusterRole system:auth-delegator to it",
            ),
            (
                "watch kube-system/extension-apiserver-authentication",
                {
                    "verb": "watch",
                    "group": "",
                    "resource": "configmaps",
                    "namespace": "kube-system",
                    "name": "extension-apiserver-authentication",
                },
                "bind Role extension-apiserver-authentication-reader to it in kube-system",
            ),
        ]
        findings = []
        for what, attributes, hint in needs:
            allowed = await self._review(user, groups, attributes)
            check = f"adapter RBAC: {what}"
            if isinstance(allowed, str):
                findings.append(Finding("fail", check, allowed))
            elif allowed:
                findings.append(Finding("ok", check, f"{where.service_account} may {what}"))
            else:
                findings.append(
                    Finding(
                        "fail",
                        check,
                        f"{user} may not {what}: the adapter then refuses the aggregator's calls (401/403), "
                        "which the aggregator reports as FailedDiscoveryCheck",
                        hint,
                    )
                )
        return findings
