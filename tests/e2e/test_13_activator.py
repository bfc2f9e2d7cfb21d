"""Route mode activator against the real control plane and a real data plane (issue 17): continuous traffic to a
Service's ClusterIP through kube-proxy, over warm -> zero -> warm cycles, loses no request and answers none twice.

Clients in the data plane's namespace call the selector-less Service `web` without ever changing anything; two
`zeroscale proxy` processes (each on an address of its own, as two proxy pods) write its EndpointSlices, one at a
time by the Lease, with the grants of deploy/overlays/activator (deploy/base grants no EndpointSlice write) moved
into this test's namespace, as a user adapts them to theirs, and deploy/base's Lease Role naming this test's Lease.
Warm, kube-proxy sends every new connection straight to the pod and the proxies see none; when the test scales the
Deployment to 0 the leader lists the proxies before the pod goes (the pod's preStop keeps it listening meanwhile);
the proxies hold what arrives, wake the Deployment (spec.replicas 0 -> 1), the kubelet stand-in starts a pod, the
held requests go to it, and the leader lists the pod again. Last, the leader is killed and the other takes over
within the Lease's timings, and one more cycle loses nothing.

The pods say who answered and whether the proxy carried the request (tests/e2e/pods.py); every request is
counted by its id, as the client saw it and as the pods saw it.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapter.children import port_outside_ephemeral
from tests.e2e import install
from tests.e2e.cluster import ENDPOINTSLICE_API, ControlPlane, Kube, Watch, deployment, wait_for
from tests.e2e.dataplane import ClientRun, DataPlane
from tests.e2e.fixtures import Installed, Timeline, kube_api
from tests.e2e.kubelet_standin import KubeletStandIn
from tests.e2e.pods import Pod, answer_of
from tests.e2e.processes import Zeroscale
from tests.fixtures.manifests import DEPLOY, kustomize

NAMESPACE = "e2e-activator"
SERVICE, PODS_SERVICE, DEPLOYMENT, ROUTE = "web", "web-pods", "web", "web"
PROXY_SERVICE, PROXY_NAMESPACE, LEASE = "zs-proxy", install.NAMESPACE, "e2e-activator"
CYCLES = 4  # the last one after the leader was killed
WARM = 3.0  # seconds of warm traffic checked per cycle
PRE_STOP = 2.0  # the pods' preStop: the margin the switch to the proxies relies on
START_DELAY = 1.0  # a pod's start, from spec.replicas up to its endpoint ready
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 3.0, 2.0, 0.5
SWITCH_BUCKET = "2.5"  # every switch the proxies timed took less (their histogram's bucket)
CLIENT_LABEL = "act"
# deploy/overlays/activator grants route `web` of deploy/examples/activator.zeroscale.yaml (Service and Deployment
# `web`, as here) in the example's namespace, and the Lease in the proxy's (PROXY_NAMESPACE, as here).
ACTIVATOR_OVERLAY, EXAMPLE_NAMESPACE = DEPLOY / "overlays" / "activator", "shop"


def _service(name: str, namespace: str, selector: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    if selector is not None:
        spec["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _activator_rbac() -> list[dict[str, Any]]:
    """deploy/overlays/activator as shipped, adapted as a user would: its grants in the example's namespace moved to
    this test's; and deploy/base's Lease Role (every installation's: route objects elect their status writer on it)
    with the Lease it names (the default) renamed to this test's."""
    objects = kustomize(ACTIVATOR_OVERLAY)
    assert {obj["metadata"]["namespace"] for obj in objects} == {EXAMPLE_NAMESPACE}
    for obj in objects:
        obj["metadata"]["namespace"] = NAMESPACE
    leases = [obj for obj in install.shipped("proxy-rbac.yaml") if obj["metadata"]["name"] == "zeroscale-proxy-leases"]
    assert {obj["metadata"]["namespace"] for obj in leases} == {PROXY_NAMESPACE}
    for obj in leases:
        for rule in obj.get("rules", []):
            if rule["resources"] == ["leases"] and "resourceNames" in rule:
                rule["resourceNames"] = [LEASE]
    return objects + leases


@dataclass
class Proxy:
    """One `zeroscale proxy` replica, on an address of its own."""

    identity: str
    address: str
    process: Zeroscale
    admin_port: int
    alive: bool = True

    def metrics(self) -> dict[str, float]:
        """The admin port's samples, by `name{label=value,...}` (labels sorted)."""
        connection = HTTPConnection(self.address, self.admin_port, timeout=5)
        try:
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{key}={value}" for key, value in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples


def _requests(metrics: dict[str, float]) -> float:
    return metrics.get(f"zeroscale_proxy_requests_total{{route={ROUTE}}}", 0.0)


def _slice_writes(metrics: dict[str, float]) -> float:
    return sum(
        value for key, value in metrics.items() if key.startswith("zeroscale_proxy_activator_slice_writes_total")
    )


@dataclass
class Proxies:
    replicas: list[Proxy]
    activator_port: int
    main_port: int

    @property
    def addresses(self) -> set[tuple[str, int]]:
        return {(proxy.address, self.activator_port) for proxy in self.replicas}

    def alive(self) -> list[Proxy]:
        return [proxy for proxy in self.replicas if proxy.alive]

    def requests(self) -> dict[str, float]:
        return {proxy.identity: _requests(proxy.metrics()) for proxy in self.alive()}

    def proxy_slice(self) -> dict[str, Any]:
        """The proxies' own Service's slice, as the EndpointSlice controller writes it for their ready pods."""
        return {
            "apiVersion": ENDPOINTSLICE_API,
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{PROXY_SERVICE}-e2e",
                "namespace": PROXY_NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": PROXY_SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": self.main_port, "protocol": "TCP"}],
            "endpoints": [
                {
                    "addresses": [proxy.address],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "targetRef": {"kind": "Pod", "namespace": PROXY_NAMESPACE, "name": proxy.identity},
                }
                for proxy in self.alive()
            ],
        }


Endpoint = tuple[str, int, bool, bool]  # address, port, ready, serving


@dataclass
class SliceLog:
    """Every state the Service's slices went through (after each event of a watch of them), with its time."""

    states: list[tuple[float, frozenset[Endpoint]]] = field(default_factory=list)
    _slices: dict[str, frozenset[Endpoint]] = field(default_factory=dict)

    def event(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._slices.pop(name, None)
        else:
            ports = [port["port"] for port in obj.get("ports") or []]
            self._slices[name] = frozenset(
                (address, port, (ep.get("conditions") or {}).get("ready") is not False, _serving(ep))
                for ep in obj.get("endpoints") or []
                for address in ep["addresses"]
                for port in ports
            )
        self.states.append((at, frozenset().union(*self._slices.values())))

    def first(self, after: float, condition: Callable[[set[tuple[str, int]]], object]) -> float | None:
        """When the first state at or after `after` met `condition(routed)` (see routed)."""
        return next((at for at, state in self.states if at >= after and condition(routed(state))), None)


def _serving(endpoint: dict[str, Any]) -> bool:
    conditions = endpoint.get("conditions") or {}
    serving = conditions.get("serving")
    return bool(conditions.get("ready") is not False if serving is None else serving)


def routed(state: frozenset[Endpoint]) -> set[tuple[str, int]]:
    """Where kube-proxy sends a new connection: the ready endpoints, or while none is, the serving ones."""
    ready = {(address, port) for address, port, is_ready, _ in state if is_ready}
    return ready or {(address, port) for address, port, _, serving in state if serving}


@dataclass
class Cycle:
    warm_from: float  # the warm window checked before the cycle's scale to zero
    warm_to: float
    warm_requests: dict[str, float]  # each proxy's request count over the warm window: (after - before)
    zero_at: float = 0.0  # the Deployment at spec.replicas 0 (seen by a watch)
    proxy_at: float = 0.0  # the slices list the proxies (nothing else routed)
    woke_at: float = 0.0  # spec.replicas back to 1: a proxy woke it
    ready_at: float = 0.0  # the new pod's endpoint ready
    pods_at: float = 0.0  # the slices list that pod (nothing else routed)


@pytest.fixture
def app(kube: Kube, installed: Installed) -> Iterator[KubeletStandIn[Pod]]:
    """The Deployment, its two Services, the proxy's grants for mode activator and the kubelet stand-in running its
    pods."""
    kube.namespace(NAMESPACE)
    rbac = _activator_rbac()
    kube.apply(
        [
            deployment(NAMESPACE, DEPLOYMENT, replicas=1),
            _service(PODS_SERVICE, NAMESPACE, {"app": DEPLOYMENT}),
            _service(SERVICE, NAMESPACE, None),  # selector-less: the activator writes its slices
            _service(PROXY_SERVICE, PROXY_NAMESPACE, {"app": PROXY_SERVICE}),
            *rbac,
        ]
    )
    kubelet = KubeletStandIn(
        kube, NAMESPACE, DEPLOYMENT, PODS_SERVICE, "http", pod=Pod, start_delay=START_DELAY, pre_stop=PRE_STOP
    )
    try:
        yield kubelet
    finally:
        kubelet.close()
        kube.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
        for namespace, name in ((NAMESPACE, SERVICE), (NAMESPACE, PODS_SERVICE), (PROXY_NAMESPACE, PROXY_SERVICE)):
            kube.delete(f"/api/v1/namespaces/{namespace}/services/{name}")  # the written slices go with `web`
        kube.delete(f"/apis/{ENDPOINTSLICE_API}/namespaces/{PROXY_NAMESPACE}/endpointslices/{PROXY_SERVICE}-e2e")
        kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{PROXY_NAMESPACE}/leases/{LEASE}")
        for grant in rbac:  # no later scenario's proxy gets what only this one needs
            plural = grant["kind"].lower() + "s"
            where = f"namespaces/{grant['metadata']['namespace']}"
            kube.delete(f"/apis/rbac.authorization.k8s.io/v1/{where}/{plural}/{grant['metadata']['name']}")


@pytest.fixture
def proxies(
    plane: ControlPlane, kube: Kube, installed: Installed, dataplane: DataPlane, app: KubeletStandIn[Pod], workdir: Path
) -> Iterator[Proxies]:
    main_port, admin_port, activator_port = (port_outside_ephemeral("0.0.0.0") for _ in range(3))
    replicas: list[Proxy] = []
    group = Proxies(replicas, activator_port, main_port)
    try:
        for number, identity in enumerate(("proxy-a", "proxy-b"), start=1):
            address = dataplane.host_alias(number)
            config = {
                "proxy": {
                    "bind": address,
                    "port": main_port,
                    "admin_bind": address,
                    "admin_port": admin_port,
                    "kubernetes": kube_api(plane, installed.proxy_token),
                    "routes": [
                        {
                            "name": ROUTE,
                            "mode": "activator",
                            "upstream": {"service": PODS_SERVICE, "namespace": NAMESPACE, "port": "http"},
                            "activator": {"service": SERVICE, "port": activator_port},
                            "target": {"namespace": NAMESPACE, "kind": "Deployment", "name": DEPLOYMENT},
                            # The test scales to zero by hand, which wake: scale takes for a person's stop.
                            "wake": "always",
                            "readiness": "endpointslice",
                        }
                    ],
                    "activator": {
                        "proxy_service": {"service": PROXY_SERVICE, "namespace": PROXY_NAMESPACE},
                        "lease_namespace": PROXY_NAMESPACE,
                        "lease_name": LEASE,
                        "identity": identity,
                        "lease_duration": LEASE_DURATION,
                        "renew_deadline": RENEW_DEADLINE,
                        "retry_period": RETRY_PERIOD,
                    },
                }
            }
            directory = workdir / f"activator-{identity}"
            directory.mkdir()
            process = Zeroscale("proxy", directory, config, main_port)
            replicas.append(Proxy(identity, address, process.start(), admin_port))
        kube.apply([group.proxy_slice()])
        yield group
    finally:
        for proxy in replicas:
            proxy.process.stop()


def test_continuous_traffic_through_warm_zero_warm_cycles_loses_nothing_and_answers_nothing_twice(
    kube: Kube, dataplane: DataPlane, app: KubeletStandIn[Pod], proxies: Proxies, timeline: Timeline
) -> None:
    log = SliceLog()
    selector = f"kubernetes.io%2Fservice-name%3D{SERVICE}"
    slices = Watch(
        kube, f"/apis/{ENDPOINTSLICE_API}/namespaces/{NAMESPACE}/endpointslices?labelSelector={selector}", log.event
    )
    cluster_ip = kube.get(f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")["spec"]["clusterIP"]
    wait_for(lambda: app.pods or None, 10, "the first pod")
    first_pod = {(pod.address, pod.port) for pod in app.pods}
    wait_for(lambda: log.first(0, lambda to: to and to <= first_pod), 30, "the leader listing the first pod")
    wait_for(lambda: _direct(dataplane, f"http://{cluster_ip}/req/probe"), 30, "the ClusterIP reaching the pod")
    leader, follower = _lease_holders(kube, proxies)

    cycles: list[Cycle] = []
    takeover = 0.0
    switches: dict[str, tuple[int, int]] = {}
    try:
        with dataplane.client(f"{cluster_ip}:80", connections=4, label=CLIENT_LABEL, pause=0.01) as run:
            began = time.time()
            warm_since = began
            for number in range(CYCLES):
                cycle = _warm_window(run, proxies, warm_since)
                cycles.append(cycle)
                if number == CYCLES - 1:
                    # Only the Lease's holder wrote; then it dies without a word (SIGKILL, as a node going away).
                    leader_metrics, follower_metrics = leader.metrics(), follower.metrics()
                    switches[leader.identity] = _switch_buckets(leader_metrics)
                    assert leader_metrics["zeroscale_proxy_activator_leader{}"] == 1
                    assert follower_metrics["zeroscale_proxy_activator_leader{}"] == 0
                    assert _slice_writes(leader_metrics) > 0
                    assert _slice_writes(follower_metrics) == 0, "a replica not holding the Lease wrote slices"
                    killed = time.time()
                    leader.process.kill()
                    leader.alive = False
                    kube.apply([proxies.proxy_slice()])  # its pod gone: the controller drops its endpoint
                    wait_for(
                        lambda: _holder(kube) == follower.identity, 3 * LEASE_DURATION, "the other replica's takeover"
                    )
                    takeover = time.time() - killed
                    wait_for(lambda: follower.metrics()["zeroscale_proxy_activator_leader{}"] == 1, 5, "it leading")
                _through_zero(kube, app, log, proxies, cycle)
                warm_since = cycle.pods_at
            final = _warm_window(run, proxies, warm_since)
    finally:
        slices.close()
    outcomes = [o for o in run.outcomes() if o["started"] >= began]

    # Every request sent got one 200 answer, with its own id; the pods saw each id once.
    lost = [o for o in outcomes if o["status"] != 200 or answer_of(o).get("id") != o["id"]]
    seen = Counter(a["id"] for pod in app.pods for a in pod.seen if a["id"].startswith(f"{CLIENT_LABEL}-"))
    twice = sorted(request_id for request_id, count in seen.items() if count > 1)
    never = [o["id"] for o in outcomes if seen[o["id"]] == 0]
    proxied = [o for o in outcomes if answer_of(o).get("proxied")]
    # The Service routed somewhere at every moment the client sent.
    empty = [at for at, state in log.states if began <= at <= final.warm_to and not routed(state)]
    switches[follower.identity] = _switch_buckets(follower.metrics())
    windows = [*cycles, final]
    # Per cycle: the requests from its scale to zero to the next warm window, and those the proxies carried.
    zero_phases = [
        [o for o in outcomes if cycle.warm_to <= o["started"] < after.warm_from]
        for cycle, after in zip(cycles, windows[1:], strict=True)
    ]
    carried = [sum(1 for o in phase if answer_of(o).get("proxied")) for phase in zero_phases]
    to_proxy = [(c.proxy_at - c.zero_at) * 1000 for c in cycles]
    to_pods = [(c.pods_at - c.ready_at) * 1000 for c in cycles]
    per_cycle = ", ".join(
        f"#{n + 1}: {p:.0f}/{q:.0f} ms, woken {cycle.woke_at - cycle.zero_at:.1f} s after 0, "
        f"{c} of {len(phase)} via the proxies"
        for n, (cycle, p, q, c, phase) in enumerate(zip(cycles, to_proxy, to_pods, carried, zero_phases, strict=True))
    )
    timeline.record(
        f"activator: {len(outcomes)} requests through kube-proxy's ClusterIP over {CYCLES} warm->zero->warm cycles "
        f"(2 proxies, the leader killed before the last), lost {len(lost)}, answered twice {len(twice)}; "
        f"direct {len(outcomes) - len(proxied)}, via the proxies {len(proxied)}; switch "
        f"spec.replicas 0 -> slice lists the proxies / first pod ready -> slice lists it: {per_cycle} "
        f"(median {statistics.median(to_proxy):.0f}/{statistics.median(to_pods):.0f} ms); proxies' switch_seconds "
        f"{_describe(switches)}; Lease: {leader.identity} wrote, {follower.identity} 0 writes until it took over "
        f"{takeover:.1f} s after the kill"
    )

    assert not lost, lost[:5]
    assert not twice, twice[:5]
    assert not never, never[:5]
    assert not empty, f"the Service's slices routed nowhere at {empty[:5]}"
    for n, cycle in enumerate(windows):
        direct = [o for o in outcomes if cycle.warm_from <= o["started"] and o["ended"] <= cycle.warm_to]
        assert direct, f"warm window {n + 1}: no request"
        assert not [o for o in direct if answer_of(o).get("proxied")], f"warm window {n + 1}: through the proxy"
        assert all(count == 0 for count in cycle.warm_requests.values()), (n, cycle.warm_requests)
    for n, cycle in enumerate(cycles):
        assert cycle.proxy_at - cycle.zero_at < PRE_STOP, f"cycle {n + 1}: the proxies listed after the pod went"
        assert carried[n] > 0, f"cycle {n + 1}: the proxies carried nothing at zero"
    assert takeover <= LEASE_DURATION + 2 * RETRY_PERIOD + 1.0
    assert _slice_writes(follower.metrics()) > 0, "the replica that took the Lease over wrote nothing"
    for identity, (count, within) in switches.items():
        assert within == count, f"{identity} timed a switch above {SWITCH_BUCKET} s: {switches}"


def _direct(dataplane: DataPlane, url: str) -> bool:
    status, body = dataplane.get(url)
    return status == 200 and answer_of({"body": body}).get("proxied") is False


def _holder(kube: Kube) -> str:
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{PROXY_NAMESPACE}/leases/{LEASE}")
    return str(lease["spec"].get("holderIdentity") or "")


def _lease_holders(kube: Kube, proxies: Proxies) -> tuple[Proxy, Proxy]:
    """(the replica holding the Lease, the other one)."""
    holder = wait_for(lambda: _holder(kube) or None, 10, "a Lease holder")
    (leader,) = [proxy for proxy in proxies.replicas if proxy.identity == holder]
    (follower,) = [proxy for proxy in proxies.replicas if proxy.identity != holder]
    return leader, follower


def _warm_window(run: ClientRun, proxies: Proxies, since: float) -> Cycle:
    """WARM seconds of warm traffic, from the first request kube-proxy sent straight to a pod after `since`."""
    first = wait_for(
        lambda: min(
            (o["started"] for o in run.outcomes() if o["started"] > since and answer_of(o).get("proxied") is False),
            default=None,
        ),
        15,
        "a request answered straight by a pod",
    )
    time.sleep(max(0.0, first + 0.3 - time.time()))  # what the proxies forwarded before is counted by now
    before = proxies.requests()
    warm_from = time.time()
    time.sleep(WARM)
    warm_to = time.time()
    after = proxies.requests()
    return Cycle(warm_from, warm_to, {name: after[name] - before[name] for name in after})


def _through_zero(kube: Kube, app: KubeletStandIn[Pod], log: SliceLog, proxies: Proxies, cycle: Cycle) -> None:
    """Scale to 0 and wait until the proxies woke it and the slices list the new pod; times the cycle's events."""
    scaled = time.time()
    kube.kubectl("scale", "-n", NAMESPACE, f"deployment/{DEPLOYMENT}", "--replicas=0")

    def event(what: str, after: float, detail: object = None) -> tuple[float, object] | None:
        return next(
            ((at, d) for at, kind, d in list(app.events) if at >= after and kind == what and detail in (None, d)),
            None,
        )

    cycle.zero_at, _ = wait_for(lambda: event("replicas", scaled, 0), 10, "the watch seeing spec.replicas 0")
    cycle.proxy_at = wait_for(
        lambda: log.first(cycle.zero_at, lambda to: to and to <= proxies.addresses),
        10,
        "the slices listing the proxies",
    )
    cycle.woke_at, _ = wait_for(lambda: event("replicas", cycle.zero_at, 1), 20, "a proxy waking the Deployment")
    cycle.ready_at, name = wait_for(lambda: event("ready", cycle.woke_at), 20, "the new pod ready")
    (pod,) = [pod for pod in app.pods if pod.name == name]
    cycle.pods_at = wait_for(
        lambda: log.first(cycle.ready_at, lambda to: to == {(pod.address, pod.port)}), 20, "the slices listing the pod"
    )


def _switch_buckets(metrics: dict[str, float]) -> tuple[int, int]:
    """(switches the replica timed, those within SWITCH_BUCKET seconds), both directions."""
    total = within = 0.0
    for to in ("proxy", "pods"):
        total += metrics.get(f"zeroscale_proxy_activator_switch_seconds_count{{route={ROUTE},to={to}}}", 0.0)
        within += metrics.get(
            f"zeroscale_proxy_activator_switch_seconds_bucket{{le={SWITCH_BUCKET},route={ROUTE},to={to}}}", 0.0
        )
    return int(total), int(within)


def _describe(switches: dict[str, tuple[int, int]]) -> str:
    return ", ".join(
        f"{name} {count} timed, {within} under {SWITCH_BUCKET} s" for name, (count, within) in switches.items()
    )
