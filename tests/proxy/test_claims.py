"""Host claims with header conditions (adapter/proxy/claims.py, docs/architecture.md#host-claims): a route's claim is
its host, prefix and match_headers within its namespace; a host still belongs to one namespace, whatever headers."""

from __future__ import annotations

from typing import Any

from adapter.config.proxy import RouteObjectsConfig
from adapter.config.route import RouteConfig
from adapter.proxy.claims import Candidate, place

POLICY = RouteObjectsConfig(namespaces=["team-a", "team-b"])


def candidate(namespace: str, name: str, month: int, **fields: Any) -> Candidate:
    config = RouteConfig.model_validate(
        {"name": name, "namespace": namespace, "hosts": ["shop.example"], "upstream": {"address": "10.0.0.1:80"}}
        | {"wake": "none", **fields}
    )
    return Candidate(config, f"2026-0{month}-01T00:00:00Z")


def test_routes_of_a_namespace_differing_only_in_match_headers_are_all_served_in_claim_order() -> None:
    served, refused = place(
        [
            candidate("team-a", "blue", 3, match_headers={"x-team": "blue"}),
            candidate("team-a", "stable", 1),
            candidate("team-a", "canary", 2, match_headers={"x-canary": "1"}),
        ],
        POLICY,
    )
    assert ([route.name for route in served], refused) == (["stable", "canary", "blue"], {})


def test_the_same_conditions_in_another_spelling_or_order_are_the_same_claim() -> None:
    first = {"X-Canary": "1", "x-team": "blue"}
    again = {"x-team": "blue ", "x-canary": "1"}  # names without case, values as field values
    _, refused = place(
        [candidate("team-a", "first", 1, match_headers=first), candidate("team-a", "again", 2, match_headers=again)],
        POLICY,
    )
    assert refused["team-a/again"].reason == "PathClaimed"
    assert "team-a/first" in refused["team-a/again"].message


def test_headers_do_not_share_a_host_across_namespaces() -> None:
    _, refused = place(
        [candidate("team-a", "stable", 1), candidate("team-b", "canary", 2, match_headers={"x-canary": "1"})],
        POLICY,
    )
    assert refused["team-b/canary"].reason == "HostClaimed"
