"""The slices the activator writes (adapter/kube/endpointslices.py): what is copied from the pods' slices, how it is
cut into slices, and what counts as already written."""

from __future__ import annotations

import copy
from typing import Any

from adapter.kube.endpointslices import MANAGED_BY, build_slices, endpoints_by_port, same_slice

OWNER = {"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-1"}


def pods_slice(name: str, ports: list[tuple[str, int]], endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "web-pods"}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": number, "protocol": "TCP"} for port_name, number in ports],
        "endpoints": endpoints,
    }


def endpoint(address: str, **conditions: bool) -> dict[str, Any]:
    return {"addresses": [address], "conditions": conditions}


def test_endpoints_by_port_groups_by_the_number_behind_the_port_and_keeps_only_what_a_slice_carries() -> None:
    full = {
        **endpoint("10.0.0.1", ready=True),
        "nodeName": "node-a",
        "zone": "z1",
        "targetRef": {"kind": "Pod", "name": "web-1"},
        "deprecatedTopology": {"x": "y"},
    }
    slices = [
        pods_slice("a", [("http", 8080), ("metrics", 9090)], [full, {"addresses": [], "conditions": {}}]),
        # A rollout that changed the targetPort: the new pods' slice has another number behind "http".
        pods_slice("b", [("http", 8081)], [endpoint("10.0.0.2")]),
        pods_slice("c", [("grpc", 7070)], [endpoint("10.0.0.3")]),
        pods_slice("d", [("http", 8082)], []),
    ]
    groups = endpoints_by_port(slices, "http")
    assert sorted(groups) == [8080, 8081], "a port with no endpoint is no group"
    assert groups[8080] == [
        {
            "addresses": ["10.0.0.1"],
            "conditions": {"ready": True},
            "nodeName": "node-a",
            "zone": "z1",
            "targetRef": {"kind": "Pod", "name": "web-1"},
        }
    ], "the endpoint without an address is skipped; deprecatedTopology is not copied"
    assert groups[8081] == [endpoint("10.0.0.2")]
    assert endpoints_by_port(slices, 9090) == {9090: [groups[8080][0]]}, "a port number matches that number"
    assert endpoints_by_port(slices, "") == {}, "the unnamed port is a name too: no slice has one"


def test_build_slices_labels_owns_names_and_cuts_at_the_per_slice_limit() -> None:
    groups = {8080: [endpoint(f"10.0.0.{n}") for n in (3, 1, 2)], 8081: [endpoint("10.0.1.1")]}
    slices = build_slices("default", "web", "web-route", OWNER, "http", groups, per_slice=2)
    assert list(slices) == ["web-zeroscale-0", "web-zeroscale-1", "web-zeroscale-2"]
    first = slices["web-zeroscale-0"]
    assert first["metadata"] == {
        "name": "web-zeroscale-0",
        "namespace": "default",
        "labels": {
            "kubernetes.io/service-name": "web",
            "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            "zeroscale.io/route": "web-route",
        },
        "ownerReferences": [OWNER],
    }
    assert first["addressType"] == "IPv4"
    assert first["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert [e["addresses"] for e in first["endpoints"]] == [["10.0.0.1"], ["10.0.0.2"]], "sorted, then cut"
    assert [e["addresses"] for e in slices["web-zeroscale-1"]["endpoints"]] == [["10.0.0.3"]]
    assert slices["web-zeroscale-2"]["ports"] == [{"name": "http", "port": 8081, "protocol": "TCP"}]


def test_nothing_to_list_is_one_empty_slice_without_ports() -> None:
    """Kubernetes then has an empty slice for the Service: kube-proxy refuses at once instead of timing out."""
    slices = build_slices("default", "web", "r", None, "http", {}, per_slice=100)
    assert list(slices) == ["web-zeroscale-0"]
    assert slices["web-zeroscale-0"]["endpoints"] == []
    assert slices["web-zeroscale-0"]["ports"] == []
    assert "ownerReferences" not in slices["web-zeroscale-0"]["metadata"]


def test_a_dual_stack_group_is_written_as_one_slice_per_address_family() -> None:
    """The API refuses a slice whose addresses are not of its addressType, and a dual-stack Service's pods come
    in two slices (one per family) with the same port: one group, two families, two slices."""
    groups = {8080: [endpoint("fd00::2"), endpoint("10.0.0.1"), endpoint("fd00::1")]}
    slices = build_slices("default", "web", "r", None, "http", groups, per_slice=100)
    by_type = {body["addressType"]: [e["addresses"][0] for e in body["endpoints"]] for body in slices.values()}
    assert by_type == {"IPv4": ["10.0.0.1"], "IPv6": ["fd00::1", "fd00::2"]}


def written(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as the API reads it back: its metadata filled in by the server."""
    copied = copy.deepcopy(body)
    copied["metadata"].update({"resourceVersion": "17", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z"})
    return copied


def test_same_slice_ignores_what_the_server_adds_and_sees_every_change_that_routes_differently() -> None:
    groups = {8080: [endpoint("10.0.0.1", ready=True), endpoint("10.0.0.2")]}
    wanted = build_slices("default", "web", "r", OWNER, "http", groups, per_slice=100)["web-zeroscale-0"]
    assert same_slice(written(wanted), wanted)
    defaults = written(wanted)
    # Conditions the server reads back filled in, as the API defaults them: ready nil is true, serving follows.
    defaults["endpoints"][1]["conditions"] = {"ready": True, "serving": True, "terminating": False}
    assert same_slice(defaults, wanted)

    def changed(change: Any) -> dict[str, Any]:
        body = written(wanted)
        change(body)
        return body

    assert not same_slice(changed(lambda b: b["endpoints"].pop()), wanted)
    assert not same_slice(changed(lambda b: b["endpoints"][0].update(addresses=["10.0.0.9"])), wanted)
    assert not same_slice(changed(lambda b: b["endpoints"][0]["conditions"].update(ready=False)), wanted)
    assert not same_slice(changed(lambda b: b["endpoints"][0]["conditions"].update(terminating=True)), wanted)
    assert not same_slice(changed(lambda b: b["ports"][0].update(port=9090)), wanted)
    assert not same_slice(changed(lambda b: b["ports"][0].update(name="web")), wanted)
    assert not same_slice(changed(lambda b: b["metadata"]["labels"].pop("zeroscale.io/route")), wanted)
    assert not same_slice(changed(lambda b: b.update(addressType="IPv6")), wanted)
    # Owned by a Service of that name deleted since: the garbage collector's to delete.
    assert not same_slice(changed(lambda b: b["metadata"]["ownerReferences"][0].update(uid="svc-0")), wanted)
