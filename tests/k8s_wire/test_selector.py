"""The Kubernetes label-selector grammar, as the HPA serializes it (docs/protocols.md#em-list-call)."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from adapter.k8s_wire.selector import Operator, SelectorError, _tokens, parse_selector


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("topic=orders", "topic=orders"),
        ("topic==orders", "topic=orders"),
        ("b=2,a=1", "a=1,b=2"),
        ("env!=prod", "env!=prod"),
        ("queue in (b, a)", "queue in (a,b)"),
        ("queue notin (x)", "queue!=x"),  # one spelling per meaning: a one-value set is an equality
        ("queue notin (y, x)", "queue notin (x,y)"),
        ("queue in (x)", "queue=x"),
        ("queue", "queue"),
        ("!queue", "!queue"),
        ("  group = g1 ,  !legacy ", "group=g1,!legacy"),
        ("app.kubernetes.io/name=web", "app.kubernetes.io/name=web"),
        ("replicas>3", "replicas>3"),
        ("key=", "key="),
    ],
)
def test_parses_every_operator_to_canonical_form(text: str, canonical: str) -> None:
    assert str(parse_selector(text)) == canonical


def test_go_query_encoding_decodes_to_the_same_selector() -> None:
    # url.Values.Encode(): spaces as +, '=' as %3D, ',' as %2C, '(' as %28.
    query = "labelSelector=queue+in+%28a%2Cb%29%2Ctopic%3Dorders"
    text = parse_qs(query)["labelSelector"][0]
    selector = parse_selector(text)
    assert selector.values_for("queue") == ("a", "b")
    assert selector.values_for("topic") == ("orders",)


@pytest.mark.parametrize(
    "text",
    ["a b", "a in x", "=b", "a=b,", "a=(", "a in (", "Bad_/x=1", "a=b=c", "a in (x y)", "a>b", ",", "a=-bad-"],
)
def test_malformed_selectors_are_refused_with_a_reason(text: str) -> None:
    with pytest.raises(SelectorError, match="unable to parse label selector"):
        parse_selector(text)


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a=1", {"a": "2"}, False),
        ("a=1", {}, False),
        ("a!=1", {}, True),
        ("a!=1", {"a": "1"}, False),
        ("a in (1,2)", {"a": "2"}, True),
        ("a notin (1,2)", {"a": "3"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("!a", {"b": "1"}, True),
        ("n>3", {"n": "4"}, True),
        ("n>3", {"n": "3"}, False),
        ("n<3", {"n": "x"}, False),
        ("a=1,b", {"a": "1"}, False),
    ],
)
def test_matching_follows_kubernetes_semantics(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_selector(text).matches(labels) is expected


def test_values_for_ignores_negative_requirements() -> None:
    selector = parse_selector("a!=1,b notin (2),c")
    assert selector.values_for("a") is None
    assert selector.values_for("b") is None
    assert [r.operator for r in selector.requirements] == [Operator.NOT_EQUALS, Operator.NOT_EQUALS, Operator.EXISTS]


@pytest.mark.parametrize(
    ("spellings", "canonical"),
    [
        (
            ["queue=a,topic=b", "topic=b,queue=a", " topic == b , queue==a ", "queue in (a),topic in (b,b)"],
            "queue=a,topic=b",
        ),
        (["queue in (a,b)", "queue in (b,a,b)", "queue in ( b , a )"], "queue in (a,b)"),
        (["n>5", "n>+5", "n>05", "n>3,n>5"], "n>5"),
        (["queue in (a,b),queue in (b,c)", "queue in (a,b,c),queue=b", "queue in (a,b),queue!=a"], "queue=b"),
        (["queue,queue=a", "queue=a,queue!=b", "queue=a,queue=a"], "queue=a"),
        (["n>1,n<5,n", "n<5,n>1"], "n>1,n<5"),
        (["!queue,queue!=a", "!queue"], "!queue"),
    ],
)
def test_equivalent_spellings_have_one_canonical_form(spellings: list[str], canonical: str) -> None:
    """Issue 12 item 3: each spelling became its own cached series; equivalent ones now share one."""
    assert {str(parse_selector(text)) for text in spellings} == {canonical}


@pytest.mark.parametrize(
    "text",
    [
        "queue in (a,b),queue=c",  # issue 12 item 13: this read `c` alone
        "queue=a,queue=b",
        "queue=a,queue notin (a)",
        "queue=a,!queue",
        "queue,!queue",
        "n>5,n<6",
        "n>5,!n",
        "n=x,n>1",
        "n=3,n>5",
    ],
)
def test_requirements_are_anded_and_an_unsatisfiable_selector_is_refused(text: str) -> None:
    with pytest.raises(SelectorError, match="can never all hold: the selector matches nothing"):
        parse_selector(text)


def test_and_of_value_sets_is_their_intersection() -> None:
    selector = parse_selector("queue in (a,b,c),queue in (b,c,d),queue!=c")
    assert selector.values_for("queue") == ("b",)
    assert selector.matches({"queue": "b"})
    assert not selector.matches({"queue": "c"})


@pytest.mark.parametrize("bound", ["9223372036854775808", "-9223372036854775809", "1e3", "0x10", "5.0"])
def test_comparison_operands_are_64_bit_integers(bound: str) -> None:
    with pytest.raises(SelectorError, match="must be a 64-bit integer"):
        parse_selector(f"n>{bound}")


def test_at_most_32_requirements_and_the_message_names_their_keys() -> None:
    """Review finding 4: 1,400 `!=` requirements (15 KB) took 55 ms of the event loop to parse and normalise."""
    assert len(parse_selector(",".join(f"queue!=q{n}" for n in range(32))).requirements) == 1
    with pytest.raises(SelectorError, match=r"more than 32 requirements \(on queue\)"):
        parse_selector(",".join(f"queue!=q{n}" for n in range(1400)))


def test_at_most_256_values_in_a_set_and_the_message_names_the_key() -> None:
    """Review finding 4: a 16 KB `in (...)` set took 27 ms."""
    assert len(parse_selector("queue in (" + ",".join(f"q{n}" for n in range(256)) + ")").requirements[0].values) == 256
    with pytest.raises(SelectorError, match=r"the value set of 'queue' has more than 256 values"):
        parse_selector("queue in (" + ",".join(f"q{n}" for n in range(4000)) + ")")


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("a==b,c!=d", ["a", "==", "b", ",", "c", "!=", "d"]),
        (" !x , y in ( 1 ,2 ) ", ["!", "x", ",", "y", "in", "(", "1", ",", "2", ")"]),
        ("k>5,k<9\t", ["k", ">", "5", ",", "k", "<", "9"]),
        ("a=!=b", ["a", "=", "!=", "b"]),
        ("a!b", ["a", "!", "b"]),
    ],
)
def test_tokens_split_where_the_grammar_says(text: str, tokens: list[str]) -> None:
    assert _tokens(text) == tokens
