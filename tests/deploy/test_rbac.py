"""RBAC least privilege: the grants in deploy/ are exactly the Kubernetes API calls the code makes.

Every `.request(METHOD, ...)` and `.watch(...)` call in adapter/ (found by walking the AST) must be listed in
CALLS with the (verb, group, resource) it needs; the module must hold that group's path and the resource's
name; and which ServiceAccount makes it follows from which process imports the module (`serve` from
adapter/serve.py, `proxy` from adapter/proxy_main.py). Then the rendered RBAC must grant each
ServiceAccount those calls and nothing more: deploy/'s kustomize render and the Helm chart's alike.

A route in mode activator writes its Service's EndpointSlices, which redirects that Service (CVE-2021-25740): its
calls are granted only when such a route is configured (the chart renders them from its routes, deploy/ in
overlays/activator), by Roles in the route's namespace and the Lease's, never cluster-wide. Those Roles name the
Service and the target they read (resourceNames): a proxy run against the API stand-in shows every request it made
is one the Roles allow, as the API server's authorizer would see it.

Not counted: `zeroscale explain` (adapter/hpa/) and `zeroscale doctor` (adapter/doctor/) run on a workstation
with the user's own kubeconfig, never under a deployed ServiceAccount, so no manifest grants their calls.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from adapter.children import port_outside_ephemeral
from adapter.config.proxy import ActivatorConfig
from adapter.kube.client import KubeClient
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice, slices_collection
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.fixtures.manifests import DEPLOY, ROOT, Objects, helm_render, helm_template
from tests.fixtures.proxy import running_proxy, until

ADAPTER_DIR = ROOT / "adapter"
USER_KUBECONFIG_ONLY = ("adapter/hpa/", "adapter/doctor/")
ENTRY_POINTS = {"zeroscale-adapter": "adapter.serve", "zeroscale-proxy": "adapter.proxy_main"}

Call = tuple[str, str, str]  # verb, API group ("" = core), resource (with subresource)

# (module, HTTP method or "watch") -> the calls it makes.
CALLS: dict[tuple[str, str], set[Call]] = {
    ("adapter/api/authn.py", "POST"): {("create", "authentication.k8s.io", "tokenreviews")},
    ("adapter/api/authz.py", "POST"): {("create", "authorization.k8s.io", "subjectaccessreviews")},
    ("adapter/api/trust.py", "GET"): {("get", "", "configmaps")},
    ("adapter/api/trust.py", "watch"): {("watch", "", "configmaps")},
    ("adapter/kube/endpointslices.py", "GET"): {("list", "discovery.k8s.io", "endpointslices")},
    # wake: scale reads the HPAs of its target's namespace before each patch (a list, never a watch).
    ("adapter/kube/hpas.py", "GET"): {("list", "autoscaling", "horizontalpodautoscalers")},
    # Every list-then-watch loop (ListWatch) and the collections it lists by path (collection_lister): an
    # activator route's target workload; its watches are of those and of EndpointSlices. The activator's own
    # outputs too: its Service and the slices it wrote, watched to repair them at once.
    ("adapter/kube/watching.py", "GET"): {
        ("list", "", "services"),
        ("list", "discovery.k8s.io", "endpointslices"),
        ("list", "zeroscale.io", "zeroscaleroutes"),
        ("list", "apps", "deployments"),
        ("list", "apps", "statefulsets"),
        ("list", "apps", "replicasets"),
    },
    ("adapter/kube/watching.py", "watch"): {
        ("watch", "", "services"),
        ("watch", "discovery.k8s.io", "endpointslices"),
        ("watch", "zeroscale.io", "zeroscaleroutes"),
        ("watch", "apps", "deployments"),
        ("watch", "apps", "statefulsets"),
        ("watch", "apps", "replicasets"),
    },
    # Mode activator: the Service clients call, and its slices (listed, written, removed).
    ("adapter/proxy/activator.py", "GET"): {("get", "", "services"), ("list", "discovery.k8s.io", "endpointslices")},
    ("adapter/proxy/activator.py", "POST"): {("create", "discovery.k8s.io", "endpointslices")},
    ("adapter/proxy/activator.py", "PUT"): {("update", "discovery.k8s.io", "endpointslices")},
    ("adapter/proxy/activator.py", "DELETE"): {("delete", "discovery.k8s.io", "endpointslices")},
    ("adapter/kube/leases.py", "GET"): {("get", "coordination.k8s.io", "leases")},
    ("adapter/kube/leases.py", "POST"): {("create", "coordination.k8s.io", "leases")},
    ("adapter/kube/leases.py", "PUT"): {("update", "coordination.k8s.io", "leases")},
    # ReplicaSet is accepted by the scale code but not granted: a Deployment owns its ReplicaSets and would
    # undo a patch of their scale. Someone scaling a bare ReplicaSet adds replicasets/scale to the ClusterRole.
    ("adapter/kube/scale.py", "GET"): {("get", "apps", "deployments/scale"), ("get", "apps", "statefulsets/scale")},
    ("adapter/kube/scale.py", "PATCH"): {
        ("patch", "apps", "deployments/scale"),
        ("patch", "apps", "statefulsets/scale"),
    },
    # To the external metrics delegate (KEDA's metrics server), as Zeroscale: it authorizes a list of the metric.
    ("adapter/api/delegate.py", "GET"): {("list", "external.metrics.k8s.io", "*")},
}
# Modules whose calls take paths built elsewhere: the API paths and resource names are in these modules.
PATHS_FROM = {
    "adapter/kube/watching.py": (
        "adapter/kube/endpointslices.py",
        "adapter/kube/scale.py",
        "adapter/proxy/activator.py",
        "adapter/config/route_object.py",  # ZeroscaleRoutes' group and plural, listed by adapter/proxy/route_objects.py
    ),
    "adapter/proxy/activator.py": ("adapter/kube/endpointslices.py",),
}
# A generic module calls on behalf of the modules that give it paths: a process makes its calls only when it
# imports one of those (the adapter imports watching.py for a helper and lists nothing through it).
CALLERS = {
    "adapter/kube/watching.py": {"adapter.proxy.readiness", "adapter.proxy.activator", "adapter.proxy.route_objects"}
}
# Made only when `delegate:` is configured: granted by deploy/overlays/beside-keda alone.
DELEGATE_SITES = {("adapter/api/delegate.py", "GET")}
# Made only for routes in mode activator: its own module's and the Lease's, and the list-then-watch of the target
# workload and of the Service clients call (through watching.py, which the in-path readiness uses too, for slices).
ACTIVATOR_SITES = {site for site in CALLS if site[0] in ("adapter/proxy/activator.py", "adapter/kube/leases.py")}
# ZeroscaleRoute objects, served by default (the chart's routeObjects, deploy/base's proxy.route_objects): the proxy
# lists and watches routes (adapter/proxy/route_objects.py, through watching.py: in CALLS) and writes their status.
# The status writer is being written: when it lands, its call site joins CALLS and STATUS_CALLS must be what it
# needs.
STATUS_CALLS: set[Call] = {(verb, "zeroscale.io", "zeroscaleroutes/status") for verb in ("patch", "update")}
READ_ROUTES: set[Call] = {(verb, "zeroscale.io", "zeroscaleroutes") for verb in ("list", "watch")}
ROUTE_OBJECT_CALLS = READ_ROUTES | STATUS_CALLS
# Route objects elect their status writer on mode activator's Lease, so the default installation grants its calls.
LEASE_CALLS = {call for (module, _), calls in CALLS.items() if module == "adapter/kube/leases.py" for call in calls}
WORKLOADS = ("deployments", "statefulsets", "replicasets")
WATCHED = [("apps", plural) for plural in WORKLOADS] + [("", "services")]
ACTIVATOR_WATCHED_CALLS = {(verb, group, plural) for verb in ("list", "watch") for group, plural in WATCHED}
# Verbs that change an object: none on EndpointSlices unless an activator route needs it.
WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}
# deploy/examples/activator.zeroscale.yaml's route: Service `web` and Deployment `web` in `shop`, its Lease in the
# proxy's namespace; deploy/overlays/activator grants what it needs, the chart renders it from that config.
ACTIVATOR_EXAMPLE = DEPLOY / "examples" / "activator.zeroscale.yaml"

# Built-in roles the manifests bind, as the bootstrap policy defines them (they are not in deploy/).
BUILT_IN: dict[str, list[dict[str, Any]]] = {
    "system:auth-delegator": [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ],
    "extension-apiserver-authentication-reader": [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["extension-apiserver-authentication"],
            "verbs": ["get", "list", "watch"],
        }
    ],
}
# What a built-in role grants beyond our calls, and why that is accepted.
BUILT_IN_EXTRA = {("list", "", "configmaps")}  # the reader role also allows list; we only get and watch


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in ADAPTER_DIR.rglob("*.py") if "generated" not in path.parts}


def _imports(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):  # function-level (lazy) imports count too
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


def reachable(entry: str) -> set[str]:
    modules = _modules()
    graph = {name: _imports(ast.parse(path.read_text()), modules) for name, path in modules.items()}
    seen, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


def kube_call_sites() -> dict[tuple[str, str], str]:
    """(module path, METHOD or "watch") -> module name, for every Kubernetes API call in adapter/."""
    sites: dict[tuple[str, str], str] = {}
    for name, path in _modules().items():
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(USER_KUBECONFIG_ONLY) or relative == "adapter/kube/client.py":
            continue
        tree = ast.parse(path.read_text())
        if "adapter.kube.client" not in _imports(tree, _modules()):
            continue  # not a Kubernetes API caller (other `.request`/`.watch` methods exist)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "request" and node.args and isinstance(node.args[0], ast.Constant):
                sites[(relative, str(node.args[0].value))] = name
            elif node.func.attr == "watch":
                sites[(relative, "watch")] = name
    return sites


def _strings(path: Path) -> str:
    """Every string literal of a module (f-string pieces included), to find API paths in."""
    return "\n".join(
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def needed_by(service_account: str, delegate: bool = False, activator: bool = False) -> set[Call]:
    modules = reachable(ENTRY_POINTS[service_account])
    sites = {
        site: module
        for site, module in kube_call_sites().items()
        if (delegate or site not in DELEGATE_SITES) and (activator or site not in ACTIVATOR_SITES)
    }
    calls = {
        call
        for site, module in sites.items()
        if module in modules and modules & CALLERS.get(site[0], {module})
        for call in CALLS[site]
    }
    return calls if activator else calls - ACTIVATOR_WATCHED_CALLS


Grant = tuple[Call, str | None, tuple[str, ...]]  # the call, the namespace (None: every one), resourceNames (): any


def grants(objects: Objects, service_account: str) -> set[Grant]:
    """What the ServiceAccount may call, where, and on which names, by every binding of it."""
    roles = {
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): obj.get("rules", [])
        for obj in objects
        if "rules" in obj
    }
    found: set[Grant] = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": service_account, "namespace": "zeroscale"}
        if subject not in binding["subjects"]:
            continue
        ref, where = binding["roleRef"], binding["metadata"].get("namespace")
        role_namespace = where if ref["kind"] == "Role" else None
        rules = BUILT_IN.get(ref["name"]) or roles[(ref["kind"], role_namespace, ref["name"])]
        for rule in rules:
            found |= {
                ((verb, group, resource), where, tuple(rule.get("resourceNames", ())))
                for verb in rule["verbs"]
                for group in rule["apiGroups"]
                for resource in rule["resources"]
            }
    return found


def granted(objects: Objects, service_account: str) -> set[Call]:
    return {call for call, _, _ in grants(objects, service_account)}


def endpointslice_writes(objects: Objects) -> list[tuple[str, str | None, str]]:
    """(kind, namespace, name) of every Role or ClusterRole that lets anyone change an EndpointSlice."""
    return [
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        for obj in objects
        if obj["kind"] in ("Role", "ClusterRole")
        for rule in obj.get("rules") or []
        if {"discovery.k8s.io", "*"} & set(rule["apiGroups"])
        and {"endpointslices", "*"} & set(rule["resources"])
        and WRITES & set(rule["verbs"])
    ]


def activator_route(name: str, namespace: str, port: int, kind: str = "Deployment") -> dict[str, Any]:
    """Route `name` in mode activator: clients call Service `name`, Service `<name>-pods` selects the pods."""
    return {
        "name": name,
        "mode": "activator",
        "upstream": {"service": f"{name}-pods", "namespace": namespace, "port": "http"},
        "activator": {"service": name, "port": port},
        "target": {"namespace": namespace, "kind": kind, "name": name},
    }


def chart_with_routes(helm: Path, tmp_path: Path, proxy: dict[str, Any]) -> Objects:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": {"proxy": proxy}}), encoding="utf-8")
    return helm_render(helm, "--values", str(values))


@pytest.fixture(params=["kustomize", "helm"])
def installation(request: pytest.FixtureRequest) -> Objects:
    """The RBAC as each packaging renders it: deploy/overlays/cert-manager, and the chart's defaults."""
    if request.param == "kustomize":
        objects: Objects = request.getfixturevalue("rendered")["cert-manager"]
        return objects
    chart: Objects = request.getfixturevalue("chart_default")
    return chart


def test_every_call_site_is_listed() -> None:
    sites = kube_call_sites()
    assert set(sites) == set(CALLS), "a Kubernetes API call was added or removed: update CALLS and the RBAC"
    assert set().union(*CALLERS.values()) <= set(_modules()), "CALLERS names a module that does not exist"


def test_each_listed_call_matches_its_module() -> None:
    """The module names the group's API path and the resource, so a CALLS entry cannot drift from the code."""
    for (module, _method), calls in CALLS.items():
        text = "\n".join(_strings(ROOT / path) for path in (module, *PATHS_FROM.get(module, ())))
        for _verb, group, resource in calls:
            assert ("/api/v1" if group == "" else f"/apis/{group}") in text or f"{group}/" in text, (module, group)
            assert resource.split("/")[0] in text or resource.split("/")[0][:-1] in text, (module, resource)


def test_the_adapter_is_granted_exactly_its_calls(installation: Objects) -> None:
    needed = needed_by("zeroscale-adapter")
    assert needed == {
        ("create", "authentication.k8s.io", "tokenreviews"),
        ("create", "authorization.k8s.io", "subjectaccessreviews"),
        ("get", "", "configmaps"),
        ("watch", "", "configmaps"),
    }
    assert granted(installation, "zeroscale-adapter") == needed | BUILT_IN_EXTRA


def test_beside_keda_also_grants_exactly_the_delegate_call(rendered: dict[str, Objects]) -> None:
    needed = needed_by("zeroscale-adapter", delegate=True)
    assert needed - needed_by("zeroscale-adapter") == {("list", "external.metrics.k8s.io", "*")}
    assert granted(rendered["beside-keda"], "zeroscale-adapter") == needed | BUILT_IN_EXTRA


def test_the_chart_with_a_delegate_grants_exactly_the_delegate_call(helm: Path) -> None:
    delegate = "config.delegate.service.namespace=keda,config.delegate.service.name=keda-operator-metrics-apiserver"
    chart = helm_render(helm, "--set", delegate)
    assert granted(chart, "zeroscale-adapter") == needed_by("zeroscale-adapter", delegate=True) | BUILT_IN_EXTRA


@pytest.fixture(params=["kustomize", "helm"])
def activator_installation(request: pytest.FixtureRequest, tmp_path: Path) -> Objects:
    """With deploy/examples/activator.zeroscale.yaml's route: overlays/cert-manager plus overlays/activator, and
    the chart given that config."""
    if request.param == "kustomize":
        rendered: dict[str, Objects] = request.getfixturevalue("rendered")
        return rendered["cert-manager"] + rendered["activator"]
    proxy = yaml.safe_load(ACTIVATOR_EXAMPLE.read_text())["proxy"]
    return chart_with_routes(request.getfixturevalue("helm"), tmp_path, proxy)


def default_route_object_grants() -> set[Grant]:
    """Route objects: read cluster-wide, their status written; the Lease electing the writer, in `zeroscale`."""
    grants_: set[Grant] = {(call, None, ()) for call in ROUTE_OBJECT_CALLS}
    return grants_ | {(call, "zeroscale", lease_names(call)) for call in LEASE_CALLS}


def test_the_proxy_is_granted_exactly_its_calls(installation: Objects) -> None:
    """Without an activator route: wake and follow slices, cluster-wide; read route objects and write their status,
    electing the writer on the Lease; nothing of mode activator's slices."""
    needed = needed_by("zeroscale-proxy")
    assert ("patch", "apps", "deployments/scale") in needed
    assert ("create", "discovery.k8s.io", "endpointslices") not in needed
    assert needed >= READ_ROUTES
    expected = {(call, None, ()) for call in needed} | default_route_object_grants()
    assert grants(installation, "zeroscale-proxy") == expected


def test_the_default_installation_grants_no_endpointslice_write(
    base: Objects, rendered: dict[str, Objects], chart_default: Objects
) -> None:
    """Finding 4 of issue 28: a compromised proxy must not be able to redirect Services it routes nothing for.
    deploy/base, every installation overlay and the chart's defaults let no one write an EndpointSlice."""
    installations = {"base": base, "chart": chart_default}
    installations |= {name: objects for name, objects in rendered.items() if name != "activator"}
    assert {name: endpointslice_writes(objects) for name, objects in installations.items()} == {
        name: [] for name in installations
    }


def test_an_activator_route_is_granted_its_calls_in_its_namespaces_only(activator_installation: Objects) -> None:
    """Its Service's slices, the Service and the target by name, in the route's namespace; the Lease in the proxy's;
    the rest cluster-wide as without it. Nothing of mode activator cluster-wide."""
    in_path = needed_by("zeroscale-proxy")
    activator = needed_by("zeroscale-proxy", activator=True) - in_path
    expected: set[Grant] = {(call, None, ()) for call in in_path | ROUTE_OBJECT_CALLS}
    expected |= {(call, "shop", ()) for call in activator if call[2] == "endpointslices"}
    expected |= {(call, "shop", ("web",)) for call in activator if call[2] in ("services", "deployments")}
    # create cannot be limited by name; get and update only this installation's Lease
    expected |= {(call, "zeroscale", lease_names(call)) for call in activator if call[2] == "leases"}
    # Every call the activator's code makes is granted, but the other kinds' watches (the route's target is a
    # Deployment).
    other_kinds = {(verb, "apps", plural) for verb in ("list", "watch") for plural in ("statefulsets", "replicasets")}
    assert activator - {call for call, _, _ in expected} == other_kinds
    assert ("create", "discovery.k8s.io", "endpointslices") in activator
    assert grants(activator_installation, "zeroscale-proxy") == expected
    assert endpointslice_writes(activator_installation) == [("Role", "shop", "zeroscale-proxy-activator")]


def test_the_chart_grants_each_activator_namespace_its_own_routes(helm: Path, tmp_path: Path) -> None:
    """Routes in two namespaces (two in one, a StatefulSet among them) and one in the path: a Role in each of the
    two, naming only its own Services and targets; none where only an in-path route goes; the Lease's where
    lease_namespace says."""
    plain = {"name": "plain", "upstream": {"service": "plain", "namespace": "other", "port": "http"}}
    plain["target"] = {"namespace": "other", "kind": "Deployment", "name": "plain"}
    proxy = {
        "activator": {
            "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
            "lease_namespace": "ha",
        },
        "routes": [
            activator_route("web", "shop", 8081),
            activator_route("api", "shop", 8082, "StatefulSet"),
            activator_route("cart", "cart", 8083),
            plain,
        ],
    }
    objects = chart_with_routes(helm, tmp_path, proxy)
    namespaced = {
        (call, where, names) for call, where, names in grants(objects, "zeroscale-proxy") if where is not None
    }
    writes = {
        ((verb, "discovery.k8s.io", "endpointslices"), ns, ())
        for verb in ("create", "update", "delete")
        for ns in ("shop", "cart")
    }
    assert namespaced == writes | {
        *{((verb, "", "services"), "shop", ("api", "web")) for verb in ("get", "list", "watch")},
        *{((verb, "", "services"), "cart", ("cart",)) for verb in ("get", "list", "watch")},
        *{((verb, "apps", "deployments"), "shop", ("web",)) for verb in ("list", "watch")},
        *{((verb, "apps", "statefulsets"), "shop", ("api",)) for verb in ("list", "watch")},
        *{((verb, "apps", "deployments"), "cart", ("cart",)) for verb in ("list", "watch")},
        (("create", "coordination.k8s.io", "leases"), "ha", ()),
        # proxy_service zeroscale/zeroscale-proxy, its Lease in another namespace (adapter/config/proxy.py lease())
        *{((verb, "coordination.k8s.io", "leases"), "ha", ("zeroscale.zeroscale-proxy-activator",)) for verb in GU},
    }
    assert sorted(endpointslice_writes(objects)) == [
        ("Role", "cart", "zeroscale-proxy-activator"),
        ("Role", "shop", "zeroscale-proxy-activator"),
    ]


GU = ("get", "update")


def lease_names(call: Call) -> tuple[str, ...]:
    """The Lease of deploy/examples/activator.zeroscale.yaml's installation, for the verbs a name can limit."""
    return ("zeroscale-proxy-activator",) if call[0] in GU else ()


@pytest.mark.parametrize(
    ("activator", "lease"),
    [
        ({}, "zeroscale-proxy-activator"),
        ({"lease_namespace": "ha"}, "zeroscale.zeroscale-proxy-activator"),
        ({"lease_name": "web-writer"}, "web-writer"),
    ],
)
def test_the_chart_lets_the_proxy_read_and_update_its_own_lease_only(
    helm: Path, tmp_path: Path, activator: dict[str, str], lease: str
) -> None:
    """Mode activator's Lease is in lease_namespace, which other programs' Leases may share (a controller's leader
    election): update on any would let a compromised proxy take theirs. The name the chart grants is the one the
    proxy elects on (ActivatorConfig.lease())."""
    settings = {
        "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
        "lease_namespace": "zeroscale",
        **activator,
    }
    proxy = {"activator": settings, "routes": [activator_route("web", "shop", 8081)]}
    assert ActivatorConfig.model_validate(settings).lease() == lease
    leases = {
        (call[0], names)
        for call, _, names in grants(chart_with_routes(helm, tmp_path, proxy), "zeroscale-proxy")
        if call[2] == "leases"
    }
    assert leases == {("create", ()), ("get", (lease,)), ("update", (lease,))}


def test_the_proxy_takes_leases_in_its_own_namespace_only(activator_installation: Objects) -> None:
    """Mode activator's Lease: granted by a Role in the Lease's namespace, never cluster-wide (and without an
    activator route not at all: test_the_proxy_is_granted_exactly_its_calls)."""
    lease_rules = {
        (obj["kind"], obj["metadata"].get("namespace"))
        for obj in activator_installation
        if obj["kind"] in ("Role", "ClusterRole")
        for rule in obj["rules"]
        if "coordination.k8s.io" in rule["apiGroups"]
    }
    assert lease_rules == {("Role", "zeroscale")}


def test_the_hpa_controller_may_get_and_list_external_metrics(installation: Objects) -> None:
    objects = installation
    (binding,) = [
        obj
        for obj in objects
        if obj["kind"] == "ClusterRoleBinding"
        and {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
        in obj["subjects"]
    ]
    (role,) = [
        obj for obj in objects if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    assert role["rules"] == [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}]


def test_nothing_else_is_bound(rendered: dict[str, Objects], chart_default: Objects) -> None:
    """Every binding in every overlay and in the chart is one of the five above: no other subject gets anything."""
    names = {
        obj["metadata"]["name"]
        for objects in [*rendered.values(), chart_default]
        for obj in objects
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    assert names == {
        "zeroscale-adapter:system:auth-delegator",
        "zeroscale-adapter-auth-reader",
        "zeroscale-delegate-external-metrics",
        "zeroscale-hpa-external-metrics",
        "zeroscale-proxy",
        "zeroscale-proxy-activator",
        "zeroscale-proxy-leases",
        "zeroscale-proxy-routes",
    }


TENANT_WRITES = ("create", "update", "patch", "delete", "get", "list", "watch")


def zeroscale_io_rules(obj: dict[str, Any]) -> set[Call]:
    return {
        (verb, group, resource)
        for rule in obj.get("rules") or []
        for group in rule["apiGroups"]
        if group in ("zeroscale.io", "*")
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_tenants_with_edit_or_admin_write_routes_and_view_reads_them(installation: Objects) -> None:
    """Aggregated into the built-in roles: edit and admin write ZeroscaleRoutes in the namespaces they are bound in,
    view reads them. No tenant's role touches their status: only the proxy's ClusterRole may write it."""
    aggregated: dict[str, set[Call]] = {}
    for obj in installation:
        labels = obj["metadata"].get("labels") or {}
        for role in ("edit", "admin", "view"):
            if labels.get(f"rbac.authorization.k8s.io/aggregate-to-{role}") == "true":
                aggregated.setdefault(role, set()).update(zeroscale_io_rules(obj))
    assert aggregated["edit"] == aggregated["admin"] == {(v, "zeroscale.io", "zeroscaleroutes") for v in TENANT_WRITES}
    assert aggregated["view"] == {(verb, "zeroscale.io", "zeroscaleroutes") for verb in ("get", "list", "watch")}
    status = [
        (obj["kind"], obj["metadata"]["name"])
        for obj in installation
        if any(resource.startswith("zeroscaleroutes/") or "*" in resource for _, _, resource in zeroscale_io_rules(obj))
    ]
    assert status == [("ClusterRole", "zeroscale-proxy-routes")]


def test_the_chart_lets_the_proxy_read_routes_in_the_served_namespaces_only(helm: Path, tmp_path: Path) -> None:
    """config.proxy.route_objects.namespaces: the routes' ClusterRole is bound in those namespaces, not cluster-wide."""
    objects = chart_with_routes(helm, tmp_path, {"route_objects": {"namespaces": ["shop", "cart"]}})
    routes = {(call, where) for call, where, _ in grants(objects, "zeroscale-proxy") if call[1] == "zeroscale.io"}
    assert routes == {(call, namespace) for call in ROUTE_OBJECT_CALLS for namespace in ("shop", "cart")}


def test_the_chart_grants_route_objects_in_mode_activator_in_the_served_namespaces_only(
    helm: Path, tmp_path: Path
) -> None:
    """With config.proxy.route_objects.activator_ports a team's route may be in mode activator, naming a Service and a
    workload of its choice: mode activator's calls are granted on any name, in each namespace served and nowhere
    else (never cluster-wide), and the proxy's NetworkPolicy admits the ports."""
    ports = {"first": 9100, "last": 9199}
    objects = chart_with_routes(
        helm, tmp_path, {"route_objects": {"namespaces": ["shop", "cart"], "activator_ports": ports}}
    )
    activator = needed_by("zeroscale-proxy", activator=True) - needed_by("zeroscale-proxy")
    served = {
        (call, where, names) for call, where, names in grants(objects, "zeroscale-proxy") if where in ("shop", "cart")
    }
    assert served == {
        (call, namespace, ())
        for namespace in ("shop", "cart")
        for call in (activator | ROUTE_OBJECT_CALLS)
        if call[2] != "leases"
    }
    assert sorted(endpointslice_writes(objects)) == [
        ("Role", "cart", "zeroscale-proxy-activator"),
        ("Role", "shop", "zeroscale-proxy-activator"),
    ]
    (policy,) = [
        obj for obj in objects if obj["kind"] == "NetworkPolicy" and obj["metadata"]["name"] == "zeroscale-proxy"
    ]
    assert {"port": 9100, "endPort": 9199, "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]


def test_the_chart_refuses_route_objects_in_mode_activator_in_every_namespace(helm: Path) -> None:
    """activator_ports without route_objects.namespaces would need EndpointSlice writes cluster-wide: refused, saying
    what to list."""
    ports = "config.proxy.route_objects.activator_ports.first=9100,config.proxy.route_objects.activator_ports.last=9199"
    done = helm_template(helm, "--set", ports)
    assert done.returncode != 0
    assert "grants it only in the namespaces listed in config.proxy.route_objects.namespaces" in done.stderr


def test_the_chart_without_route_objects_grants_nothing_of_them(helm: Path) -> None:
    """routeObjects.enabled=false: the file's routes only; neither the proxy nor a tenant gets anything of routes,
    and no Lease is granted without an activator route."""
    objects = helm_render(helm, "--set", "routeObjects.enabled=false")
    expected = {(call, None, ()) for call in needed_by("zeroscale-proxy") - READ_ROUTES}
    assert grants(objects, "zeroscale-proxy") == expected
    assert [obj["metadata"]["name"] for obj in objects if zeroscale_io_rules(obj)] == []


Request = tuple[str, str, str, str | None, str]  # verb, group, resource, namespace (None: cluster), name ("": none)
DEPLOYMENTS, SERVICES = "/apis/apps/v1/namespaces/shop/deployments", "/api/v1/namespaces/shop/services"
# Route `web` in `shop`, its Lease in `zeroscale`, run in-process against the API stand-in.
SETTINGS = {
    "proxy_service": {"service": "zeroscale-proxy", "namespace": "zeroscale"},
    "lease_namespace": "zeroscale",
    "identity": "proxy-a",
    "lease_duration": 1.5,
    "renew_deadline": 1.0,
    "retry_period": 0.1,
}
POD, PROXY = "10.1.0.5", "10.1.0.7"


def authorizer_attributes(method: str, path: str, query: dict[str, list[str]]) -> Request:
    """What the API server's authorizer is asked for a request (apiserver's endpoints/request/requestinfo.go): a
    list or watch with `fieldSelector=metadata.name=X` is one on the name X, which `resourceNames` can match."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name = "/".join(rest[::2]), rest[1] if len(rest) > 1 else ""
    if method == "GET" and not name:
        verb = "list" if query.get("watch", ["false"])[0] in ("false", "0") else "watch"
        selector = query.get("fieldSelector", [""])[0]
        if selector.startswith("metadata.name=") and "," not in selector:
            name = selector.removeprefix("metadata.name=")
    else:
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return verb, group, resource, namespace, name


def allowed(granted: set[Grant], request: Request) -> bool:
    verb, group, resource, namespace, name = request
    return any(
        call == (verb, group, resource) and where in (None, namespace) and (not names or name in names)
        for call, where, names in granted
    )


def requests_made(kube: KubeStandIn) -> set[Request]:
    made = set()
    for method, target, _ in kube.requests:
        url = urlsplit(target)
        made.add(authorizer_attributes(method, url.path, parse_qs(url.query)))
    return made


def standin_with_route_web(kube: KubeStandIn) -> None:
    """The API of route `web`: its Deployment at 1, its selector-less Service, its pod's and the proxy's slices."""
    kube.serve_collection(SLICES_V1, "EndpointSliceList", writable=True)
    kube.serve_collection(r"/apis/apps/v1/namespaces/[^/]+/deployments", "DeploymentList")
    kube.serve_collection(r"/api/v1/namespaces/[^/]+/services", "ServiceList")
    kube.serve_collection(r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases", "LeaseList", writable=True)
    kube.put(DEPLOYMENTS, web_deployment(1))
    service = {"metadata": {"name": "web", "namespace": "shop", "uid": "0b5e1c2a"}, "spec": {"ports": []}}
    kube.put(SERVICES, {"apiVersion": "v1", "kind": "Service", **service})
    for namespace, name, service_name, address in (
        ("shop", "web-pods-abcde", "web-pods", POD),
        ("zeroscale", "zeroscale-proxy-xyz", "zeroscale-proxy", PROXY),
    ):
        body = endpoint_slice(name, service_name, [(address, {"ready": True})], 8000)
        kube.put(slices_collection(namespace), {**body, "metadata": {**body["metadata"], "namespace": namespace}})


def web_deployment(replicas: int) -> dict[str, Any]:
    metadata = {"name": "web", "namespace": "shop"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": {"replicas": replicas}}


def listed(kube: KubeStandIn) -> set[str]:
    """The addresses route `web`'s written slices list."""
    return {
        address
        for obj in kube.objects(slices_collection("shop"))
        if obj["metadata"]["labels"].get("kubernetes.io/service-name") == "web"
        for endpoint in obj.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def enforce(kube: KubeStandIn, granted: set[Grant]) -> None:
    """The stand-in refuses (403) what `granted` does not allow, as the API server's RBAC authorizer would."""

    def authorize(request: StandInRequest, _match: re.Match[str]) -> Reply | None:
        asked = authorizer_attributes(request.method, request.path, request.query)
        if allowed(granted, asked):
            return None  # on to the stand-in's own handlers
        verb, group, resource, namespace, _ = asked
        message = f"cannot {verb} resource {resource!r} in API group {group!r} in the namespace {namespace!r}"
        return Reply(
            403, status_body(403, "Forbidden", f"User system:serviceaccount:zeroscale:zeroscale-proxy {message}")
        )

    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        kube.add_route(method, r"/.*", authorize)


@contextlib.asynccontextmanager
async def proxy_under_rbac(route: dict[str, Any], granted: set[Grant]) -> AsyncIterator[KubeStandIn]:
    """A proxy with `route` running against the stand-in serving route `web`, which allows only `granted`; the stand-in
    keeps what it was asked and holds once both have stopped."""
    with KubeStandIn(tls=False, token="proxy-token") as kube:
        standin_with_route_web(kube)
        enforce(kube, granted)
        client = KubeClient.from_config(kube.client_config())
        try:
            async with running_proxy([route], kube=client, activator=SETTINGS):
                yield kube
        finally:
            await client.close()


async def test_an_activator_route_works_with_exactly_the_grants_rendered_for_it(
    activator_installation: Objects, chart_default: Objects
) -> None:
    """A proxy with deploy/examples' activator route (`web` in `shop`), run against an API stand-in that enforces the
    RBAC rendered for it (the chart from that config, or deploy/overlays/activator) as the API server's authorizer
    would (verb, namespace, and the name a Role's resourceNames must list): it goes from warm to cold and every
    request it made was allowed; the default installation would have refused each of its writes."""
    proxy = yaml.safe_load(ACTIVATOR_EXAMPLE.read_text())["proxy"]
    (route,) = proxy["routes"]
    route = {**route, "activator": {**route["activator"], "port": port_outside_ephemeral()}, "wake": "none"}
    granted = grants(activator_installation, "zeroscale-proxy")
    async with proxy_under_rbac(route, granted) as kube:
        with contextlib.suppress(TimeoutError):  # a refused request is named below
            await until(lambda: listed(kube) == {POD})  # warm: the pod
            kube.put(DEPLOYMENTS, web_deployment(0))
            await until(lambda: listed(kube) == {PROXY})  # cold: the proxy
    made = requests_made(kube)  # the proxy stopped: its last requests too
    assert [request for request in sorted(made, key=str) if not allowed(granted, request)] == []
    assert listed(kube) == {PROXY}

    assert ("create", "discovery.k8s.io", "endpointslices", "shop", "") in made
    assert ("watch", "apps", "deployments", "shop", "web") in made
    default = grants(chart_default, "zeroscale-proxy")
    # The Lease is the default installation's too (route objects elect their status writer on it); nothing else.
    writes = [request for request in made if request[0] in WRITES and allowed(default, request)]
    assert {request[2] for request in writes} <= {"leases"}


@pytest.mark.parametrize(
    ("also_granted", "refused"),
    [
        ((), "cannot watch Deployment web"),
        # The Lease and the target, not the Service (a Role edited for another one) nor its slices.
        (("leases", "deployments"), "cannot write the slices of Service shop/web"),
    ],
    ids=["nothing", "not-the-service"],
)
async def test_an_activator_route_without_its_role_writes_nothing_and_the_log_says_which_role_where(
    chart_default: Objects, also_granted: tuple[str, ...], refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    """deploy/base and the default chart grant nothing of mode activator: a route added without its Role is refused
    by the API, and the proxy's log names the namespace, the Role to add and where it comes from."""
    route = {**activator_route("web", "shop", port_outside_ephemeral()), "wake": "none", "readiness": "endpointslice"}
    granted = grants(chart_default, "zeroscale-proxy")
    granted |= {
        ((verb, "coordination.k8s.io", "leases"), "zeroscale", ())
        for verb in ("get", "create", "update")
        if "leases" in also_granted
    }
    granted |= {
        ((verb, "apps", "deployments"), "shop", ("web",)) for verb in ("list", "watch") if "deployments" in also_granted
    }
    hint = "needs mode activator's Role in namespace shop"
    async with proxy_under_rbac(route, granted) as kube:
        await until(lambda: any(refused in r.getMessage() and hint in r.getMessage() for r in caplog.records))
    assert listed(kube) == set()
    (message,) = {r.getMessage() for r in caplog.records if refused in r.getMessage()}
    assert "403" in message
    assert "deploy/overlays/activator" in message
    assert "Service web and Deployment web" in message
