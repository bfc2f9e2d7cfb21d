"""The ZeroscaleRoute CRD on the real API server: accepted (a structural schema, its CEL rules compiled within the
cost budget), a valid route admitted, each bad route the offline tests know (tests/fixtures/route_crd.py) refused
with its message, `kubectl explain` showing the fields' descriptions, and a tenant holding only the built-in `edit`
role (the aggregated ClusterRoles of deploy/base) writing routes in its namespace and nothing of their status.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.e2e import install
from tests.e2e.cluster import Kube, wait_for
from tests.e2e.fixtures import Timeline
from tests.fixtures.route_crd import CRD_FILE, REFUSED_BY_CEL, REFUSED_BY_SCHEMA, REFUSED_BY_SCHEMA_ONLY, route

NAMESPACE = "e2e-routes"
CRD = "zeroscaleroutes.zeroscale.io"
TENANT = f"system:serviceaccount:{NAMESPACE}:tenant"
REFUSED = [*REFUSED_BY_CEL, *REFUSED_BY_SCHEMA, *((name, *case) for name, case in REFUSED_BY_SCHEMA_ONLY.items())]


def in_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": NAMESPACE}}


def create(kube: Kube, obj: dict[str, Any], *, as_user: str | None = None) -> subprocess.CompletedProcess[str]:
    """`kubectl create` with kubectl's strict field validation (its default), as the admin or impersonating."""
    who = [f"--as={as_user}"] if as_user else []
    return kube.kubectl(*who, "create", "--validate=strict", "-f", "-", stdin=json.dumps(obj), check=False)


def test_the_documented_upgrade_takes_over_the_crd_helm_created(kube: Kube, timeline: Timeline) -> None:
    """Helm creates crds/ (its field manager owning every field) and never updates them: a newer CRD applied
    server-side stops on Helm's fields, and with --force-conflicts, as the docs say to upgrade, takes them over."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}"
    kube.delete(path)
    wait_for(lambda: kube.kubectl("get", "crd", CRD, check=False).returncode != 0 or None, 60, "the CRD gone")
    kube.kubectl("create", "--field-manager=helm", "-f", str(CRD_FILE))
    newer = CRD_FILE.read_text(encoding="utf-8").replace("Held (queued) requests;", "Held (queued) requests, newer;")
    plain = kube.kubectl("apply", "--server-side", "-f", "-", stdin=newer, check=False)
    assert plain.returncode != 0
    assert "conflict" in plain.stderr
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=newer)
    schema = kube.get(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    limits = schema["properties"]["spec"]["properties"]["limits"]["properties"]
    assert "newer" in limits["max_held_requests"]["description"]
    timeline.record("route CRD: a newer CRD over Helm's: conflicts without --force-conflicts, applied with it")


@pytest.fixture(scope="module")
def crd(kube: Kube, timeline: Timeline) -> None:
    """The generated CRD applied as the docs say to upgrade it (Helm may have created it in test_10)."""
    started = time.monotonic()
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=30s")
    timeline.record(f"route CRD: applied and Established in {time.monotonic() - started:.2f} s")
    kube.namespace(NAMESPACE)


def test_a_valid_route_is_admitted_and_kubectl_shows_it(kube: Kube, crd: None, timeline: Timeline) -> None:
    valid = in_namespace(route())
    done = create(kube, valid)
    assert done.returncode == 0, done.stderr
    try:
        table = kube.kubectl("-n", NAMESPACE, "get", "zsr", "-o", "wide").stdout.split("\n")
        header = table[0].split()
        assert header == ["NAME", "HOSTS", "MODE", "TARGET", "READY", "STATE", "ACCEPTED", "HELD", "COLD-START", "AGE"]
        assert table[1].split()[:4] == [
            "web",
            '["web-public.shop","web-public.shop.svc","web-public.shop.svc.cluster.local"]',
            "in_path",
            "web",
        ]
        stored = kube.get(f"/apis/zeroscale.io/v1alpha1/namespaces/{NAMESPACE}/zeroscaleroutes/web")
        # Choices are defaulted and stored; numbers are left to the proxy (the description says each default).
        assert (stored["spec"]["mode"], stored["spec"]["path_prefix"], stored["spec"]["wake_without_hpa"]) == (
            "in_path",
            "/",
            True,
        )
        assert "max_held_bytes" not in stored["spec"]["limits"]
        explained = kube.kubectl("explain", "zeroscaleroute.spec.limits").stdout
        assert "How long a request waits for a ready endpoint (504 beyond)." in " ".join(explained.split())
        assert "Default: 120." in explained
        timeline.record(f"route CRD: shop/web admitted as {NAMESPACE}/web; kubectl get zsr -o wide: {' '.join(header)}")
    finally:
        kube.delete(f"/apis/zeroscale.io/v1alpha1/namespaces/{NAMESPACE}/zeroscaleroutes/web")


@pytest.mark.parametrize(("obj", "message"), [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_a_bad_route_is_refused_at_admission_with_its_message(
    kube: Kube, crd: None, timeline: Timeline, obj: dict[str, Any], message: str
) -> None:
    done = create(kube, in_namespace(obj))
    assert done.returncode != 0, f"admitted: {obj['spec']}"
    assert message in done.stderr, done.stderr
    said = next(line for line in done.stderr.splitlines() if message in line)
    timeline.record(f"route CRD: refused: {said[said.index(message) :][:140]}")


def test_a_tenant_with_edit_writes_routes_in_its_namespace_and_nothing_of_their_status(
    kube: Kube, crd: None, timeline: Timeline
) -> None:
    """The built-in `edit` role, bound in its namespace, gets its route rights by aggregation (deploy/base's
    ClusterRoles); another namespace, the status subresource, and another namespace's Service stay out of reach."""
    started = time.monotonic()
    kube.apply(install.shipped("routes-rbac.yaml"))
    kube.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": NAMESPACE}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "tenant-edit", "namespace": NAMESPACE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": NAMESPACE}],
            },
        ]
    )

    def can(verb: str, namespace: str = NAMESPACE, subresource: str = "") -> bool:
        question = ["auth", "can-i", verb, "zeroscaleroutes.zeroscale.io", "-n", namespace, f"--as={TENANT}"]
        asked = kube.kubectl(*question, f"--subresource={subresource}", check=False)
        return asked.stdout.strip() == "yes"

    wait_for(lambda: can("create") or None, 30, "edit aggregating route rights")
    timeline.record(f"route RBAC: edit aggregated the route rights in {time.monotonic() - started:.2f} s")
    route_path = f"/apis/zeroscale.io/v1alpha1/namespaces/{NAMESPACE}/zeroscaleroutes/web"
    try:
        done = create(kube, in_namespace(route()), as_user=TENANT)
        assert done.returncode == 0, done.stderr
        for verb in ("get", "list", "watch", "update", "patch", "delete"):
            assert can(verb), verb
        assert not can("patch", subresource="status")
        assert not can("update", subresource="status")
        assert not can("create", "default")
        status = kube.kubectl(
            f"--as={TENANT}",
            *("-n", NAMESPACE, "patch", "zsr", "web", "--subresource=status", "--type=merge"),
            *("-p", '{"status": {"state": "Warm"}}'),
            check=False,
        )
        assert status.returncode != 0
        assert "forbidden" in status.stderr
        elsewhere = create(kube, route(name="api", namespace="default"), as_user=TENANT)
        assert "forbidden" in elsewhere.stderr
        other_service = in_namespace(route(name="bank", upstream={"service": "web", "namespace": "bank"}))
        refused = create(kube, other_service, as_user=TENANT)
        assert 'unknown field "spec.upstream.namespace"' in refused.stderr
        timeline.record(
            "route RBAC: the tenant created its route; refused its status, another namespace, another's Service"
        )
    finally:
        kube.delete(route_path)
