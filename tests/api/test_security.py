"""Authentication and authorization (docs/protocols.md#authentication) against the Kubernetes stand-in, with
certificates made by trustme."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from adapter.config import ZeroscaleConfig
from adapter.serve import unsafe_without_auth
from tests.api.fixtures import RunningServer, StartServer
from tests.fixtures.httpclient import Answer, fetch, tls_client
from tests.fixtures.kube_standin import KubeStandIn, Reply

LIST = "/apis/external.metrics.k8s.io/v1beta1/namespaces/team-a/DEMO-Queue-Depth"
HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
AGGREGATOR_HEADERS = [
    ("X-Remote-User", HPA),
    ("X-Remote-Group", "system:serviceaccounts"),
    ("X-Remote-Group", "system:serviceaccounts:kube-system"),
    ("X-Remote-Extra-Authentication.kubernetes.io%2Fpod-name", "kcm-0"),
]
# A failed handshake surfaces at the first read under TLS 1.3, as one of these.
REFUSED = (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)


def auth_section(kube: KubeStandIn, **auth: Any) -> dict[str, Any]:
    return {"tls": {"reload_interval": 0.2}, "auth": {"enabled": True, "kubernetes": kube.client_config(), **auth}}


@pytest.fixture
def front_proxy_cert(front_proxy_ca: trustme.CA) -> trustme.LeafCert:
    return front_proxy_ca.issue_cert(common_name="front-proxy-client")


@pytest.fixture
async def server(
    start_server: StartServer, kube: KubeStandIn, front_proxy_ca: trustme.CA, client_ca: trustme.CA
) -> RunningServer:
    """Trust from the extension-apiserver-authentication ConfigMap, as in a cluster."""
    kube.set_authentication_configmap(
        front_proxy_ca.cert_pem.bytes(), ["front-proxy-client"], client_ca.cert_pem.bytes()
    )
    return await start_server(auth_section(kube))


async def test_front_proxy_identity_is_reviewed_exactly(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    answer = await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))
    assert answer.status == 200, answer.body
    assert kube.access_reviews == [
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": HPA,
                "uid": "",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["kcm-0"]},
                "resourceAttributes": {
                    "namespace": "team-a",
                    "verb": "list",
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "resource": "demo-queue-depth",
                    "subresource": "",
                    "name": "",
                },
            },
        }
    ]
    again = await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))
    assert again.status == 200
    assert len(kube.access_reviews) == 1  # the allow was cached


async def test_identity_headers_lose_surrounding_whitespace(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    """Issue 12 item 12: `X-Remote-User: hpa ` was reviewed as user "hpa "."""
    padded = [(name, f"{value} \t") for name, value in AGGREGATOR_HEADERS]
    answer = await fetch(server.port, LIST, padded, tls_client(cert=front_proxy_cert))
    assert answer.status == 200, answer.body
    (review,) = kube.access_reviews
    assert review["spec"]["user"] == HPA
    assert review["spec"]["groups"][:2] == ["system:serviceaccounts", "system:serviceaccounts:kube-system"]
    assert review["spec"]["extra"] == {"authentication.kubernetes.io/pod-name": ["kcm-0"]}


async def test_discovery_is_a_non_resource_review(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    path = "/apis/external.metrics.k8s.io/v1beta1"
    headers = [("X-Remote-User", "system:kube-aggregator")]
    answer = await fetch(server.port, path, headers, tls_client(cert=front_proxy_cert))
    assert answer.status == 200
    spec = kube.access_reviews[-1]["spec"]
    assert spec["nonResourceAttributes"] == {"path": path, "verb": "get"}
    assert spec["groups"] == ["system:authenticated"]
    assert "resourceAttributes" not in spec


async def test_system_masters_skip_the_review(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    headers = [("X-Remote-User", "system:kube-aggregator"), ("X-Remote-Group", "system:masters")]
    answer = await fetch(
        server.port, "/apis/external.metrics.k8s.io/v1beta1", headers, tls_client(cert=front_proxy_cert)
    )
    assert answer.status == 200
    assert kube.access_reviews == []


async def test_denial_is_a_403_status_and_cached(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    kube.authorize = lambda spec: "deny"
    answer = await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))
    assert answer.status == 403
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            'demo-queue-depth.external.metrics.k8s.io is forbidden: User "' + HPA + '" cannot list resource '
            '"demo-queue-depth" in API group "external.metrics.k8s.io" in the namespace "team-a"'
        ),
        "reason": "Forbidden",
        "details": {"group": "external.metrics.k8s.io", "kind": "demo-queue-depth"},
        "code": 403,
    }
    assert (await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))).status == 403
    assert len(kube.access_reviews) == 1


async def test_no_opinion_is_403_and_a_failed_review_is_500(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    kube.authorize = lambda spec: "no-opinion"
    assert (await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))).status == 403

    def broken(spec: dict[str, Any]) -> str:
        raise RuntimeError("authorizer down")

    kube.authorize = broken
    headers = [("X-Remote-User", "someone-else")]
    answer = await fetch(server.port, LIST, headers, tls_client(cert=front_proxy_cert))
    assert (answer.status, answer.json()["reason"]) == (500, "InternalError")


async def test_allowed_and_denied_together_is_an_error(
    server: RunningServer, kube: KubeStandIn, front_proxy_cert: trustme.LeafCert
) -> None:
    both = Reply(201, {"kind": "SubjectAccessReview", "status": {"allowed": True, "denied": True}})
    kube.add_route("POST", r"/apis/authorization\.k8s\.io/v1/subjectaccessreviews", lambda request, match: both)
    answer = await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))
    assert (answer.status, answer.json()["reason"]) == (500, "InternalError")


async def test_remote_headers_without_a_front_proxy_certificate_are_ignored(
    server: RunningServer, kube: KubeStandIn
) -> None:
    forged = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")]
    answer = await fetch(server.port, LIST, forged)
    assert (answer.status, answer.json()["reason"]) == (401, "Unauthorized")
    kube.tokens["valid-token"] = {"username": "prometheus", "uid": "u-1", "groups": ["monitoring"]}
    with_token = await fetch(server.port, LIST, [*forged, ("Authorization", "Bearer valid-token")])
    assert with_token.status == 200
    assert kube.access_reviews[-1]["spec"]["user"] == "prometheus"
    assert kube.access_reviews[-1]["spec"]["groups"] == ["monitoring", "system:authenticated"]


async def test_client_certificate_with_forged_remote_user_is_not_trusted(
    server: RunningServer, kube: KubeStandIn, client_ca: trustme.CA
) -> None:
    jane = client_ca.issue_cert(common_name="jane", organization_name="devs")
    forged = [("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters")]
    answer = await fetch(server.port, LIST, forged, tls_client(cert=jane))
    assert answer.status == 200
    (review,) = kube.access_reviews  # system:masters from a forged header would have skipped it
    assert review["spec"]["user"] == "jane"
    assert review["spec"]["groups"] == ["devs", "system:authenticated"]


async def test_front_proxy_certificate_with_a_name_not_allowed_is_not_trusted(
    server: RunningServer, front_proxy_ca: trustme.CA
) -> None:
    intruder = front_proxy_ca.issue_cert(common_name="not-the-front-proxy")
    answer = await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=intruder))
    assert answer.status == 401


async def test_certificate_from_an_unknown_ca_is_refused(
    server: RunningServer, front_proxy_cert: trustme.LeafCert
) -> None:
    stranger = trustme.CA().issue_cert(common_name="front-proxy-client")
    with pytest.raises(REFUSED):
        await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=stranger))
    # The same request with the real front-proxy certificate is served.
    assert (await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=front_proxy_cert))).status == 200


async def test_token_review_decides_and_is_cached(server: RunningServer, kube: KubeStandIn) -> None:
    kube.tokens["good"] = {"username": "alice", "groups": ["team"]}
    for _ in range(2):
        answer = await fetch(server.port, LIST, [("Authorization", "Bearer good")])
        assert answer.status == 200
    assert [r["spec"]["token"] for r in kube.token_reviews] == ["good"]
    bad = await fetch(server.port, LIST, [("Authorization", "Bearer wrong")])
    assert (bad.status, bad.json()["code"]) == (401, 401)


async def test_openapi_and_health_need_no_credentials(server: RunningServer, kube: KubeStandIn) -> None:
    for path in ("/openapi/v2", "/openapi/v3", "/openapi/v3/apis/external.metrics.k8s.io/v1beta1"):
        answer = await fetch(server.port, path)
        assert (answer.status, answer.json()["reason"]) == (404, "NotFound")
    for path in ("/healthz", "/livez", "/readyz"):
        answer = await fetch(server.port, path)
        assert (answer.status, answer.body) == (200, b"ok")
    assert (await fetch(server.port, "/apis")).status == 401
    assert kube.access_reviews == []


async def test_configmap_rotation_of_the_request_header_ca(
    start_server: StartServer, kube: KubeStandIn, front_proxy_ca: trustme.CA
) -> None:
    kube.set_authentication_configmap(front_proxy_ca.cert_pem.bytes(), ["front-proxy-client"])
    server = await start_server(auth_section(kube))
    rotated_ca = trustme.CA()
    rotated_cert = rotated_ca.issue_cert(common_name="front-proxy-client")
    with pytest.raises(REFUSED):
        await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=rotated_cert))
    kube.set_authentication_configmap(rotated_ca.cert_pem.bytes(), ["front-proxy-client"])
    answer = await _eventually(lambda: fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=rotated_cert)))
    assert answer.status == 200
    old_cert = front_proxy_ca.issue_cert(common_name="front-proxy-client")
    with pytest.raises(REFUSED):
        await fetch(server.port, LIST, AGGREGATOR_HEADERS, tls_client(cert=old_cert))


async def test_request_header_ca_from_files_and_their_rotation(
    start_server: StartServer, kube: KubeStandIn, front_proxy_ca: trustme.CA, tmp_path: Path
) -> None:
    ca_file = tmp_path / "front-proxy-ca.crt"
    front_proxy_ca.cert_pem.write_to_path(str(ca_file))
    request_header = {"client_ca_file": ca_file, "allowed_names": ["aggregator"]}
    server = await start_server(auth_section(kube, request_header=request_header))
    allowed = front_proxy_ca.issue_cert(common_name="aggregator")
    headers = [("X-Remote-User", "u"), ("X-Remote-Group", "system:masters")]
    assert (await fetch(server.port, LIST, headers, tls_client(cert=allowed))).status == 200
    assert not any("/configmaps" in path for _, path, _ in kube.requests)
    rotated_ca = trustme.CA()
    rotated_ca.cert_pem.write_to_path(str(ca_file))  # the file is replaced on disk
    rotated = rotated_ca.issue_cert(common_name="aggregator")
    answer = await _eventually(lambda: fetch(server.port, LIST, headers, tls_client(cert=rotated)))
    assert answer.status == 200


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
async def test_tls_1_1_is_refused(server: RunningServer) -> None:
    def client(maximum: ssl.TLSVersion) -> ssl.SSLContext:
        context = tls_client(maximum=maximum)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # so this client really offers TLS 1.1
        return context

    with pytest.raises(REFUSED):
        await fetch(server.port, "/healthz", context=client(ssl.TLSVersion.TLSv1_1))
    # The same client allowed TLS 1.2 is served: only the version was refused.
    assert (await fetch(server.port, "/healthz", context=client(ssl.TLSVersion.TLSv1_2))).status == 200


async def test_serving_certificate_files_are_reloaded(start_server: StartServer, tmp_path: Path) -> None:
    first_ca, second_ca = trustme.CA(), trustme.CA()
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"

    def install(ca: trustme.CA) -> None:
        leaf = ca.issue_cert("localhost", "127.0.0.1")
        leaf.private_key_pem.write_to_path(str(key_file))
        leaf.cert_chain_pems[0].write_to_path(str(cert_file))

    install(first_ca)
    tls = {"cert_file": cert_file, "key_file": key_file, "reload_interval": 0.1}
    server = await start_server({"tls": tls, "auth": {"enabled": False}})
    assert (await fetch(server.port, "/healthz", context=tls_client(trust=first_ca))).status == 200
    install(second_ca)
    answer = await _eventually(lambda: fetch(server.port, "/healthz", context=tls_client(trust=second_ca)))
    assert answer.status == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        await fetch(server.port, "/healthz", context=tls_client(trust=first_ca))


async def _eventually(attempt: Any) -> Answer:
    """Retry `attempt()` for up to 10 s until it answers (trust changes apply asynchronously)."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:
        try:
            answer: Answer = await attempt()
            return answer
        except REFUSED:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_auth_off_counts_the_grpc_scaler_listener() -> None:
    loopback = {"auth": {"enabled": False}, "bind": "127.0.0.1", "metrics_bind": "127.0.0.1"}
    assert unsafe_without_auth(ZeroscaleConfig.model_validate({"server": loopback})) is None
    scaler = {"enabled": True, "bind": "0.0.0.0", "allow_plaintext": True, "allow_unauthenticated": True}
    problem = unsafe_without_auth(ZeroscaleConfig.model_validate({"server": loopback, "grpc": {"scaler": scaler}}))
    assert problem is not None
    assert "grpc.scaler.bind='0.0.0.0'" in problem
