"""`zeroscale doctor` on ZeroscaleRoutes, against the Kubernetes API stand-in: the CRD installed or not (as the proxy's
config needs it), and each route's status (not Accepted, not Ready, or left behind its spec: no proxy reads routes)."""

from __future__ import annotations

import datetime
import re
from typing import Any

import yaml

from adapter.doctor.findings import Finding
from adapter.doctor.routes import CHECK, CHECK_CRD, MAX_NAMED, ROUTES_PATH
from tests.doctor.fixtures import CONFIGMAPS, DEPLOYMENTS, Cluster, _one, rendered_base, run_doctor
from tests.fixtures.kube_standin import Reply, StandInRequest


def with_proxy(cluster: Cluster, route_objects: bool = True) -> None:
    """The proxy's Deployment, its mounted config deploy/base's (route objects on) or with them turned off."""
    cluster.kube.put(DEPLOYMENTS, _one(rendered_base(), "Deployment", "zeroscale-proxy"))
    (config_map,) = cluster.kube.objects(CONFIGMAPS)

    def turn(obj: dict[str, Any]) -> None:
        config = yaml.safe_load(obj["data"]["config.yaml"])
        config["proxy"]["route_objects"] = {"enabled": route_objects}
        obj["data"]["config.yaml"] = yaml.safe_dump(config)

    cluster.update(CONFIGMAPS, config_map["metadata"]["name"], turn)


def with_crd(cluster: Cluster, *routes: dict[str, Any]) -> None:
    """The CRD installed: the API serves zeroscale.io/v1alpha1, and these routes across namespaces."""
    resources = [{"name": name, "namespaced": True, "kind": "ZeroscaleRoute"} for name in ("zeroscaleroutes",)]
    body = {"kind": "APIResourceList", "groupVersion": "zeroscale.io/v1alpha1", "resources": resources}

    def discovery(_request: StandInRequest, _match: re.Match[str]) -> Reply:
        return Reply(200, body)

    cluster.kube.add_route("GET", r"/apis/zeroscale\.io/v1alpha1", discovery)
    cluster.kube.serve_collection(re.escape(ROUTES_PATH), "ZeroscaleRouteList")
    for route in routes:
        cluster.kube.put(ROUTES_PATH, route)


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def route(
    name: str,
    *conditions: dict[str, str],
    generation: int = 1,
    observed: int = 1,
    changed: datetime.timedelta = datetime.timedelta(hours=1),
) -> dict[str, Any]:
    """Route shop/<name>, its spec last written `changed` ago (by kubectl; the status by the proxy, later)."""
    now = datetime.datetime.now(datetime.UTC)
    written = [
        {"manager": "kubectl", "operation": "Apply", "time": (now - changed).strftime("%Y-%m-%dT%H:%M:%SZ")},
        {
            "manager": "zeroscale",
            "operation": "Apply",
            "subresource": "status",
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    ]
    metadata = {"name": name, "namespace": "shop", "generation": generation, "managedFields": written}
    status = {"observedGeneration": observed, "conditions": list(conditions)}
    return {"apiVersion": "zeroscale.io/v1alpha1", "kind": "ZeroscaleRoute", "metadata": metadata, "status": status}


GOOD = (condition("Accepted", "True", "Accepted"), condition("Ready", "True", "Ready"))


def of(findings: list[Finding], check: str) -> list[tuple[str, str]]:
    return [(f.level, f.message) for f in findings if f.check == check]


async def test_a_proxy_serving_routes_without_the_crd_fails_and_says_how_to_install_it(cluster: Cluster) -> None:
    with_proxy(cluster)
    (finding,) = [f for f in await run_doctor(cluster) if f.check == CHECK_CRD]
    assert finding.level == "fail"
    assert "proxy serves ZeroscaleRoutes" in finding.message
    assert "zeroscaleroutes.zeroscale.io (v1alpha1): its CRD is not installed" in finding.message
    assert "kubectl apply --server-side -f deploy/helm/zeroscale/crds/" in finding.hint


async def test_without_route_objects_a_missing_crd_is_no_problem(cluster: Cluster) -> None:
    with_proxy(cluster, route_objects=False)
    findings = await run_doctor(cluster)
    assert [level for level, _ in of(findings, CHECK_CRD)] == ["skip"]
    assert of(findings, CHECK) == []


async def test_routes_accepted_and_ready_are_ok(cluster: Cluster) -> None:
    with_proxy(cluster)
    with_crd(cluster, route("web", *GOOD), route("api", *GOOD))
    findings = await run_doctor(cluster)
    assert of(findings, CHECK_CRD) == [("ok", "CRD zeroscaleroutes.zeroscale.io is installed (v1alpha1 served)")]
    assert of(findings, CHECK) == [("ok", "2 route(s) Accepted and Ready")]


async def test_a_route_not_accepted_or_not_ready_is_named_with_its_reason_and_message(cluster: Cluster) -> None:
    claimed = condition("Accepted", "False", "HostClaimed", "host web.example.com is claimed by route cart/web")
    missing = condition("Ready", "False", "ServiceNotFound", "Service shop/api-pods does not exist")
    unknown = condition("Ready", "Unknown", "Waiting", "no readiness answer yet")
    with_proxy(cluster)
    with_crd(
        cluster,
        route("web", claimed),
        route("api", GOOD[0], missing),
        route("new", GOOD[0], unknown),
        route("ok", *GOOD),
    )
    findings = await run_doctor(cluster)
    assert sorted(of(findings, CHECK)) == [
        ("fail", "route shop/api is not ready: ServiceNotFound: Service shop/api-pods does not exist"),
        ("fail", "route shop/web is not accepted: HostClaimed: host web.example.com is claimed by route cart/web"),
        ("ok", "1 route(s) Accepted and Ready"),
        ("warn", "route shop/new: Ready is not known yet (Waiting: no readiness answer yet)"),
    ]


async def test_a_status_left_behind_its_spec_means_no_proxy_reads_routes(cluster: Cluster) -> None:
    """observedGeneration below the generation: changed seconds ago, it is being read; minutes ago, nobody reads."""
    with_proxy(cluster)
    recent = datetime.timedelta(seconds=10)
    with_crd(
        cluster,
        route("old", *GOOD, generation=3, observed=2, changed=datetime.timedelta(minutes=10)),
        route("new", *GOOD, generation=2, observed=1, changed=recent),
        route("never", generation=1, observed=0, changed=datetime.timedelta(hours=2)),
    )
    found = dict((message.split(":")[0], (level, message)) for level, message in of(await run_doctor(cluster), CHECK))
    level, message = found["route shop/old"]
    assert level == "fail"
    assert re.fullmatch(
        r"route shop/old: its status describes generation 2 but its spec is at 3, changed 0:10:\d\d ago: "
        r"no proxy is reading routes",
        message,
    )
    assert found["route shop/never"][0] == "fail"
    assert found["route shop/new"][0] == "skip"
    assert "its status not yet written for it" in found["route shop/new"][1]


async def test_routes_the_proxy_does_not_serve_are_a_warning(cluster: Cluster) -> None:
    with_proxy(cluster, route_objects=False)
    with_crd(cluster, route("web", *GOOD))
    ((level, message),) = of(await run_doctor(cluster), CHECK)
    assert level == "warn"
    assert message.startswith("1 ZeroscaleRoute(s) exist but the proxy does not serve route objects")


async def test_many_broken_routes_are_named_up_to_a_bound_then_counted(cluster: Cluster) -> None:
    broken = condition("Accepted", "False", "NamespaceNotServed", "not served")
    with_proxy(cluster)
    with_crd(cluster, *(route(f"web-{index:02}", broken) for index in range(MAX_NAMED + 5)))
    found = of(await run_doctor(cluster), CHECK)
    assert len(found) == MAX_NAMED + 1
    assert found[-1] == ("fail", "and 5 more route(s)")
