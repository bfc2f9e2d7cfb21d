"""The ZeroscaleRoute CRD: generated from the route models and up to date, installed by both packagings, structural,
and its schema accepts a valid route and refuses bad ones (offline; the real API server in tests/e2e/test_14).

Each bad route the CRD's CEL rules refuse is refused by the model too (the proxy checks every route it reads again):
the rules mirror RouteConfig's validators (adapter/config/route.py), and this keeps a rule from refusing what the
proxy would serve, or the other way round.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from adapter.config.proxy import ProxyConfig
from adapter.config.route_object import RouteSpec, parse_route
from tests.fixtures.manifests import CHART, ROOT, Objects, helm_render, helm_template
from tests.fixtures.route_crd import (
    CRD_FILE,
    REFUSED_BY_CEL,
    REFUSED_BY_SCHEMA,
    REFUSED_BY_SCHEMA_ONLY,
    crd,
    example_route,
    schema,
    schema_errors,
)

GENERATE = ROOT / "scripts" / "crd" / "generate.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crd_generate", GENERATE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_crd_is_up_to_date() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(GENERATE), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_model_changed_without_regenerating_is_caught(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As if RouteSpec gained a field since the CRD was generated: --check fails and names both copies."""

    class Grown(RouteSpec):
        """RouteSpec, one field more."""

        weight: int = 1
        """A new field."""

    module = generator()
    assert module.main(["--check"]) == 0
    monkeypatch.setattr(module, "RouteSpec", Grown)
    assert module.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "deploy/helm/zeroscale/crds/zeroscaleroutes.zeroscale.io.yaml" in out
    assert "deploy/crds/zeroscaleroutes.zeroscale.io.yaml" in out


def test_helm_and_kustomize_install_the_same_crd(helm: Path, base: Objects) -> None:
    """The chart's crds/ (installed by `helm install`) and deploy/base (through deploy/crds) carry the one file."""
    chart_copy = CHART / "crds" / CRD_FILE.name
    assert chart_copy.read_bytes() == CRD_FILE.read_bytes()
    with_crds = helm_template(helm, "--include-crds")
    assert with_crds.returncode == 0, with_crds.stderr
    rendered = [
        doc for doc in yaml.safe_load_all(with_crds.stdout) if doc and doc["kind"] == "CustomResourceDefinition"
    ]
    assert rendered == [crd()]
    (from_base,) = [obj for obj in base if obj["kind"] == "CustomResourceDefinition"]
    assert from_base == crd()


def _nodes(node: dict[str, Any], where: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(where, node)]
    for name, child in (node.get("properties") or {}).items():
        found += _nodes(child, f"{where}.{name}")
    if "items" in node:
        found += _nodes(node["items"], f"{where}[]")
    return found


def test_the_schema_is_structural_and_prunes_nothing_silently() -> None:
    """Every node typed (or int-or-string), no $ref, no anyOf with types, additionalProperties only as a bounded map
    of strings (header names to values), and nothing that keeps unknown fields: an unknown field is refused by strict
    field validation (kubectl's default)."""
    maps = []
    for where, node in _nodes(schema()):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), where
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title"} & set(node), where
        assert "x-kubernetes-preserve-unknown-fields" not in node, where
        if "additionalProperties" in node:
            assert node["additionalProperties"] == {"type": "string", "maxLength": 4096}, where
            assert "properties" not in node, where
            assert node["maxProperties"] <= 16, where
            maps.append(where)
    assert ".spec.match_headers" in maps


def test_every_field_has_its_description() -> None:
    """kubectl explain shows them: every property but the API server's metadata, every object in a list."""
    undescribed = [
        where
        for where, node in _nodes(schema())
        if where not in ("", ".metadata") and not node.get("description") and not where.endswith("[]")
    ]
    assert undescribed == []
    assert (
        "Default: 120."
        in schema()["properties"]["spec"]["properties"]["limits"]["properties"]["hold_timeout"]["description"]
    )


def test_what_kubectl_get_shows() -> None:
    spec = crd()["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["zsroute", "zsr"]
    assert spec["names"]["categories"] == ["zeroscale"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    shown = [column["name"] for column in version["additionalPrinterColumns"] if not column.get("priority")]
    assert shown == ["Hosts", "Mode", "Target", "Ready", "State", "Age"]


def test_the_example_route_is_accepted_by_the_schema_and_the_model() -> None:
    route = example_route()
    assert schema_errors(route) == []
    assert parse_route(route).key == "shop/web"


@pytest.mark.parametrize(
    ("obj", "message"), [case[1:] for case in REFUSED_BY_SCHEMA], ids=[c[0] for c in REFUSED_BY_SCHEMA]
)
def test_the_schema_refuses_a_bad_route_the_model_refuses_too(obj: dict[str, Any], message: str) -> None:
    assert any(message in error for error in schema_errors(obj)), schema_errors(obj)
    with pytest.raises(ValueError, match=r"^spec"):  # the proxy's status message names the field
        parse_route(obj)


def test_a_fraction_of_a_second_is_a_string_in_a_route_object() -> None:
    """int-or-string takes no 0.5: the description says to write "0.5" or "500ms", which both accept."""
    obj, message = REFUSED_BY_SCHEMA_ONLY["fraction"]
    assert any(message in error for error in schema_errors(obj))
    for written in ("0.5", "500ms"):
        fixed = {**obj, "spec": {**obj["spec"], "probe_interval": written}}
        assert schema_errors(fixed) == []
        assert parse_route(fixed).probe_interval == 0.5


def _rule_messages() -> list[str]:
    """Each CEL rule's message; a messageExpression as it reads for `wake: always`."""
    rules = [rule for _, node in _nodes(schema()) for rule in node.get("x-kubernetes-validations") or []]
    return [rule.get("message") or rule["messageExpression"].replace("' + self.wake + '", "always") for rule in rules]


@pytest.mark.parametrize(("obj", "message"), [case[1:] for case in REFUSED_BY_CEL], ids=[c[0] for c in REFUSED_BY_CEL])
def test_what_only_a_cel_rule_refuses_the_model_refuses_too(obj: dict[str, Any], message: str) -> None:
    """The schema lets it through, a CEL rule carries the message the API server answers with, the model refuses."""
    assert schema_errors(obj) == []
    assert any(message in text for text in _rule_messages()), message
    with pytest.raises(ValueError, match=r"^spec"):  # the proxy's status message names the field
        parse_route(obj)


def test_every_cel_rule_has_a_case() -> None:
    cased = {message for _, _, message in REFUSED_BY_CEL}
    assert [text for text in _rule_messages() if not any(message in text for message in cased)] == []


def chart_proxy_config(helm: Path, *options: str) -> dict[str, Any]:
    """`proxy` of the config file the chart renders into its ConfigMap."""
    (config_map,) = [obj for obj in helm_render(helm, *options) if obj["kind"] == "ConfigMap"]
    proxy: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])["proxy"]
    return proxy


def test_the_chart_serves_route_objects_and_fills_the_lease_from_the_release(helm: Path) -> None:
    """routeObjects.enabled (the default): route_objects on, and proxy.activator (which it needs) named after the
    release unless the config names its own; the result loads as the proxy would load it."""
    proxy = chart_proxy_config(helm, "--set", "fullnameOverride=edge")
    assert proxy["route_objects"] == {"enabled": True}
    assert proxy["activator"] == {
        "proxy_service": {"service": "edge-proxy", "namespace": "zeroscale"},
        "lease_namespace": "zeroscale",
    }
    assert ProxyConfig.model_validate(proxy).route_objects.enabled
    own = "config.proxy.activator.lease_namespace=ha,config.proxy.activator.proxy_service.service=front"
    proxy = chart_proxy_config(helm, "--set", own + ",config.proxy.activator.proxy_service.namespace=edge")
    assert proxy["activator"] == {"proxy_service": {"service": "front", "namespace": "edge"}, "lease_namespace": "ha"}


@pytest.mark.parametrize(
    "option", ["routeObjects.enabled=false", "config.proxy.route_objects.enabled=false", "proxy.enabled=false"]
)
def test_the_chart_leaves_route_objects_off_when_told(helm: Path, option: str) -> None:
    """Off by the chart's value, by the config (which wins), or with no proxy: no route_objects, no Lease settings."""
    objects = helm_render(helm, "--set", option)
    (config_map,) = [obj for obj in objects if obj["kind"] == "ConfigMap"]
    proxy = yaml.safe_load(config_map["data"]["config.yaml"])["proxy"]
    assert not (proxy.get("route_objects") or {}).get("enabled")
    assert "activator" not in proxy
    assert not [obj for obj in objects if obj["metadata"]["name"].endswith(("-proxy-routes", "-routes-edit"))]
