"""The rules that decide which cold-start choice a request meets, as pure functions (docs/architecture.md#waking-page,
docs/architecture.md#cold-start-choices): what browsers send, what programs send, and the edges between."""

from __future__ import annotations

import pytest

from adapter.config.cold import NeverWakeRule
from adapter.config.route_object import RouteSpec
from adapter.proxy.choices import NAVIGATION, ColdChoices
from adapter.proxy.cold_rules import SENT_MORE_THAN_ONCE, is_navigation, never_wake_rule, request_headers

CHROME = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,"
    "application/signed-exchange;v=b3;q=0.7"
)
FIREFOX = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize(
    "headers",
    [
        {"accept": CHROME, "sec-fetch-mode": "navigate"},
        {"accept": FIREFOX},  # an older browser: no Sec-Fetch-Mode
        {"accept": "text/html"},
        {"accept": "TEXT/HTML; q=1"},
        {"accept": "text/html;q=0.5, application/json;q=0.5"},  # a tie: not below
    ],
)
def test_a_browser_opening_a_page_is_a_navigation(headers: dict[str, str]) -> None:
    assert is_navigation("GET", headers)


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("GET", {"accept": "application/json"}),
        ("GET", {"accept": "*/*"}),  # curl: HTML only through a wildcard
        ("GET", {"accept": "text/*"}),
        ("GET", {}),
        ("GET", {"accept": "application/json, text/html;q=0.9"}),  # HTML below another type
        ("GET", {"accept": "text/html;q=0"}),  # not acceptable at all
        ("GET", {"accept": "text/html;q=2"}),  # a malformed q: the element is left out
        ("GET", {"accept": CHROME, "sec-fetch-mode": "cors"}),  # a page's fetch() asking for HTML
        ("GET", {"accept": CHROME, "sec-fetch-mode": "no-cors"}),
        ("POST", {"accept": CHROME, "sec-fetch-mode": "navigate"}),  # a form posted: a program's request to hold
        ("HEAD", {"accept": CHROME}),
    ],
)
def test_everything_else_is_not(method: str, headers: dict[str, str]) -> None:
    assert not is_navigation(method, headers)


def rule(**fields: object) -> NeverWakeRule:
    return NeverWakeRule.model_validate(fields)


def test_the_first_matching_rule_decides() -> None:
    rules = [rule(path="/healthz", methods=["GET"]), rule(path_prefix="/"), rule(path="/healthz")]
    assert never_wake_rule(rules, "GET", "/healthz", {}) == 0
    assert never_wake_rule(rules, "POST", "/healthz", {}) == 1


def test_an_exact_path_is_compared_without_the_query() -> None:
    rules = [rule(path="/robots.txt")]
    assert never_wake_rule(rules, "GET", "/robots.txt?x=1", {}) == 0
    assert never_wake_rule(rules, "GET", "/robots.txt/", {}) is None
    assert never_wake_rule(rules, "GET", "/robots.txtx", {}) is None


@pytest.mark.parametrize(("path", "matched"), [("/health", True), ("/health/live", True), ("/healthz", False)])
def test_a_prefix_ends_at_a_slash(path: str, matched: bool) -> None:
    assert (never_wake_rule([rule(path_prefix="/health")], "GET", path, {}) == 0) is matched


def test_a_prefix_ending_in_a_slash_takes_what_is_under_it() -> None:
    rules = [rule(path_prefix="/static/")]
    assert never_wake_rule(rules, "GET", "/static/app.js", {}) == 0
    assert never_wake_rule(rules, "GET", "/static", {}) is None


@pytest.mark.parametrize("path", ["/%61dmin", "//admin", "/./admin", "/x/../admin", "/%2e%2E/admin/", "/admin/./x"])
def test_a_path_is_compared_as_an_upstream_reads_it(path: str) -> None:
    """Decoded once and cleaned: a `when: always` rule is not passed by spelling its path another way."""
    assert never_wake_rule([rule(path_prefix="/admin")], "GET", path, {}) == 0


def test_a_cleaned_path_keeps_its_trailing_slash_and_a_star_is_no_path() -> None:
    assert never_wake_rule([rule(path="/robots.txt")], "GET", "/x/../robots.txt/", {}) is None
    assert never_wake_rule([rule(path_prefix="/static/")], "GET", "/static/./", {}) == 0
    assert never_wake_rule([rule(path_prefix="/")], "OPTIONS", "*", {}) is None


def test_a_rule_s_path_beyond_latin_1_is_compared_as_utf_8() -> None:
    """As a route's path_prefix: a client sends the UTF-8 bytes, raw or percent-encoded (read here as Latin-1)."""
    rules = [rule(path_prefix="/caf\u00e9/\u20ac")]
    assert never_wake_rule(rules, "GET", "/caf%C3%A9/%E2%82%AC/x", {}) == 0
    assert never_wake_rule(rules, "GET", "/café/€".encode().decode("latin-1"), {}) == 0
    assert never_wake_rule(rules, "GET", "/other", {}) is None


def test_every_header_must_have_exactly_its_value() -> None:
    rules = [rule(path="/", headers={"User-Agent": "ELB-HealthChecker/2.0", "X-Check": "1"})]
    both = {"user-agent": "ELB-HealthChecker/2.0", "x-check": "1"}
    assert never_wake_rule(rules, "GET", "/", both) == 0
    assert never_wake_rule(rules, "GET", "/", {**both, "x-check": "10"}) is None
    assert never_wake_rule(rules, "GET", "/", {"user-agent": "ELB-HealthChecker/2.0"}) is None


def test_methods_are_any_when_not_given() -> None:
    assert never_wake_rule([rule(path="/x")], "DELETE", "/x", {}) == 0
    assert never_wake_rule([rule(path="/x", methods=["GET", "HEAD"])], "DELETE", "/x", {}) is None


def test_request_headers_are_read_lowered_and_trimmed_and_a_repeated_one_meets_no_condition() -> None:
    read = request_headers([(b"Accept", b" text/html "), (b"X-A", b"1"), (b"x-a", b"1"), (b"X-Raw", b"\xe9")])
    assert read == {"accept": "text/html", "x-a": SENT_MORE_THAN_ONCE, "x-raw": "\xe9"}
    assert never_wake_rule([rule(path="/", headers={"x-a": "1"})], "GET", "/", read) is None
    assert never_wake_rule([rule(path="/", headers={"x-a": "1"})], "GET", "/", {"x-a": "1"}) == 0


def test_a_repeated_sec_fetch_mode_or_accept_is_no_navigation() -> None:
    chrome = [(b"Accept", b"text/html,*/*;q=0.8"), (b"Sec-Fetch-Mode", b"navigate")]
    assert is_navigation("GET", request_headers(chrome))
    assert not is_navigation("GET", request_headers([*chrome, (b"Sec-Fetch-Mode", b"navigate")]))
    assert not is_navigation("GET", request_headers([*chrome, (b"accept", b"text/html")]))


def test_a_route_object_s_inline_page_and_rules_are_its_answers() -> None:
    spec = RouteSpec.model_validate(
        {
            "hosts": ["app.example"],
            "upstream": {"service": "web", "port": "http"},
            "wake": "hpa",
            "waking_page": {"body": "<p>soon</p>", "status": 200, "headers": {"X-Team": "web"}},
            "never_wake": [{"path": "/healthz", "response": {"body": "ok"}}],
        }
    )
    choices = ColdChoices.of(spec.route_config("team", "web"))
    assert choices is not None
    assert choices.page is not None
    assert (choices.page.status, choices.page.body) == (200, b"<p>soon</p>")
    assert (b"x-team", b"web") in choices.page.fields
    assert choices.rule_answers[0].body == b"ok"
    assert choices.classify(b"GET", b"/healthz?x", [(b"Accept", b"text/html")]) == 0
    assert choices.classify(b"GET", b"/", [(b"Accept", b"text/html")]) == NAVIGATION
    assert choices.classify(b"GET", b"/", [(b"Accept", b"application/json")]) is None


def test_a_route_without_choices_has_none() -> None:
    spec = RouteSpec.model_validate({"hosts": ["app.example"], "upstream": {"service": "web"}, "wake": "hpa"})
    assert ColdChoices.of(spec.route_config("team", "web")) is None
