"""Leader election on a Lease (adapter/proxy/leader.py) against the Kubernetes API stand-in, and what it means for
two proxies with activator routes: one writes the slices, both hold and forward."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from adapter.children import port_outside_ephemeral
from adapter.config.proxy import ActivatorConfig
from adapter.kube.client import KubeClient
from adapter.kube.leases import lease_path
from adapter.proxy.leader import LeaderElector
from tests.fixtures.kube_routes import SLICES_V1, endpoint_slice
from tests.fixtures.kube_standin import KubeStandIn, Reply, StandInRequest, status_body
from tests.fixtures.proxy import get, request, running_proxy, until
from tests.fixtures.upstream_app import Upstream
from tests.proxy.test_activator import (
    LEASE,
    LEASES,
    PROXY_ADDRESS,
    SHORT_LEASE,
    SLICES,
    activator_route,
    activator_settings,
    deployment,
    kube,
    listed,
    ours,
    pods,
    seed,
    service,
    set_replicas,
)

__all__ = ["kube"]  # the fixture
# A Lease left to lapse: the tests that wait for one use these, and decide from what the API received and when
# (LeaseWrites), never from how long a wait took; the others keep their Lease through a loaded machine's stalls (LEASE).
TIMING = SHORT_LEASE


def config(identity: str, timing: dict[str, float] = TIMING) -> ActivatorConfig:
    return ActivatorConfig.model_validate(activator_settings(identity, **timing))


@asynccontextmanager
async def electors(
    kube_client: KubeClient, *identities: str, timing: dict[str, float] = TIMING
) -> AsyncIterator[list[LeaderElector]]:
    started = [LeaderElector(kube_client, config(identity, timing)) for identity in identities]
    for elector in started:
        elector.start()
    try:
        yield started
    finally:
        for elector in started:
            await elector.close()


async def watch_leaders(electors_: list[LeaderElector], seconds: float) -> set[tuple[str, ...]]:
    """Who leads, sampled every 10 ms for `seconds`."""
    seen: set[tuple[str, ...]] = set()
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        seen.add(tuple(e.identity for e in electors_ if e.leading))
        await asyncio.sleep(0.01)
    return seen


class LeaseWrites:
    """When the API received each identity's Lease writes (kube.before_write, on the monotonic clock the electors
    time their Leases with): a lapse timed from these holds whatever the event loop did meanwhile, where a wait
    timed by the test grows with every stall of a loaded machine. A write refused by a test's route is not one;
    one that the store then refuses (409) would be, and none does in these tests."""

    def __init__(self, kube: KubeStandIn) -> None:
        self.at: dict[str, list[float]] = {}
        kube.before_write.append(self._note)

    def _note(self, method: str, path: str, body: Any) -> None:
        if method in ("POST", "PUT") and "/leases" in path:
            self.at.setdefault(body["spec"]["holderIdentity"], []).append(time.monotonic())

    def last_before(self, identity: str, moment: float) -> float:
        return max((at for at in self.at.get(identity, []) if at < moment), default=-math.inf)


async def sample_leading(electors_: list[LeaderElector], samples: list[tuple[float, list[bool]]]) -> None:
    """Who leads, every 5 ms, each sample with the time taken just before it: any renewal that made an elector lead
    then was received before that time."""
    while True:
        at = time.monotonic()
        samples.append((at, [e.leading for e in electors_]))
        await asyncio.sleep(0.005)


def assert_led_only_within_renew_deadline(
    samples: list[tuple[float, list[bool]]], writes: LeaseWrites, identity: str, renew_deadline: float
) -> None:
    late = [at - writes.last_before(identity, at) for at, (leads, *_) in samples if leads]
    assert all(since < renew_deadline for since in late), f"{identity} led {max(late)} s after its last renewal"


async def test_exactly_one_of_two_leads(kube: KubeStandIn, kube_client: KubeClient) -> None:
    timing = {**LEASE, "lease_duration": 14.5}
    async with electors(kube_client, "proxy-a", "proxy-b", timing=timing) as both:
        await until(lambda: any(e.leading for e in both))
        assert len(await watch_leaders(both, 1.0) - {()}) == 1
        (leader,) = [e for e in both if e.leading]
        lease = kube.get(lease_path("zeroscale"), "zeroscale-proxy-activator")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == leader.identity
        assert lease["spec"]["leaseDurationSeconds"] == 15  # 14.5 s, in the API's whole seconds, rounded up


async def test_a_leader_that_closes_gives_the_lease_up_and_the_other_leads_within_a_retry_period(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    async with electors(kube_client, "proxy-a", "proxy-b", timing=LEASE) as both:
        await until(lambda: any(e.leading for e in both))
        (leader,) = [e for e in both if e.leading]
        (other,) = [e for e in both if e is not leader]
        await leader.close()
        lease = kube.get(lease_path("zeroscale"), "zeroscale-proxy-activator")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] in ("", other.identity)
        # A retry_period (2 s) and a round trip, not the lease_duration (15 s) of a Lease left to expire.
        await until(lambda: other.leading, within=LEASE["lease_duration"] / 2)


def refuse_writes_of(kube: KubeStandIn, identity: str, how: str, seconds: float = 0.5) -> Callable[[], None]:
    """The API refuses (500) or does not answer (hangs `seconds`, past retry_period) `identity`'s Lease writes."""

    def refuse(request: StandInRequest, _match: Any) -> Reply | None:
        if (request.json() or {}).get("spec", {}).get("holderIdentity") != identity:
            return None
        if how == "hang":
            time.sleep(seconds)
        return Reply(500, status_body(500, "InternalError", "etcd is unwell"))

    return kube.add_route("PUT", LEASES + "/[^/]+", refuse)


@pytest.mark.parametrize("how", ["error", "hang"])
async def test_a_leader_that_cannot_renew_stops_by_renew_deadline_and_is_replaced_only_after_lease_duration(
    kube: KubeStandIn, kube_client: KubeClient, how: str
) -> None:
    writes = LeaseWrites(kube)
    samples: list[tuple[float, list[bool]]] = []
    async with electors(kube_client, "proxy-a") as (first,):
        await until(lambda: first.leading)
        async with electors(kube_client, "proxy-b") as (second,):
            renewed = len(writes.at["proxy-a"])
            await until(lambda: len(writes.at["proxy-a"]) >= renewed + 2)  # b reads a's renewals meanwhile
            assert not second.leading
            sampling = asyncio.create_task(sample_leading([first, second], samples))
            try:
                refuse_writes_of(kube, "proxy-a", how)
                await until(lambda: second.leading, within=15)
            finally:
                sampling.cancel()
            assert not first.leading
    # a led at most renew_deadline (1.0 s) after its last renewal, and never beside b.
    assert_led_only_within_renew_deadline(samples, writes, "proxy-a", TIMING["renew_deadline"])
    assert not any(all(leads) for _, leads in samples)
    # b took it not before lease_duration (1.5 s) after a's last renewal: b times it from when it read the record
    # change, which is later.
    took = writes.at["proxy-b"][0] - writes.at["proxy-a"][-1]
    assert took >= TIMING["lease_duration"], took


async def test_a_lease_is_timed_on_our_own_clock_not_by_its_renew_time(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """A holder's renewTime says nothing to another clock: a Lease renewed "long ago" by its time stamp is taken
    only once it has stood unchanged for its leaseDurationSeconds as timed here."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "zeroscale-proxy-activator", "namespace": "zeroscale"},
        "spec": {
            "holderIdentity": "proxy-gone",
            "leaseDurationSeconds": 1,
            "renewTime": "2000-01-01T00:00:00.000000Z",
            "acquireTime": "2000-01-01T00:00:00.000000Z",
            "leaseTransitions": 3,
        },
    }
    kube.put(lease_path("zeroscale"), body)
    started = time.monotonic()
    async with electors(kube_client, "proxy-a") as (elector,):
        await until(lambda: elector.leading, within=5)
        assert time.monotonic() - started >= 0.9
    lease = kube.get(lease_path("zeroscale"), "zeroscale-proxy-activator")
    assert lease is not None
    assert lease["spec"]["leaseTransitions"] == 4


async def test_of_two_proxies_only_the_leader_writes_and_both_hold_and_forward(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Their routes have different names, and a written slice carries the route's name: were both writing, both
    names would show up in the writes."""
    upstream = await Upstream().start()
    pod_port = upstream.port
    seed(kube, 0, pod_port)
    ports = {"a": port_outside_ephemeral(), "b": port_outside_ephemeral()}
    route_a = activator_route(ports["a"], name="web-a")
    route_b = activator_route(ports["b"], name="web-b")
    try:
        async with (
            running_proxy([route_a], kube=kube_client, activator=activator_settings("proxy-a")) as a,
            running_proxy([route_b], kube=kube_client, activator=activator_settings("proxy-b")) as b,
        ):
            assert a.leader is not None
            assert b.leader is not None
            await until(lambda: a.leader.leading or b.leader.leading)  # type: ignore[union-attr]
            leader, follower = (a, b) if a.leader.leading else (b, a)
            leader_port = ports["a"] if leader is a else ports["b"]
            follower_port = ports["b"] if leader is a else ports["a"]
            await until(lambda: listed(kube) == [(PROXY_ADDRESS, leader_port, "http")])

            # Cold: the follower holds what reaches it on its activator port, and forwards it once a pod is ready.
            await upstream.stop()
            held = asyncio.create_task(request(follower_port, get("/echo?via=follower")))
            (follower_route,) = follower.routes.values()
            await until(lambda: follower_route.counts.held == 1)
            set_replicas(kube, 1)
            upstream = await Upstream(pod_port).start()
            kube.put(SLICES, pods(pod_port, "127.0.0.1"))
            assert (await held).status == 200
            await until(lambda: listed(kube) == [("127.0.0.1", pod_port, "http")])
            await asyncio.sleep(0.3)
            (leader_route,) = leader.routes.values()
            routes = {
                body["metadata"]["labels"]["zeroscale.io/route"]
                for _, path, body in kube.writes
                if body and "/endpointslices" in path
            }
            assert routes == {leader_route.config.name}

            # The leader goes: the follower takes the Lease (given up) and writes.
            await leader.shutdown(grace=0)
            assert follower.leader is not None
            # Given up: a retry_period, not the lease_duration (15 s) of a Lease left to expire.
            await until(lambda: follower.leader.leading, within=LEASE["lease_duration"] / 2)  # type: ignore[union-attr]
            set_replicas(kube, 0)
            await until(lambda: listed(kube) == [(PROXY_ADDRESS, follower_port, "http")])
    finally:
        await upstream.stop()


async def test_a_leader_that_reads_another_holder_stops_at_once(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """The Lease deleted (by hand, a namespace clean-up) and created again by the other replica: the old holder
    must not keep writing beside the new one until its renew_deadline."""
    async with electors(kube_client, "proxy-a", timing=LEASE) as (first,):
        await until(lambda: first.leading)
        async with electors(kube_client, "proxy-b", timing=LEASE) as (second,):
            # a cannot create the Lease again (its POST fails): b does, and leads at once.
            kube.add_route("POST", LEASES, lambda request, _m: refused_for(request, "proxy-a"))
            kube.delete(lease_path("zeroscale"), "zeroscale-proxy-activator")
            await until(lambda: second.leading, within=10)
            # a reads the Lease at its next retry_period (2 s) and stops there, not at its renew_deadline (10 s).
            await until(lambda: not first.leading, within=LEASE["renew_deadline"] / 2)
            assert second.leading


def refused_for(request: StandInRequest, identity: str) -> Reply | None:
    if (request.json() or {}).get("spec", {}).get("holderIdentity") == identity:
        return Reply(500, status_body(500, "InternalError", "etcd is unwell"))
    return None


async def test_two_replicas_with_the_same_identity_never_both_lead(kube: KubeStandIn, kube_client: KubeClient) -> None:
    """identity defaults to the host name, which two pods share with hostNetwork (the node's) or spec.hostname,
    and a configured one can be copied: each would take the other's renewals for its own and both would write."""
    async with electors(kube_client, "proxy-a", "proxy-a") as both:
        await until(lambda: any(e.leading for e in both))
        leaders = await watch_leaders(both, 1.5)
        assert all(len(sample) <= 1 for sample in leaders), leaders


async def test_a_leader_stops_writing_at_its_renew_deadline_not_at_its_next_try(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """The other replica may take over lease_duration after the last renewal; the holder's only guarantee that the
    two never write at once is to stop within renew_deadline of its last renewal, and a try that hangs until
    retry_period (a slow API) must not put that off."""
    writes = LeaseWrites(kube)
    samples: list[tuple[float, list[bool]]] = []
    timing = {"lease_duration": 2.0, "renew_deadline": 1.0, "retry_period": 0.9}
    elector = LeaderElector(kube_client, config("proxy-a", timing))
    elector.start()
    sampling = asyncio.create_task(sample_leading([elector], samples))
    try:
        await until(lambda: elector.leading and len(writes.at.get("proxy-a", [])) >= 2, within=10)
        refuse_writes_of(kube, "proxy-a", "hang", seconds=1.5)
        await until(lambda: not elector.leading, within=10)
    finally:
        sampling.cancel()
        await elector.close()
    assert_led_only_within_renew_deadline(samples, writes, "proxy-a", timing["renew_deadline"])


async def test_a_write_sent_just_before_the_lease_is_lost_never_lands_after_another_replica_may_hold_it(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Issue 28, finding 7: a slice write may take the client's timeout (10 s), longer than the lease_duration left
    after the holder's last renewal; one sent as the holder stops renewing must be dropped, not applied late."""
    seed(kube, 0, 8080)
    renewals: list[float] = []
    applied: list[float] = []

    def note(method: str, path: str, body: Any) -> None:
        if "/leases" in path and body["spec"]["holderIdentity"] == "proxy-a":
            renewals.append(time.monotonic())
        elif "/endpointslices" in path:
            applied.append(time.monotonic())

    def slow(_request: StandInRequest, _match: Any) -> None:
        time.sleep(2.5)  # the API is slow to apply slice writes (then the stand-in's own route applies it)

    kube.before_write.append(note)
    async with running_proxy(
        [activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings("proxy-a", **TIMING)
    ) as a:
        await until(lambda: listed(kube) == [(PROXY_ADDRESS, a.routes["default/web"].config.activator.port, "http")])  # type: ignore[union-attr]
        await until(lambda: len(renewals) >= 3)  # renewing
        applied.clear()
        for method in ("POST", "PUT", "DELETE"):
            kube.add_route(method, SLICES_V1 + "(/[^/]+)?", slow)
        refuse_writes_of(kube, "proxy-a", "hang")
        set_replicas(kube, 1)
        kube.put(SLICES, pods(8080, "10.1.0.20"))  # warm: the leader writes the pod in, slowly
        await until(lambda: a.leader is not None and not a.leader.leading, within=5)
        await asyncio.sleep(3.0)  # past when the slow write would land
    late = [at - renewals[-1] for at in applied if at > renewals[-1] + TIMING["lease_duration"]]
    assert late == [], f"slice writes landed {late} s after the last renewal (lease_duration 1.5 s)"


def second_installation(kube: KubeStandIn, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Another installation in the same namespace: its own proxy Service (canary-proxy), and route `api` writing
    Service default/api for Deployment api (ready pod 10.0.0.2). Returns (route, activator settings)."""
    kube.put("/apis/apps/v1/namespaces/default/deployments", {**deployment(1), "metadata": {"name": "api"}})
    kube.put("/api/v1/namespaces/default/services", {**service(), "metadata": {"name": "api", "uid": "api-uid"}})
    kube.put(SLICES, endpoint_slice("api-pods-abcde", "api-pods", [("10.0.0.2", {"ready": True})], 8080))
    route = activator_route(
        port,
        name="api",
        activator={"service": "api"},
        upstream={"service": "api-pods", "namespace": "default", "port": "http"},
        target={"namespace": "default", "kind": "Deployment", "name": "api"},
    )
    settings = activator_settings("canary-a")
    settings["proxy_service"] = {"service": "canary-proxy", "namespace": "zeroscale"}
    return route, settings


def slice_addresses(kube: KubeStandIn, service_name: str) -> list[str]:
    return sorted(
        address for body in ours(kube, service_name) for ep in body["endpoints"] for address in ep["addresses"]
    )


def lease_reads(kube: KubeStandIn) -> int:
    return sum(1 for method, path, _ in kube.requests if method == "GET" and "/leases/" in path)


def holder_serves(route: str) -> float | None:
    return REGISTRY.get_sample_value("zeroscale_proxy_activator_holder_serves", {"route": f"default/{route}"})


async def test_two_installations_in_one_namespace_each_write_their_routes_by_default(
    kube: KubeStandIn, kube_client: KubeClient
) -> None:
    """Issue 28, finding 8: with the one default lease_name, one installation led and the other's Service never got a
    slice. The default follows the installation's proxy Service."""
    seed(kube, 1, 8080, "10.0.0.1")
    api_route, canary = second_installation(kube, port_outside_ephemeral())
    async with (
        running_proxy([activator_route(port_outside_ephemeral())], kube=kube_client, activator=activator_settings("a")),
        running_proxy([api_route], kube=kube_client, activator=canary),
    ):
        await until(
            lambda: slice_addresses(kube, "web") == ["10.0.0.1"] and slice_addresses(kube, "api") == ["10.0.0.2"]
        )
    leases = {lease["metadata"]["name"] for lease in kube.objects(lease_path("zeroscale"))}
    assert leases == {"zeroscale-proxy-activator", "canary-proxy-activator"}


async def test_a_replica_whose_routes_the_holder_does_not_write_says_so(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Two installations given one lease_name (or a holder with another route set): the follower's routes are not
    written, and it says so in its log and zeroscale_proxy_activator_holder_serves (the doctor: tests/doctor)."""
    seed(kube, 1, 8080, "10.0.0.1")
    api_route, canary = second_installation(kube, port_outside_ephemeral())
    shared: dict[str, Any] = {"lease_name": "shared", "retry_period": 0.5}  # reads enough to count in a few seconds
    async with running_proxy(
        [activator_route(port_outside_ephemeral())],
        kube=kube_client,
        activator=activator_settings("a", **shared),
    ) as first:
        await until(lambda: first.leader is not None and first.leader.leading)
        async with running_proxy([api_route], kube=kube_client, activator={**canary, **shared}):
            await until(lambda: holder_serves("api") == 0)
            assert holder_serves("web") == 1
            reads = lease_reads(kube)
            await until(lambda: lease_reads(kube) >= reads + 6)  # many reads of the Lease: one warning
            warnings = [
                r.getMessage() for r in caplog.records if "does not write routes of this replica" in r.getMessage()
            ]
            assert len(warnings) == 1, warnings
            assert "the holder a does not write routes of this replica: default/api (not written)" in warnings[0]
            assert "proxy.activator.lease_name" in warnings[0]
            assert ours(kube, "api") == []


@pytest.mark.parametrize(
    "annotation",
    [
        "[" * 100_000,  # parsed, it is nested deeper than Python's recursion limit
        "{not json",
        '{"web": "default/web"}',
    ],
)
async def test_a_lease_whose_routes_annotation_is_malformed_is_still_taken_over(
    kube: KubeStandIn, kube_client: KubeClient, annotation: str
) -> None:
    """Another installation, another version or a person wrote zeroscale.io/activator-routes (annotations may hold
    256 KiB): what it says is unknown, and the Lease is still timed and taken over as any other."""
    put_lease(kube, "proxy-gone", {"zeroscale.io/activator-routes": annotation})
    elector = LeaderElector(kube_client, config("proxy-a"), {"default/web": "default/web@0123456789ab"})
    elector.start()
    try:
        await until(lambda: elector.leading, within=5)
    finally:
        await elector.close()


def put_lease(kube: KubeStandIn, holder: str, annotations: dict[str, str] | None = None, seconds: int = 1) -> None:
    kube.put(
        lease_path("zeroscale"),
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "zeroscale-proxy-activator",
                "namespace": "zeroscale",
                "annotations": annotations or {},
            },
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds},
        },
    )


async def test_a_lease_nobody_holds_is_not_said_to_write_our_routes(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A Lease given up (holderIdentity "") that this replica cannot take (its Role lacks update on leases): nobody
    writes the routes, and zeroscale_proxy_activator_holder_serves must not say the holder does. Then another
    installation takes it: that is said, though the routes not written are the same."""
    put_lease(kube, "")
    forbidden = Reply(403, status_body(403, "Forbidden", 'cannot update resource "leases"'))
    kube.add_route("PUT", LEASES + "/[^/]+", lambda _request, _match: forbidden)
    elector = LeaderElector(kube_client, config("proxy-a"), {"default/quiet": "default/quiet@0123456789ab"})
    elector.start()
    try:
        await until(lambda: holder_serves("quiet") is not None, within=5)
        await asyncio.sleep(0.3)  # several reads and refused writes
        assert not elector.leading
        assert holder_serves("quiet") == 0
        put_lease(kube, "other-proxy", {"zeroscale.io/activator-routes": '["shop/api@0123456789ab"]'})
        said = "the holder other-proxy does not write routes of this replica: default/quiet (not written)"
        await until(lambda: any(said in record.getMessage() for record in caplog.records), within=5)
        assert holder_serves("quiet") == 0
    finally:
        await elector.close()


def test_installations_in_other_namespaces_never_share_a_default_lease() -> None:
    """Both namespace and Service names may hold a `-`: joined by one, a/zeroscale-proxy and a-zeroscale/proxy would
    both elect on Lease a-zeroscale-proxy-activator, and one installation's routes would go unwritten."""
    names = {
        ActivatorConfig.model_validate(
            activator_settings(lease_namespace="shared", proxy_service={"service": service, "namespace": namespace})
        ).lease()
        for namespace, service in [("a", "zeroscale-proxy"), ("a-zeroscale", "proxy"), ("shared", "a-zeroscale-proxy")]
    }
    assert len(names) == 3, names


async def test_a_holder_that_does_not_say_what_it_writes_is_said_once_and_not_counted(
    kube: KubeStandIn, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """An older proxy holding the Lease during a rollout: zeroscale_proxy_activator_holder_serves is absent (unknown),
    and the log says why, once."""
    caplog.set_level("INFO", logger="adapter.proxy.leader")
    put_lease(kube, "proxy-old", seconds=3600)  # renewed, as far as this replica can tell
    elector = LeaderElector(kube_client, config("proxy-a"), {"default/unsaid": "default/unsaid@0123456789ab"})
    elector.start()
    try:
        said = "the holder proxy-old does not say which routes it writes"
        await until(lambda: any(said in record.getMessage() for record in caplog.records), within=5)
        assert holder_serves("unsaid") is None
        await asyncio.sleep(0.3)  # several reads
        assert sum(said in record.getMessage() for record in caplog.records) == 1
    finally:
        await elector.close()
