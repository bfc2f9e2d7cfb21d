"""The router alone (adapter/proxy/routing.py): one precedence rule (docs/architecture.md#route-precedence) for hosts,
path prefixes and header conditions, what a header condition means, and the host cache."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NoReturn

from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.proxy import routing
from adapter.proxy.routing import Match, Router

CANARY = {"x-canary": "1"}


def router(*routes: tuple[str, Match]) -> Router[str]:
    """Routes by name, in claim order."""
    return Router((claim, name) for name, claim in routes)


def test_a_route_with_a_header_condition_takes_the_requests_that_carry_it_and_the_other_route_the_rest() -> None:
    # The plain route is the older claim: the condition still wins, whatever the order.
    routes = router(("plain", Match(["shop.example"])), ("canary", Match(["shop.example"], match_headers=CANARY)))
    assert routes.match(b"shop.example", b"/cart", [(b"x-canary", b"1")]) == "canary"
    assert routes.match(b"shop.example", b"/cart", []) == "plain"
    assert routes.match(b"shop.example", b"/cart", [(b"x-canary", b"2")]) == "plain"


def test_a_longer_prefix_without_headers_beats_a_shorter_prefix_with_them() -> None:
    routes = router(("short", Match(["*"], "/api", CANARY)), ("long", Match(["*"], "/api/v2")))
    assert routes.match(b"a.example", b"/api/v2/x", [(b"x-canary", b"1")]) == "long"
    assert routes.match(b"a.example", b"/api/v1", [(b"x-canary", b"1")]) == "short"


def test_an_exact_host_beats_a_wildcard_with_headers() -> None:
    routes = router(("wild", Match(["*.example"], match_headers=CANARY)), ("exact", Match(["shop.example"])))
    assert routes.match(b"shop.example", b"/", [(b"x-canary", b"1")]) == "exact"
    assert routes.match(b"cart.example", b"/", [(b"x-canary", b"1")]) == "wild"


def test_more_conditions_beat_fewer_and_equal_ones_go_by_claim_order() -> None:
    both = {"x-canary": "1", "x-team": "blue"}
    routes = router(
        ("one", Match(match_headers=CANARY)),
        ("two", Match(match_headers=both)),
        ("team", Match(match_headers={"x-team": "blue"})),
    )
    assert routes.match(b"a", b"/", [(b"x-team", b"blue"), (b"x-canary", b"1")]) == "two"
    assert routes.match(b"a", b"/", [(b"x-team", b"blue")]) == "team"
    # "one" and "team" both match with one condition each: the older claim takes it.
    assert routes.match(b"a", b"/", [(b"x-canary", b"1"), (b"x-team", b"green"), (b"x-team", b"blue")]) == "one"


def test_every_condition_must_hold() -> None:
    routes = router(("both", Match(match_headers={"x-canary": "1", "x-team": "blue"})))
    assert routes.match(b"a", b"/", [(b"x-canary", b"1"), (b"x-team", b"blue")]) == "both"
    assert routes.match(b"a", b"/", [(b"x-canary", b"1")]) is None


def test_header_names_are_compared_without_case_and_values_exactly() -> None:
    routes = router(("canary", Match(match_headers={"X-Canary": "On"})))
    for name in (b"x-canary", b"X-Canary", b"X-CANARY"):
        assert routes.match(b"a", b"/", [(name, b"On")]) == "canary"
    assert routes.match(b"a", b"/", [(b"x-canary", b"on")]) is None
    assert routes.match(b"a", b"/", [(b"x-canary", b"On2")]) is None
    # A field value's surrounding whitespace is not part of it (llhttp keeps the trailing one).
    assert routes.match(b"a", b"/", [(b"x-canary", b"On \t")]) == "canary"


def test_a_header_sent_twice_matches_no_condition_even_with_the_same_value_twice() -> None:
    routes = router(("plain", Match()), ("canary", Match(match_headers=CANARY)))
    assert routes.match(b"a", b"/", [(b"x-canary", b"1"), (b"X-Canary", b"1")]) == "plain"
    assert routes.match(b"a", b"/", [(b"x-canary", b"1"), (b"x-canary", b"2")]) == "plain"


def test_a_route_whose_headers_do_not_match_falls_through_to_a_shorter_prefix_of_its_host_rule_only() -> None:
    routes = router(
        ("api-canary", Match(["shop.example"], "/api", CANARY)),
        ("root", Match(["shop.example"], "/")),
        ("any", Match(["*"])),
    )
    assert routes.match(b"shop.example", b"/api", []) == "root"
    only_conditions = router(("canary", Match(["shop.example"], match_headers=CANARY)), ("any", Match(["*"])))
    # The exact host is the host rule met: a less specific host rule is never tried (the 404).
    assert only_conditions.match(b"shop.example", b"/", []) is None


class _Unread(Sequence[tuple[bytes, bytes]]):
    """Headers no one may look at."""

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        raise AssertionError("the headers were read")

    def __getitem__(self, index: int | slice) -> NoReturn:
        raise AssertionError("the headers were read")

    def __len__(self) -> int:
        raise AssertionError("the headers were read")


def test_without_header_conditions_the_headers_are_never_looked_at() -> None:
    routes = router(("api", Match(["*"], "/api")), ("root", Match(["*"])))
    unread = _Unread()
    assert routes.match(b"a", b"/api/x", unread) == "api"
    assert routes.match(b"a", b"/x", unread) == "root"


def test_the_host_cache_is_bounded_and_holds_nothing_a_request_s_headers_decide() -> None:
    routes = router(("plain", Match(["*"])), ("canary", Match(["*"], match_headers=CANARY)))
    for _ in range(2):  # the second time from the cache
        assert routes.match(b"a.example", b"/", [(b"x-canary", b"1")]) == "canary"
        assert routes.match(b"a.example", b"/", []) == "plain"
    hosts = [f"h{index}.example".encode() for index in range(routing._MAX_CACHED_HOSTS + 100)]
    for host in hosts:
        routes.match(host, b"/", [])
    assert len(routes._by_host) == routing._MAX_CACHED_HOSTS
    # Past the bound, hosts are looked up each time, and still right.
    assert routes.match(hosts[-1], b"/", [(b"x-canary", b"1")]) == "canary"
    assert routes.match(hosts[-1], b"/", []) == "plain"


def test_explain_names_the_host_rule_and_each_candidate_tried_up_to_the_one_taking_the_request() -> None:
    routes = router(
        ("canary", Match(["*.example"], "/", CANARY)),
        ("v2", Match(["*.example"], "/v2")),
        ("plain", Match(["*.example"])),
        ("late", Match(["*.example"], "/", {"x-late": "1"})),
    )
    rule, steps = routes.explain(b"Shop.Example:8080", b"/v1", [(b"x-canary", b"0")])
    assert rule == "*.example"
    assert [(step.value, step.prefix_matches, step.unmet, step.takes) for step in steps] == [
        ("v2", False, None, False),
        ("canary", True, (b"x-canary", 1, b"0"), False),
        ("late", True, (b"x-late", 0, b""), False),
        ("plain", True, None, True),
    ]
    assert routes.explain(b"other.test", b"/", []) == (None, [])


@settings(max_examples=300, deadline=None)
@given(
    claims=st.lists(
        st.tuples(
            st.sampled_from([["a.example"], ["*.example"], ["*"], ["a.example", "*"]]),
            st.sampled_from(["/", "/api", "/api/"]),
            st.sampled_from([{}, {"x-a": "1"}, {"x-a": "1", "x-b": "2"}, {"x-b": "2"}]),
        ),
        max_size=6,
    ),
    host=st.sampled_from([b"a.example", b"b.example", b"c.test", b""]),
    path=st.sampled_from([b"/", b"/api", b"/api/x", b"/apix", b"/api?q"]),
    headers=st.lists(st.tuples(st.sampled_from([b"x-a", b"X-A", b"x-b", b"x-c"]), st.sampled_from([b"1", b"2"]))),
)
def test_explain_and_match_agree(
    claims: list[tuple[list[str], str, dict[str, str]]], host: bytes, path: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    routes: Router[int] = Router(
        (Match(hosts, prefix, wanted), index) for index, (hosts, prefix, wanted) in enumerate(claims)
    )
    _, steps = routes.explain(host, path, headers)
    taken = steps[-1].value if steps and steps[-1].takes else None
    assert routes.match(host, path, headers) == taken
    if taken is not None:
        wanted = claims[taken][2]
        sent = [(name.lower().decode(), value.decode()) for name, value in headers]
        assert all(
            sent.count((name, value)) == 1 and [n for n, _ in sent].count(name) == 1 for name, value in wanted.items()
        )
