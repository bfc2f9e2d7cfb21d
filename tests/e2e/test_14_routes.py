"""ZeroscaleRoute objects live on the real control plane: the chart installed with its CRD, a proxy "pod" of the
chart's, and teams that hold only the built-in `edit` role in their namespace writing their routes with kubectl.

The chart is installed as a user does (`helm install`, its crds/ and aggregated tenant roles included; no APIService,
which the session's adapter may own). The proxy runs as its pod would: the chart's ConfigMap (route objects on, the
Lease of the release), its Secret, a token of its ServiceAccount, so every call it makes is checked against the
chart's RBAC. Each team's app is a real HTTP server on this machine's address (the API refuses loopback in a slice);
what kubelet and the EndpointSlice controller would write (the pod's slice) the test writes. Every kubectl call on a
route is the tenant's (`--as=system:serviceaccount:<namespace>:tenant`).

Scenarios: a route created -> the first request routed by it (the figure of the closing note), then a request held
while its workload is at zero, the workload woken through it; the route edited while requests are held (a host
added routes at once, a lowered limit applies to new requests, the held ones finish on the version that admitted
them); deleted while requests are held (answered 503, saying so); two namespaces claiming one host (the oldest wins,
the other's status names it; the winner deleted, the host passes on); another namespace's Service refused at
admission; a route with a waking page and a never-wake health check (the page for a browser, which wakes the
workload; the health check answered by the proxy, waking nothing; a program's request held; all forwarded warm).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapter.children import port_outside_ephemeral
from tests.e2e import install
from tests.e2e.cluster import ENDPOINTSLICE_API, ControlPlane, Kube, KubeError, deployment, wait_for, wait_replicas
from tests.e2e.fixtures import Timeline, kube_api
from tests.e2e.install import endpoint_slice
from tests.e2e.processes import Zeroscale
from tests.e2e.test_04_proxy_wake import Upstream
from tests.fixtures.manifests import CHART, build_helm

RELEASE, RELEASE_NAMESPACE = "routes", "zeroscale-routes"
FULLNAME = f"{RELEASE}-zeroscale"
TEAM_A, TEAM_B = "e2e-team-a", "e2e-team-b"
ROUTES = "/apis/zeroscale.io/v1alpha1"
APP = "web"
Answer = tuple[int, str]


def tenant(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:tenant"


def routes_path(namespace: str, name: str = "") -> str:
    return f"{ROUTES}/namespaces/{namespace}/zeroscaleroutes" + (f"/{name}" if name else "")


def slice_path(namespace: str) -> str:
    return f"/apis/{ENDPOINTSLICE_API}/namespaces/{namespace}/endpointslices/{APP}-pod"


def route(namespace: str, name: str, hosts: list[str], **spec: Any) -> dict[str, Any]:
    """A team's route to its Service `web`, waking its Deployment `web` (the defaults otherwise)."""
    return {
        "apiVersion": "zeroscale.io/v1alpha1",
        "kind": "ZeroscaleRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hosts": hosts, "upstream": {"service": APP, "port": "http"}, "target": {"name": APP}, **spec},
    }


def as_tenant(
    kube: Kube, namespace: str, *args: str, obj: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as the namespace's tenant (strict field validation, kubectl's default, said explicitly)."""
    stdin = None if obj is None else json.dumps(obj)
    return kube.kubectl(f"--as={tenant(namespace)}", "-n", namespace, *args, stdin=stdin, check=False)


def apply_as_tenant(kube: Kube, obj: dict[str, Any]) -> float:
    """`kubectl apply` of the route by its namespace's tenant; the moment it returned (time.monotonic)."""
    done = as_tenant(kube, obj["metadata"]["namespace"], "apply", "--validate=strict", "-f", "-", obj=obj)
    assert done.returncode == 0, done.stderr
    return time.monotonic()


def get(port: int, host: str, path: str = "/", headers: dict[str, str] | None = None) -> Answer:
    connection = HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        connection.request("GET", path, headers={"Host": host, **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


def until_routed(port: int, host: str, since: float, within: float = 10.0) -> tuple[float, Answer]:
    """Seconds from `since` until a request for `host` was not answered 404 (no route), and that answer."""
    while True:
        answer = get(port, host, "/first")
        if answer[0] != 404:
            return time.monotonic() - since, answer
        if time.monotonic() - since > within:
            raise TimeoutError(f"{host}: still no route {within:g} s after kubectl apply: {answer}")
        time.sleep(0.005)


def conditions(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    status = kube.get(routes_path(namespace, name)).get("status") or {}
    return {condition["type"]: condition for condition in status.get("conditions") or []}


def wait_condition(
    kube: Kube, namespace: str, name: str, kind: str, status: str, within: float = 20.0
) -> dict[str, Any]:
    """The route's condition `kind` once it reads `status` (the Lease holder writes it, at once on a change)."""
    seen: list[dict[str, Any]] = [{}]

    def found() -> dict[str, Any] | None:
        seen[0] = conditions(kube, namespace, name)
        condition = seen[0].get(kind)
        return condition if condition is not None and condition["status"] == status else None

    try:
        return wait_for(found, within, f"{namespace}/{name}: {kind}={status}")
    except TimeoutError as err:
        raise AssertionError(f"{err}; its conditions: {seen[0]}") from None


def wait_cold(kube: Kube, namespace: str, name: str) -> None:
    """Until the route's status reads Cold: the proxy saw its endpoint go (a request now is held, not forwarded)."""
    wait_for(lambda: (kube.get(routes_path(namespace, name)).get("status") or {}).get("state") == "Cold", 20, "Cold")


@dataclass
class ProxyPod:
    process: Zeroscale
    port: int
    admin_port: int

    def held(self, key: str) -> float:
        """zeroscale_proxy_held_requests of route `key` (<namespace>/<name>), every version summed."""
        connection = HTTPConnection("127.0.0.1", self.admin_port, timeout=5)
        try:
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "zeroscale_proxy_held_requests" and sample.labels.get("route") == key:
                    return float(sample.value)
        return 0.0

    def wait_held(self, key: str, count: int) -> None:
        wait_for(lambda: self.held(key) == count, 10, f"{count} requests held for {key}")


@dataclass
class Team:
    namespace: str
    app: Upstream

    def warm(self, kube: Kube) -> None:
        """What kubelet and the EndpointSlice controller write once the app's pod is Ready."""
        address, port = str(self.app.server_address[0]), int(self.app.server_address[1])
        kube.apply([endpoint_slice(self.namespace, f"{APP}-pod", APP, "http", address, port)])

    def cold(self, kube: Kube) -> None:
        """The pod gone and the Deployment at zero (as its HPA leaves it)."""
        kube.delete(slice_path(self.namespace))
        kube.kubectl("scale", "-n", self.namespace, f"deployment/{APP}", "--replicas=0")

    def served(self) -> list[str]:
        with self.app.lock:
            return list(self.app.paths)


def helm_env(plane: ControlPlane, workdir: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig), "HELM_CACHE_HOME": str(workdir / "helm-cache")}


@pytest.fixture(scope="module")
def chart(plane: ControlPlane, kube: Kube, workdir: Path, timeline: Timeline) -> Iterator[None]:
    """`helm install` of the chart: the CRD from crds/, route objects on (the default), the tenant roles."""
    helm, env = str(build_helm()), helm_env(plane, workdir)
    started = time.monotonic()
    install = [helm, "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace"]
    # The external metrics API stays the session adapter's (test_10 shows the chart's own registration).
    done = subprocess.run(
        [*install, "--set", "apiService.enabled=false"], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr
    kube.kubectl("wait", "--for=condition=Established", "crd/zeroscaleroutes.zeroscale.io", "--timeout=30s")
    timeline.record(f"routes: helm install (CRD, RBAC, tenant roles) {time.monotonic() - started:.1f} s")
    yield
    uninstall = [helm, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE]
    subprocess.run(uninstall, capture_output=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def proxy(chart: None, plane: ControlPlane, kube: Kube, workdir: Path) -> Iterator[ProxyPod]:
    """The chart's proxy pod as kubelet would run it: its ConfigMap and Secret mounted, its ServiceAccount's token;
    its listeners on loopback (one machine for every pod)."""
    directory = workdir / "routes-proxy"
    config, token = install.chart_pod(
        kube, directory, RELEASE_NAMESPACE, f"{FULLNAME}-proxy-counts", f"{FULLNAME}-config", f"{FULLNAME}-proxy"
    )
    assert config["proxy"]["route_objects"]["enabled"] is True, "the chart turns route objects on"
    port, admin_port = port_outside_ephemeral(), port_outside_ephemeral()
    config["proxy"] |= {
        "bind": "127.0.0.1",
        "port": port,
        "admin_bind": "127.0.0.1",
        "admin_port": admin_port,
        "kubernetes": kube_api(plane, token),
    }
    config["proxy"]["activator"]["identity"] = "routes-proxy-0"
    config["grpc"] = {"counts": config["grpc"]["counts"] | {"bind": "127.0.0.1", "port": 0}}
    process = Zeroscale("proxy", directory, config, port).start()
    pod = ProxyPod(process, port, admin_port)
    # Ready once the route objects are listed (the chart's readinessProbe).
    wait_for(lambda: get(admin_port, "localhost", "/readyz")[0] == 200, 30, "the proxy ready (/readyz)")
    yield pod
    process.stop()


@pytest.fixture(scope="module")
def teams(chart: None, kube: Kube) -> Iterator[dict[str, Team]]:
    """Two namespaces, each with a ServiceAccount `tenant` bound to the built-in `edit` role there and nothing
    else, a Deployment `web` at zero, its Service and its app (a real server, not yet in any slice)."""
    made: dict[str, Team] = {}
    try:
        for namespace in (TEAM_A, TEAM_B):
            kube.namespace(namespace)
            service = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": APP, "namespace": namespace},
                "spec": {"selector": {"app": APP}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }
            kube.apply(
                [
                    {
                        "apiVersion": "v1",
                        "kind": "ServiceAccount",
                        "metadata": {"name": "tenant", "namespace": namespace},
                    },
                    {
                        "apiVersion": "rbac.authorization.k8s.io/v1",
                        "kind": "RoleBinding",
                        "metadata": {"name": "tenant-edit", "namespace": namespace},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
                    },
                    deployment(namespace, APP, replicas=0),
                    service,
                ]
            )
            app = Upstream()
            made[namespace] = Team(namespace, app)
            threading.Thread(target=app.serve_forever, daemon=True).start()

            def may_create(namespace: str = namespace) -> bool:
                asked = as_tenant(kube, namespace, "auth", "can-i", "create", "zeroscaleroutes.zeroscale.io")
                return asked.stdout.strip() == "yes"

            wait_for(may_create, 30, f"edit aggregating the chart's route rights in {namespace}")
        yield made
    finally:
        for team in made.values():
            for obj in kube.get(routes_path(team.namespace))["items"]:
                kube.delete(routes_path(team.namespace, obj["metadata"]["name"]))
            kube.delete(slice_path(team.namespace))
            team.app.shutdown()
            team.app.server_close()


def held_requests(pool: ThreadPoolExecutor, port: int, host: str, paths: list[str]) -> list[Future[Answer]]:
    return [pool.submit(get, port, host, path) for path in paths]


def results(answers: list[Future[Answer]]) -> list[Answer]:
    return [answer.result(timeout=60) for answer in answers]


def test_a_tenant_route_routes_at_once_then_holds_a_request_and_wakes_its_workload(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    team = teams[TEAM_A]
    host = f"web.{TEAM_A}.example"
    team.warm(kube)
    applied = apply_as_tenant(kube, route(TEAM_A, "web", [host]))
    routed_after, answer = until_routed(proxy.port, host, applied)
    assert answer == (200, "served /first"), answer
    timeline.record(
        f"routes: the tenant (edit only) kubectl-applied {TEAM_A}/web; first request routed by it "
        f"{routed_after * 1000:.0f} ms after kubectl apply returned"
    )
    accepted = wait_condition(kube, TEAM_A, "web", "Accepted", "True")
    ready = wait_condition(kube, TEAM_A, "web", "Ready", "True")
    assert accepted["observedGeneration"] == ready["observedGeneration"] == 1
    status_after = time.monotonic() - applied

    team.cold(kube)
    wait_cold(kube, TEAM_A, "web")
    with ThreadPoolExecutor(3) as pool:
        sent = time.monotonic()
        answers = held_requests(pool, proxy.port, host, [f"/order/{n}" for n in range(3)])
        woke = wait_replicas(kube, TEAM_A, APP, 1, timeout=20)  # the proxy patched the scale subresource
        proxy.wait_held(f"{TEAM_A}/web", 3)
        assert not any(answer.done() for answer in answers), "no endpoint yet: every request is held"
        team.warm(kube)  # the woken pod is Ready
        ready_at = time.monotonic() - sent
        done = results(answers)
    assert sorted(done) == [(200, f"served /order/{n}") for n in range(3)], done
    timeline.record(
        f"routes: {TEAM_A}/web Accepted and Ready in its status {status_after:.1f} s after kubectl apply; cold: 3 "
        f"requests held, {APP} woken 0->1 in {woke:.2f} s, pod ready at {ready_at:.1f} s, all 3 answered 200"
    )


def test_an_edit_while_requests_are_held_adds_a_host_at_once_and_limits_new_requests_only(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    team = teams[TEAM_A]
    host, added = f"web.{TEAM_A}.example", f"web2.{TEAM_A}.example"
    apply_as_tenant(kube, route(TEAM_A, "web", [host]))
    team.warm(kube)
    assert get(proxy.port, host) == (200, "served /")
    team.cold(kube)
    wait_cold(kube, TEAM_A, "web")
    key = f"{TEAM_A}/web"
    with ThreadPoolExecutor(4) as pool:
        old = held_requests(pool, proxy.port, host, ["/old/0", "/old/1"])
        proxy.wait_held(key, 2)
        assert get(proxy.port, added)[0] == 404
        # A host added and the queue's limit lowered below what the first version holds.
        applied = apply_as_tenant(kube, route(TEAM_A, "web", [host, added], limits={"max_held_requests": 1}))
        new = held_requests(pool, proxy.port, added, ["/new/0"])
        proxy.wait_held(key, 3)  # the new version holds it: the added host routes
        new_after = time.monotonic() - applied
        refused = get(proxy.port, host, "/refused")  # the new version's queue is full at 1
        assert refused[0] == 503, refused
        assert "holds 1 requests for this route (limits.max_held_requests)" in refused[1], refused
        assert not any(answer.done() for answer in old + new), "the held ones stay held"
        team.warm(kube)
        done = results(old) + results(new)
    assert done == [(200, "served /old/0"), (200, "served /old/1"), (200, "served /new/0")], done
    assert "/refused" not in team.served()
    accepted = wait_condition(kube, TEAM_A, "web", "Accepted", "True")
    wait_for(lambda: conditions(kube, TEAM_A, "web")["Accepted"]["observedGeneration"] == 2, 20, "generation 2 seen")
    timeline.record(
        f"routes: edit while 2 requests held (host {added} added, limits.max_held_requests 1000 -> 1): the new host "
        f"held a request {new_after * 1000:.0f} ms after kubectl apply returned; a new request beyond the new "
        f"limit answered 503 ({refused[1].strip()[:70]}...); the 2 held on the first version and the 1 on the new "
        f"one answered 200 once the pod was ready; status Accepted={accepted['status']} at generation 2"
    )


def test_a_route_deleted_while_requests_are_held_answers_them_503_saying_so(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    team = teams[TEAM_A]
    host = f"del.{TEAM_A}.example"
    apply_as_tenant(kube, route(TEAM_A, "del", [host]))
    until_routed(proxy.port, host, time.monotonic())
    team.cold(kube)
    wait_cold(kube, TEAM_A, "del")
    with ThreadPoolExecutor(2) as pool:
        held = held_requests(pool, proxy.port, host, ["/held/0", "/held/1"])
        proxy.wait_held(f"{TEAM_A}/del", 2)
        started = time.monotonic()
        deleted = as_tenant(kube, TEAM_A, "delete", "zeroscaleroute", "del")
        returned = time.monotonic() - started
        assert deleted.returncode == 0, deleted.stderr
        done = results(held)
        answered_after = time.monotonic() - started
    for status, body in done:
        assert status == 503, done
        assert f"route {TEAM_A}/del was deleted" in body, body
    after = get(proxy.port, host)
    assert after[0] == 404, after
    assert not any(path.startswith("/held/") for path in team.served())
    timeline.record(
        f"routes: {TEAM_A}/del deleted by the tenant with 2 requests held: both answered 503 "
        f"({done[0][1].strip()[:60]}) {answered_after * 1000:.0f} ms after kubectl delete started (it returned "
        f"after {returned * 1000:.0f} ms); its host then answers 404"
    )


def test_two_namespaces_claim_one_host_the_oldest_wins_and_the_other_says_who(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    host = "shop.e2e.example"
    for team in teams.values():
        team.warm(kube)
    apply_as_tenant(kube, route(TEAM_A, "shop", [host]))
    time.sleep(1.1)  # creationTimestamp has whole seconds: B's claim is the younger one
    apply_as_tenant(kube, route(TEAM_B, "shop", [host]))
    lost = wait_condition(kube, TEAM_B, "shop", "Accepted", "False")
    assert lost["reason"] == "HostClaimed", lost
    assert f"{TEAM_A}/shop" in lost["message"], lost
    won = wait_condition(kube, TEAM_A, "shop", "Accepted", "True")
    for n in range(3):
        assert get(proxy.port, host, f"/claimed/{n}") == (200, f"served /claimed/{n}")
    assert [path for path in teams[TEAM_A].served() if path.startswith("/claimed/")] == [
        f"/claimed/{n}" for n in range(3)
    ]
    assert not any(path.startswith("/claimed/") for path in teams[TEAM_B].served())

    released = as_tenant(kube, TEAM_A, "delete", "zeroscaleroute", "shop")
    assert released.returncode == 0, released.stderr
    started = time.monotonic()

    def passed() -> bool:
        return get(proxy.port, host, "/passed") == (200, "served /passed") and "/passed" in teams[TEAM_B].served()

    wait_for(passed, 10, f"the host passed to {TEAM_B}")
    passed_after = time.monotonic() - started
    wait_condition(kube, TEAM_B, "shop", "Accepted", "True")
    timeline.record(
        f"routes: {TEAM_A}/shop and then {TEAM_B}/shop claim {host}: {TEAM_A} serves it (Accepted={won['status']}); "
        f'{TEAM_B}/shop Accepted=False {lost["reason"]}: "{lost["message"][:90]}"; {TEAM_A}/shop deleted: the '
        f"host routes to {TEAM_B} {passed_after * 1000:.0f} ms later and its route reads Accepted=True"
    )


def test_a_tenant_cannot_name_another_namespaces_service(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    obj = route(TEAM_A, "bank", [f"bank.{TEAM_A}.example"])
    obj["spec"]["upstream"]["namespace"] = TEAM_B
    refused = as_tenant(kube, TEAM_A, "apply", "--validate=strict", "-f", "-", obj=obj)
    assert refused.returncode != 0
    assert 'unknown field "spec.upstream.namespace"' in refused.stderr, refused.stderr
    with pytest.raises(KubeError) as absent:
        kube.get(routes_path(TEAM_A, "bank"))
    assert absent.value.status == 404
    assert get(proxy.port, f"bank.{TEAM_A}.example")[0] == 404
    said = refused.stderr[refused.stderr.index("unknown field") :].splitlines()[0]
    timeline.record(f"routes: the tenant's route naming {TEAM_B}'s Service refused at admission: {said[:140]}")


# What Chrome sends when a person opens a page (a navigation).
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "Sec-Fetch-Mode": "navigate"}


def test_a_browser_gets_the_waking_page_a_health_check_wakes_nothing_and_a_program_is_held(
    proxy: ProxyPod, teams: dict[str, Team], kube: Kube, timeline: Timeline
) -> None:
    team = teams[TEAM_B]
    host = f"page.{TEAM_B}.example"
    team.cold(kube)
    spec = {
        "waking_page": {"refresh": 2},
        "never_wake": [{"path": "/healthz", "response": {"status": 200, "body": "ok"}}],
        "overflow": "waking_page",
    }
    applied = apply_as_tenant(kube, route(TEAM_B, "page", [host], **spec))  # the CRD's maps and rules, for real
    wait_condition(kube, TEAM_B, "page", "Accepted", "True")
    wait_cold(kube, TEAM_B, "page")
    wait_for(lambda: get(proxy.port, host, "/healthz") == (200, "ok"), 10, "the health check answered by the proxy")
    routed_after = time.monotonic() - applied
    time.sleep(1.0)  # a wake would have patched the Deployment by now
    assert kube.replicas(TEAM_B, APP) == 0, "a never-wake health check woke the workload"

    status, page = get(proxy.port, host, "/", BROWSER)
    assert status == 503
    assert '<meta http-equiv="refresh" content="2">' in page
    assert f"{TEAM_B}/page" in page
    woke = wait_replicas(kube, TEAM_B, APP, 1, timeout=20)  # the page's navigation woke it
    with ThreadPoolExecutor(1) as pool:
        program = pool.submit(get, proxy.port, host, "/api/order", {"Accept": "application/json"})
        time.sleep(0.5)
        assert not program.done(), "a program's request is held, not given the page"
        team.warm(kube)
        assert program.result(timeout=60) == (200, "served /api/order")
    assert get(proxy.port, host, "/", BROWSER) == (200, "served /")
    assert get(proxy.port, host, "/healthz") == (200, "served /healthz")  # when: cold: forwarded once warm
    assert team.served().count("/healthz") == 1  # the cold one never reached the app
    timeline.record(
        f"cold-start choices: {TEAM_B}/page (waking_page, never_wake /healthz) answered its health check itself "
        f"{routed_after:.1f} s after kubectl apply, waking nothing; a browser got the waking page (503) and {APP} was "
        f"woken 0->1 in {woke:.2f} s; a JSON request was held and answered 200 once warm; warm, both forwarded"
    )
