"""The Kubernetes label-selector grammar, as the HPA serializes it (SPEC 1.2)."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from adapter.metrics.selector import Operator, SelectorError, parse_selector


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("", ""),
        ("topic=orders", "topic=orders"),
        ("topic==orders", "topic=orders"),
        ("b=2,a=1", "a=1,b=2"),
        ("env!=prod", "env!=prod"),
        ("queue in (b, a)", "queue in (a,b)"),
        ("queue notin (x)", "queue notin (x)"),
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
    assert [r.operator for r in selector.requirements] == [Operator.NOT_EQUALS, Operator.NOT_IN, Operator.EXISTS]
