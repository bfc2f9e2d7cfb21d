"""`zeroscale doctor` against the real control plane: a working installation, then broken ones."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapter.children import port_outside_ephemeral
from tests.e2e import install
from tests.e2e.cluster import ControlPlane, Kube
from tests.e2e.fixtures import Adapter, Installed, Timeline

HPA_NAMESPACE = "e2e-doctor"
MERGE_PATCH = "application/merge-patch+json"


def doctor(plane: ControlPlane) -> tuple[int, list[dict[str, str]]]:
    command = [sys.executable, "-m", "adapter", "doctor", "--kubeconfig", str(plane.admin_kubeconfig)]
    done = subprocess.run(
        [*command, "--hpa-namespace", HPA_NAMESPACE, "--json"], capture_output=True, text=True, timeout=120
    )
    findings: list[dict[str, str]] = json.loads(done.stdout)
    return done.returncode, findings


def failures(findings: list[dict[str, str]]) -> list[dict[str, str]]:
    return [finding for finding in findings if finding["level"] == "fail"]


def diagnose_broken(
    plane: ControlPlane, kube: Kube, adapter: Adapter, installed: Installed, breakage: Callable[[], Any]
) -> list[dict[str, str]]:
    """Doctor's failures with the installation broken by `breakage`; the installation is repaired after."""
    try:
        breakage()
        status, findings = doctor(plane)
    finally:
        kube.apply(install.shipped("hpa-rbac.yaml") + install.shipped("adapter-rbac.yaml"))
        install.register(kube, adapter.port, installed.certs)
        install.wait_available(kube)
    assert status == 1, findings
    return failures(findings)


def test_doctor_passes_a_working_installation_and_names_each_breakage(
    plane: ControlPlane, kube: Kube, adapter: Adapter, installed: Installed, tmp_path: Path, timeline: Timeline
) -> None:
    kube.namespace(HPA_NAMESPACE)
    status, findings = doctor(plane)
    assert failures(findings) == [], findings
    assert status == 0
    assert any(f["check"] == "APIService Available" and f["level"] == "ok" for f in findings)
    by_check = {f["check"]: f for f in findings}
    version = kube.get("/version")["gitVersion"]
    assert by_check["Kubernetes version"]["message"] == version
    scale_to_zero = by_check["HPA scale to zero"]
    assert scale_to_zero["level"] == ("ok" if kube.server_minor() >= 37 else "warn"), scale_to_zero
    seen: list[str] = []

    # 1. The APIService names a port the Service does not have.
    wrong_port = port_outside_ephemeral()
    patch = {"spec": {"service": {"port": wrong_port}}}
    found = diagnose_broken(
        plane,
        kube,
        adapter,
        installed,
        lambda: kube.request("PATCH", install.APISERVICE_PATH, patch, MERGE_PATCH),
    )
    service_check = f"Service {install.NAMESPACE}/{install.SERVICE}"
    assert any(f["check"] == service_check and f"has no port {wrong_port}" in f["message"] for f in found), found
    seen.append(f"wrong port -> {service_check}: has no port")

    # 2. A caBundle from another `zeroscale certs` run: it did not sign the serving certificate.
    other = install.make_certs(tmp_path / "other")
    bundle = base64.b64encode((other / "ca.crt").read_bytes()).decode()
    found = diagnose_broken(
        plane,
        kube,
        adapter,
        installed,
        lambda: kube.request("PATCH", install.APISERVICE_PATH, {"spec": {"caBundle": bundle}}, MERGE_PATCH),
    )
    assert any(f["check"] == "caBundle" and "did not sign the serving certificate" in f["message"] for f in found)
    seen.append("caBundle mismatch -> caBundle: did not sign the serving certificate")

    # 3. Without the shipped binding the HPA controller may still read external metrics: v1.37's bootstrap role
    # system:controller:horizontal-pod-autoscaler grants it (the binding is for clusters where it does not).
    kube.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{install.HPA_BINDING}")
    status, findings = doctor(plane)
    assert (status, failures(findings)) == (0, []), findings
    assert any(f["check"] == "HPA controller RBAC" and f["level"] == "ok" for f in findings), findings
    kube.apply(install.shipped("hpa-rbac.yaml"))
    seen.append("no shipped HPA binding -> still ok (bootstrap role grants it)")

    # 4. The adapter may not review the callers' tokens and access.
    binding = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/zeroscale-adapter:system:auth-delegator"
    found = diagnose_broken(plane, kube, adapter, installed, lambda: kube.delete(binding))
    checks = [f["check"] for f in found]
    assert checks == ["adapter RBAC: create TokenReviews", "adapter RBAC: create SubjectAccessReviews"], found
    seen.append("no auth-delegator binding -> adapter RBAC: may not create TokenReviews, SubjectAccessReviews")

    status, findings = doctor(plane)
    assert (status, failures(findings)) == (0, []), "repaired"
    timeline.record(
        f"doctor: {version}, HPA scale to zero {scale_to_zero['level']}; working install 0 problems; " + "; ".join(seen)
    )
