"""Registration and authentication against the real aggregator, ConfigMap, TokenReview and SubjectAccessReview."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.e2e import install
from tests.e2e.cluster import ControlPlane, Kube, KubeError, wait_for
from tests.e2e.direct import call, client_certificate, counter, counter_after
from tests.e2e.fixtures import Adapter, Installed, Timeline
from tests.fixtures.redis_servers import RedisProcess

NAMESPACE = "e2e-auth"
METRIC_PATH = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/redis-jobs"
SELECTED = f"{METRIC_PATH}?labelSelector={quote('key=auth-jobs')}"
DENIED_BY_REVIEW = ("zeroscale_api_authorizations_total", {"decision": "deny", "origin": "review"})


@pytest.fixture(scope="module")
def users(kube: Kube) -> None:
    """bob may read external metrics in e2e-auth (shipped ClusterRole, a RoleBinding); alice may not."""
    kube.namespace(NAMESPACE)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "bob-reads-external-metrics", "namespace": NAMESPACE},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "zeroscale-external-metrics-reader",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "no-rbac", "namespace": NAMESPACE}}
    kube.apply([binding, account])


def test_registered_available_and_readable_by_admin(
    adapter: Adapter, kube: Kube, redis_server: RedisProcess, users: None, timeline: Timeline
) -> None:
    condition = install.available(kube)
    assert condition["status"] == "True", condition
    spec = kube.get(install.APISERVICE_PATH)["spec"]
    assert spec.get("caBundle"), "the aggregator verifies the adapter's certificate"
    assert not spec.get("insecureSkipTLSVerify")

    redis_server.client().rpush("auth-jobs", *range(7))

    def read() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = kube.get(SELECTED)["items"]
        return items if items and items[0]["value"] == "7" else None

    items = wait_for(read, 15, "admin reads 7 through the aggregator")
    assert items[0]["metricName"] == "redis-jobs"
    assert items[0]["metricLabels"] == {"key": "auth-jobs"}
    timeline.record(f"registration: APIService Available=True {adapter.available_after:.1f} s after registering")


def test_direct_callers_are_authenticated_and_authorized(
    adapter: Adapter,
    plane: ControlPlane,
    kube: Kube,
    installed: Installed,
    users: None,
    tmp_path: Path,
    timeline: Timeline,
) -> None:
    ca = installed.certs / "ca.crt"
    pki = plane.pki
    front_proxy = (pki / "front-proxy-client.crt", pki / "front-proxy-client.key")

    # No credentials at all.
    status, body = call(adapter.port, SELECTED, ca)
    assert (status, body.get("reason")) == (401, "Unauthorized"), body
    # A token the real TokenReview does not know.
    status, _ = call(adapter.port, SELECTED, ca, headers={"Authorization": "Bearer not-a-real-token"})
    assert status == 401
    # Signed by the front-proxy CA but not with a name the cluster's ConfigMap allows (front-proxy-client):
    # its identity headers are not believed.
    intruder = client_certificate(pki / "front-proxy-ca.crt", pki / "front-proxy-ca.key", "intruder", tmp_path)
    status, _ = call(
        adapter.port, SELECTED, ca, intruder, {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
    )
    assert status == 401

    # The aggregator's own certificate, as it would forward alice and bob: the adapter asks the real
    # apiserver (SubjectAccessReview) and follows its RBAC.
    denials = counter(adapter.metrics_port, *DENIED_BY_REVIEW)
    status, body = call(adapter.port, SELECTED, ca, front_proxy, {"X-Remote-User": "alice", "X-Remote-Group": "devs"})
    assert status == 403, body
    assert 'User "alice" cannot list resource "redis-jobs"' in body["message"]
    decided = counter_after(adapter.metrics_port, *DENIED_BY_REVIEW, before=denials)
    assert decided == denials + 1, "decided by a SubjectAccessReview"
    status, body = call(adapter.port, SELECTED, ca, front_proxy, {"X-Remote-User": "bob"})
    assert status == 200, body
    assert body["items"][0]["value"] == "7"

    # A ServiceAccount's bearer token: TokenReview says who it is, SubjectAccessReview says no.
    token = kube.service_account_token(NAMESPACE, "no-rbac")
    status, body = call(adapter.port, SELECTED, ca, headers={"Authorization": f"Bearer {token}"})
    assert status == 403, body
    assert f"system:serviceaccount:{NAMESPACE}:no-rbac" in body["message"]

    # Through the aggregator, alice is refused as well (by the apiserver's own authorizer, which runs first).
    with pytest.raises(KubeError) as refused:
        kube.request("GET", SELECTED, headers={"Impersonate-User": "alice"})
    assert refused.value.status == 403
    timeline.record(
        "auth: direct no-credentials 401, unknown token 401, front-proxy CA but CN intruder 401; "
        "alice via front-proxy cert 403 (adapter's SAR), bob 200, SA token without RBAC 403"
    )
