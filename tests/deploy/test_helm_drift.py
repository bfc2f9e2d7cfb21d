"""One installation, two packagings: the chart's default render (release `zeroscale` in namespace `zeroscale`) and
deploy/base must make the same objects: names, ports, labels, selectors, RBAC rules, security contexts, probes,
the config file, everything but what each packaging adds by its nature (listed in NOT_COMPARED with the reason).

Each side is normalised only where the packaging, not the installation, differs; the rest is compared whole,
so a port, a rule or a security setting changed on one side only fails here.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.manifests import DEPLOY, Objects, helm_render

# Labels only Helm adds (kustomize's deploy/base has part-of on every object, and the name label on components).
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
# The pod-template annotation that rolls the pods on a config change (kustomize renames the ConfigMap instead).
ROLL_ANNOTATION = "checksum/config"
_CONFIG_MAP = re.compile(r"^zeroscale-config(-[a-z0-9]{10})?$")
# (kind, name in deploy/base) -> why the chart has no such object.
NOT_COMPARED = {
    # Helm installs into a namespace it does not own (`--create-namespace`); docs/how-to/helm.md says to label it
    # restricted, as deploy/base's Namespace is.
    ("Namespace", "zeroscale"): "helm --create-namespace",
    # Helm installs crds/ apart from the templates (`helm template` shows them with --include-crds alone); the two
    # copies are one generated file (scripts/crd/generate.py --check, tests/deploy/test_route_crd.py).
    ("CustomResourceDefinition", "zeroscaleroutes.zeroscale.io"): "the chart's crds/",
}
# deploy/base name -> the chart's: prefixed, so two releases in one namespace do not share it.
RENAMED = {("NetworkPolicy", "default-deny-ingress"): "zeroscale-default-deny-ingress"}
# Objects only the chart makes, and why: deploy/base leaves certificates to an overlay.
CHART_ONLY_KINDS = {"Secret": "certificates.mode generate (deploy/overlays/certs makes them for kustomize)"}


def _strip(node: Any) -> Any:
    """Drop Helm-only labels and the roll annotation anywhere; name the ConfigMap as kustomize's base name."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in HELM_LABELS or key == ROLL_ANNOTATION:
                continue
            stripped = _strip(value)
            if key == "annotations" and not stripped:
                continue
            out[key] = stripped
        return out
    if isinstance(node, list):
        return [_strip(item) for item in node]
    if isinstance(node, str) and _CONFIG_MAP.match(node):
        return "zeroscale-config"
    return node


def normalised(obj: dict[str, Any]) -> dict[str, Any]:
    obj = _strip(copy.deepcopy(obj))
    if obj["kind"] == "ConfigMap":
        obj["data"] = {key: yaml.safe_load(text) for key, text in obj["data"].items()}
    if obj["kind"] == "APIService":
        # deploy/base leaves the caBundle to an overlay (cert-manager's injector or `zeroscale certs`).
        obj["spec"].pop("caBundle", None)
    return obj


def keyed(objects: Objects) -> dict[tuple[str, str], dict[str, Any]]:
    return {(obj["kind"], normalised(obj)["metadata"]["name"]): normalised(obj) for obj in objects}


def assert_same(kustomize_render: Objects, chart_render: Objects) -> None:
    kustomize = {key: obj for key, obj in keyed(kustomize_render).items() if key not in NOT_COMPARED}
    kustomize = {(kind, RENAMED.get((kind, name), name)): obj for (kind, name), obj in kustomize.items()}
    chart = {key: obj for key, obj in keyed(chart_render).items() if key[0] not in CHART_ONLY_KINDS}
    assert sorted(chart) == sorted(kustomize)
    for key, obj in kustomize.items():
        obj["metadata"]["name"] = key[1]
        assert chart[key] == obj, key


def test_the_chart_renders_what_deploy_base_renders(base: Objects, chart_default: Objects) -> None:
    assert_same(base, chart_default)


def test_the_chart_with_a_delegate_grants_what_beside_keda_grants(helm: Path, rendered: dict[str, Objects]) -> None:
    """deploy/overlays/beside-keda sets the delegate through the environment, the chart through `config`; the
    RBAC and the APIService must be the same."""
    delegate = "config.delegate.service.namespace=keda,config.delegate.service.name=keda-operator-metrics-apiserver"
    chart = keyed(helm_render(helm, "--set", f"{delegate},certificates.mode=cert-manager"))
    overlay = keyed(rendered["beside-keda"])
    kinds = {"ClusterRole", "ClusterRoleBinding", "RoleBinding", "APIService"}
    assert {key: obj for key, obj in chart.items() if key[0] in kinds} == {
        key: obj for key, obj in overlay.items() if key[0] in kinds
    }


def test_the_chart_with_an_activator_route_grants_what_the_activator_overlay_grants(
    helm: Path, base: Objects, rendered: dict[str, Objects], tmp_path: Path
) -> None:
    """deploy/overlays/activator is written for deploy/examples/activator.zeroscale.yaml's route; the chart given
    that route renders its grants from the config: the same Roles and bindings, in the same namespaces."""
    example = yaml.safe_load((DEPLOY / "examples" / "activator.zeroscale.yaml").read_text())
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": {"proxy": example["proxy"]}}), encoding="utf-8")
    kinds = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}

    def rbac(objects: Objects) -> dict[tuple[str, str | None, str], dict[str, Any]]:
        return {
            (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): normalised(obj)
            for obj in objects
            if obj["kind"] in kinds
        }

    assert rbac(helm_render(helm, "--values", str(values))) == rbac(base + rendered["activator"])


# Overlay -> the chart's values for the same installation.
OVERLAY_VALUES = {
    "cert-manager": "certificates.mode=cert-manager",
    "keda": "certificates.mode=cert-manager,apiService.enabled=false,keda.clientCertificate=true",
    "monitoring": "podMonitors.enabled=true,prometheusRule.enabled=true",
}


@pytest.mark.parametrize("overlay", sorted(OVERLAY_VALUES))
def test_the_chart_renders_what_each_overlay_renders(
    helm: Path, rendered: dict[str, Objects], base: Objects, overlay: str
) -> None:
    """cert-manager's Issuers and Certificates, KEDA's installation, the PodMonitors: the same as the overlays'
    (the monitoring overlay adds its PodMonitors to an installation: compared with base + them)."""
    chart = helm_render(helm, "--set", OVERLAY_VALUES[overlay])
    kustomize = rendered[overlay] + (base if overlay == "monitoring" else [])
    assert_same(kustomize, chart)


def test_the_pods_labels_and_selectors_differ_only_by_the_release(base: Objects, chart_default: Objects) -> None:
    """Kept apart from the whole-object comparison above so a failure says which label moved."""
    for name in ("zeroscale-adapter", "zeroscale-proxy"):
        (ours,) = [o for o in chart_default if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
        (theirs,) = [o for o in base if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
        selector = ours["spec"]["selector"]["matchLabels"]
        assert selector == {**theirs["spec"]["selector"]["matchLabels"], "app.kubernetes.io/instance": "zeroscale"}
        assert ours["spec"]["template"]["metadata"]["labels"] == selector
        assert theirs["metadata"]["labels"].items() <= ours["metadata"]["labels"].items()
