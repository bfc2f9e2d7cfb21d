"""Writes the ZeroscaleRoute CRD (`zeroscaleroutes.zeroscale.io`); `--check` fails (exit 1) when a copy is out of date
(tests/deploy/test_crd.py runs it).

Its schema is the JSON schema of RouteSpec and RouteStatus (adapter/config/route_object.py), the models the proxy
reads a route with, made structural as the API server requires: `$ref`s inlined, `X | None` as X not required,
`str | int` ports and durations as `x-kubernetes-int-or-string`, no `additionalProperties: false` (the API server
prunes unknown fields, and refuses them under kubectl's strict field validation), titles dropped. What a schema
cannot say is said by CEL rules (RULES, mirroring RouteConfig's validators in adapter/config/route.py), checked at
admission: no webhook.

Defaults: those of choices (strings, booleans, lists: mode, wake, path prefix...) are in the schema, so `kubectl get`
shows a route's mode; numeric ones (limits, intervals, replicas) are not: the proxy applies them when it reads a
route, so a newer proxy's defaults reach routes already stored. Each description says its default.

One source, two copies written byte for byte: deploy/helm/zeroscale/crds/ (Helm installs it on `helm install`, never
on upgrade: the chart's README says how to upgrade it) and deploy/crds/ (deploy/base includes it; kustomize loads
no file outside a kustomization's root, so deploy/ cannot read the chart's copy).

Usage: .venv/bin/python scripts/crd/generate.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from adapter.config import route_object  # noqa: E402
from adapter.config.route import ALSO_WAKE_ONCE, HOST_PATTERN, LABEL_VALUE_MAX  # noqa: E402
from adapter.config.route_object import RouteSpec, RouteStatus  # noqa: E402

NAME = f"{route_object.PLURAL}.{route_object.GROUP}"
FILE = f"{NAME}.yaml"
COPIES = (ROOT / "deploy" / "helm" / "zeroscale" / "crds" / FILE, ROOT / "deploy" / "crds" / FILE)

Schema = dict[str, Any]
Rule = dict[str, str]

# CEL rules (x-kubernetes-validations) by place in the object (`[]`: each item), for what the schema cannot say.
# Each mirrors a check of RouteConfig (adapter/config/route.py) with its message; an object's route has no namespace
# to name (its Services and target are in its own), so RouteConfig's namespace checks have no rule here.
RULES: dict[str, list[Rule]] = {
    # At the root, the only place a rule may read metadata.name.
    "": [
        {
            "rule": f"self.spec.mode != 'activator' || self.metadata.name.size() <= {LABEL_VALUE_MAX}",
            "message": f"a route in mode: activator has a name of at most {LABEL_VALUE_MAX} characters: it is the "
            "value of the zeroscale.io/route label on every EndpointSlice the route writes",
        }
    ],
    "spec": [
        {
            "rule": "(self.mode == 'activator') == has(self.activator)",
            "message": "mode: activator goes with an activator block (service, port), and only with it",
        },
        {
            "rule": "has(self.target) || self.wake in ['hpa', 'none']",
            "messageExpression": "'wake: ' + self.wake + ' needs a target (kind, name); use wake: hpa or none "
            "without one'",
        },
        {
            "rule": "self.mode != 'activator' || has(self.target)",
            "message": "mode: activator needs a target: its spec.replicas says when to switch",
        },
        {
            "rule": "!has(self.activator) || self.activator.service != self.upstream.service",
            "message": "activator.service is the Service clients call, not the upstream that selects pods",
        },
        {
            "rule": "self.overflow != 'waking_page' || has(self.waking_page)",
            "message": "overflow: waking_page needs a waking_page",
        },
        {
            "rule": "self.overflow != 'fallback' || has(self.fallback)",
            "message": "overflow: fallback needs a fallback",
        },
        {
            # Each item is the only one of its kind and name, and not the target (kinds default before CEL runs).
            "rule": "!has(self.also_wake) || self.also_wake.all(a, "
            "self.also_wake.exists_one(b, b.kind == a.kind && b.name == a.name) && "
            "(!has(self.target) || a.kind != self.target.kind || a.name != self.target.name))",
            "message": ALSO_WAKE_ONCE,
        },
    ],
    "spec.hosts[]": [
        {
            "rule": f"self.lowerAscii().matches(r'{HOST_PATTERN.pattern}')",
            "message": "a host is a host name, `*.suffix` or `*`",
        }
    ],
    "spec.path_prefix": [{"rule": "self.startsWith('/')", "message": "a path prefix starts with /"}],
}

# Bounds and list semantics the models leave to the API: lengths that bound CEL's cost estimate (a string without
# maxLength is costed as the largest request), and the status's conditions as metav1.Condition has them.
EXTRA: dict[str, Schema] = {
    "spec.hosts[]": {"maxLength": 253},  # a DNS name
    "status.conditions": {"maxItems": 8, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    "status.conditions[].type": {"maxLength": 316},
    "status.conditions[].reason": {"maxLength": 1024, "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
    "status.conditions[].message": {"maxLength": 32768},
    "status.conditions[].lastTransitionTime": {"format": "date-time"},
    "status.conditions[].observedGeneration": {"minimum": 0},
    "status.observedGeneration": {"minimum": 0},
}

# What a structural schema node may carry (the rest of pydantic's output is dropped or converted).
_KEPT = {
    "type",
    "description",
    "properties",
    "items",
    "required",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
    "format",
    "default",
    "x-kubernetes-int-or-string",
}
_DEFAULTED_TYPES = {"string", "boolean", "array"}
DURATION_HELP = "A number of whole seconds, or a string: 0.5, 500ms, 5s, 2m, 1h."


def _text(description: str) -> str:
    """A docstring as one paragraph: kubectl explain wraps it itself."""
    return " ".join(description.split())


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """The node with its `$ref` inlined (the referring node's own keys, its description, win)."""
    if "$ref" not in node:
        return node
    target = defs[node["$ref"].removeprefix("#/$defs/")]
    return {**target, **{key: value for key, value in node.items() if key != "$ref"}}


def _one_of_any(node: Schema, defs: dict[str, Schema], where: str) -> Schema:
    """An `anyOf` as a structural schema: `X | None` is X; number-or-string (a Duration) and string-or-integer (a
    port) are int-or-string. Anything else is a model the CRD cannot carry: stop, naming it."""
    outer = {key: value for key, value in node.items() if key != "anyOf"}
    branches = [_resolve(branch, defs) for branch in node["anyOf"] if branch.get("type") != "null"]
    types = {branch.get("type") for branch in branches}
    if len(branches) == 1:
        return {**branches[0], **outer}
    if types == {"number", "string"}:
        # int-or-string admits no fraction as a number: 0.5 is written "0.5" or "500ms" (DURATION_HELP says so). A
        # structural schema puts no type in anyOf branches: the value checks sit on the node, each applying to its
        # own type (minimum to a number, pattern to a string).
        (text,) = [branch for branch in branches if branch["type"] == "string"]
        outer["description"] = f"{outer.get('description', '')} {DURATION_HELP}".strip()
        return {**outer, "x-kubernetes-int-or-string": True, "minimum": 0, **_bounds(text)}
    if types == {"string", "integer"} and node.get("x-kubernetes-int-or-string"):
        # A port: each branch's bounds on the node, as for a Duration.
        (text,) = [branch for branch in branches if branch["type"] == "string"]
        (number,) = [branch for branch in branches if branch["type"] == "integer"]
        return {**outer, **_bounds(text), **{key: number[key] for key in ("minimum", "maximum") if key in number}}
    raise SystemExit(f"{where}: anyOf {sorted(map(str, types))} has no structural form: extend scripts/crd/generate.py")


def _bounds(node: Schema) -> Schema:
    return {key: value for key, value in node.items() if key in ("pattern", "minLength", "maxLength")}


def _describe_default(node: Schema) -> Schema:
    """Keeps a default the API server may apply (see the module's docstring), and says every default in the text."""
    if "default" not in node:
        return node
    default = node.pop("default")
    if default is None:
        return node
    shown = int(default) if isinstance(default, float) and default.is_integer() else default
    node["description"] = f"{node.get('description', '')} Default: {json.dumps(shown)}.".strip()
    if node.get("type") in _DEFAULTED_TYPES and not node.get("x-kubernetes-int-or-string"):
        node["default"] = default
    return node


def structural(node: Schema, defs: dict[str, Schema], where: str) -> Schema:
    """A pydantic JSON schema node as a structural schema node, with its CEL rules and EXTRA bounds."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        node = _one_of_any(node, defs, where)
    extra = node.get("additionalProperties")
    if extra not in (None, False) and _resolve(extra, defs).get("type") != "string":
        raise SystemExit(f"{where}: only a map of strings (header names to values) has a place in a route")
    out: Schema = {key: value for key, value in node.items() if key in _KEPT}
    if extra not in (None, False):
        # Header maps: names are checked by the proxy's model; values bounded here for CEL's cost estimate.
        out["additionalProperties"] = {"type": "string", "maxLength": 4096}
    if "description" in out:
        out["description"] = _text(out["description"])
    out = _describe_default(out)
    if "properties" in out:
        out["properties"] = {
            name: structural(child, defs, f"{where}.{name}".lstrip(".")) for name, child in out["properties"].items()
        }
    if "items" in out:
        out["items"] = structural(out["items"], defs, f"{where}[]")
    out.update(EXTRA.get(where, {}))
    if where in RULES:
        out["x-kubernetes-validations"] = RULES[where]
    # Every field and every object has its text; a list's scalar items are described by their list.
    if not out.get("description") and not (where.endswith("[]") and out.get("type") != "object"):
        raise SystemExit(f"{where} has no description: give its field a docstring (kubectl explain shows it)")
    return out


def _model_schema(model: type[RouteSpec] | type[RouteStatus], where: str) -> Schema:
    schema = model.model_json_schema()
    return structural(schema, schema.pop("$defs", {}), where)


def _top_level(spec: Schema, status: Schema) -> Schema:
    kind = route_object.KIND
    return {
        "type": "object",
        "description": _text((route_object.__doc__ or "").split("\n\n")[0]),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{route_object.API_VERSION}."},
            "kind": {"type": "string", "description": f"{kind}."},
            # The API server owns metadata's schema: it refuses any other key here.
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": RULES[""],
    }


def _column(name: str, path: str, description: str = "", kind: str = "string", priority: int = 0) -> Schema:
    """A `kubectl get` column; priority 1: only with `-o wide`."""
    column: Schema = {"name": name, "type": kind, "jsonPath": path}
    return column | ({"description": description} if description else {}) | ({"priority": priority} if priority else {})


COLUMNS = [
    _column("Hosts", ".spec.hosts", "The hosts the route claims."),
    _column("Mode", ".spec.mode", "in_path or activator."),
    _column("Target", ".spec.target.name", "The workload a wake scales up."),
    _column("Ready", '.status.conditions[?(@.type=="Ready")].status', "Upstream and target found, readiness known."),
    _column("State", ".status.state", "Cold (requests are held) or Warm."),
    _column("Accepted", '.status.conditions[?(@.type=="Accepted")].reason', "Why accepted or not.", priority=1),
    _column("Held", ".status.held", "Requests held now.", kind="integer", priority=1),
    _column("Cold-Start", ".status.lastColdStartSeconds", "The last cold start, seconds.", kind="number", priority=1),
    _column("Age", ".metadata.creationTimestamp", kind="date"),
]


def crd() -> Schema:
    schema = _top_level(_model_schema(RouteSpec, "spec"), _model_schema(RouteStatus, "status"))
    version = {
        "name": route_object.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "subresources": {"status": {}},
        "additionalPrinterColumns": COLUMNS,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/part-of": "zeroscale"}},
        "spec": {
            "group": route_object.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": route_object.KIND,
                "listKind": f"{route_object.KIND}List",
                "plural": route_object.PLURAL,
                "singular": route_object.SINGULAR,
                "shortNames": route_object.SHORT_NAMES,
                "categories": ["zeroscale"],
            },
            "versions": [version],
        },
    }


HEADER = """\
# Generated by scripts/crd/generate.py from adapter/config/route_object.py and adapter/config/route.py: do not edit;
# change the models and run `.venv/bin/python scripts/crd/generate.py`. Copies: deploy/helm/zeroscale/crds/ and
# deploy/crds/ (identical). Helm installs it on install only: before `helm upgrade`, run
#   kubectl apply --server-side --force-conflicts -f deploy/helm/zeroscale/crds/
"""


def crd_text() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="fail when a copy is out of date")
    args = parser.parse_args(argv)
    text = crd_text()
    stale = [path for path in COPIES if not path.exists() or path.read_text(encoding="utf-8") != text]
    if args.check and stale:
        names = ", ".join(str(path.relative_to(ROOT)) for path in stale)
        print(f"{names} out of date: run .venv/bin/python scripts/crd/generate.py")
        return 1
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
