"""RBAC least privilege: the grants in deploy/ are exactly the Kubernetes API calls the code makes.

Every `.request(METHOD, ...)` and `.watch(...)` call in adapter/ (found by walking the AST) must be listed in
CALLS with the (verb, group, resource) it needs; the module must hold that group's path and the resource's
name; and which ServiceAccount makes it follows from which process imports the module (`serve` from
adapter/serve.py, `proxy` from adapter/proxy_main.py). Then the rendered RBAC must grant each
ServiceAccount those calls and nothing more: deploy/'s kustomize render and the Helm chart's alike.

Not counted: `zeroscale explain` (adapter/hpa/) and `zeroscale doctor` (adapter/doctor/) run on a workstation
with the user's own kubeconfig, never under a deployed ServiceAccount, so no manifest grants their calls.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.manifests import ROOT, Objects, helm_render

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
    # Every list-then-watch loop (ListWatch) and the collections it lists by path (collection_lister): the HPAs
    # of wake: scale, an activator route's target workload; its watches are of those and of EndpointSlices.
    # The activator's own outputs too: its Service and the slices it wrote, watched to repair them at once.
    ("adapter/kube/watching.py", "GET"): {
        ("list", "", "services"),
        ("list", "discovery.k8s.io", "endpointslices"),
        ("list", "autoscaling", "horizontalpodautoscalers"),
        ("list", "apps", "deployments"),
        ("list", "apps", "statefulsets"),
        ("list", "apps", "replicasets"),
    },
    ("adapter/kube/watching.py", "watch"): {
        ("watch", "", "services"),
        ("watch", "discovery.k8s.io", "endpointslices"),
        ("watch", "autoscaling", "horizontalpodautoscalers"),
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
        "adapter/kube/hpas.py",
        "adapter/kube/scale.py",
        "adapter/proxy/activator.py",
    ),
    "adapter/proxy/activator.py": ("adapter/kube/endpointslices.py",),
}
# A generic module calls on behalf of the modules that give it paths: a process makes its calls only when it
# imports one of those (the adapter imports watching.py for a helper and lists nothing through it).
CALLERS = {"adapter/kube/watching.py": {"adapter.proxy.readiness", "adapter.proxy.intent", "adapter.proxy.activator"}}
# Made only when `delegate:` is configured: granted by deploy/overlays/beside-keda alone.
DELEGATE_SITES = {("adapter/api/delegate.py", "GET")}

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


def needed_by(service_account: str, delegate: bool = False) -> set[Call]:
    modules = reachable(ENTRY_POINTS[service_account])
    sites = {site: module for site, module in kube_call_sites().items() if delegate or site not in DELEGATE_SITES}
    return {
        call
        for site, module in sites.items()
        if module in modules and modules & CALLERS.get(site[0], {module})
        for call in CALLS[site]
    }


def granted(objects: Objects, service_account: str) -> set[Call]:
    roles = {(obj["kind"], obj["metadata"]["name"]): obj.get("rules", []) for obj in objects if "rules" in obj}
    calls: set[Call] = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": service_account, "namespace": "zeroscale"}
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        rules = BUILT_IN.get(ref["name"]) or roles[(ref["kind"], ref["name"])]
        for rule in rules:
            calls |= {
                (verb, group, resource)
                for verb in rule["verbs"]
                for group in rule["apiGroups"]
                for resource in rule["resources"]
            }
    return calls


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


def test_the_proxy_is_granted_exactly_its_calls(installation: Objects) -> None:
    needed = needed_by("zeroscale-proxy")
    assert ("patch", "apps", "deployments/scale") in needed
    assert ("create", "discovery.k8s.io", "endpointslices") in needed  # mode activator
    assert granted(installation, "zeroscale-proxy") == needed


def test_the_proxy_takes_leases_in_its_own_namespace_only(installation: Objects) -> None:
    """Mode activator's Lease: granted by a Role in the proxy's namespace, never cluster-wide."""
    lease_rules = [
        (obj["kind"], obj["metadata"].get("namespace"))
        for obj in installation
        if obj["kind"] in ("Role", "ClusterRole")
        for rule in obj["rules"]
        if "coordination.k8s.io" in rule["apiGroups"]
    ]
    assert lease_rules == [("Role", "zeroscale")]


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
        "zeroscale-proxy-leases",
    }
