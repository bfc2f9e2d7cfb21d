"""`zeroscale proxy --route-for URL` (adapter/proxy/dry_run.py), run as a person runs it, on a config file: which
route takes a request and why, exit 0; none, exit 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
proxy:
  routes:
    - name: stable
      namespace: shop
      hosts: [shop.example]
      upstream: {address: "10.0.0.1:80"}
      wake: none
    - name: canary
      namespace: shop
      hosts: [shop.example]
      match_headers: {X-Canary: "1"}
      upstream: {service: web-canary, namespace: shop, port: http}
      wake: none
    - name: api
      hosts: ["*.example"]
      path_prefix: /api
      upstream: {address: "10.0.0.2:80"}
      wake: none
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(CONFIG)
    return path


def run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapter", "proxy", "--config", str(config), "--route-for", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def route_for(config: Path, *args: str) -> tuple[int, list[str]]:
    result = run(config, *args)
    assert result.stderr == ""
    return result.returncode, result.stdout.splitlines()


def test_a_request_with_the_header_goes_to_the_route_asking_for_it(config: Path) -> None:
    status, lines = route_for(config, "http://shop.example/cart", "--header", "x-CANARY: 1")
    assert status == 0
    assert lines == [
        "request: GET http://shop.example/cart",
        "  x-CANARY: 1",
        "host: shop.example meets shop.example (exact host), the most specific host any route claims",
        "routes of that host, longest path_prefix first, then more match_headers, then claim order:",
        "  shop/canary (path_prefix /, match_headers x-canary: 1): takes it",
        "route: shop/canary (upstream Service shop/web-canary)",
        "rule: none: while cold held up to 120s; forwarded when warm",
    ]


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([], "header x-canary is not sent"),
        (["-H", "X-Canary: 2"], "header x-canary is '2', not '1'"),
        (["-H", "X-Canary: 1", "-H", "x-canary: 1"], "header x-canary is sent 2 times"),
    ],
)
def test_without_the_header_the_plain_route_takes_it_and_the_output_says_why_the_other_did_not(
    config: Path, headers: list[str], why: str
) -> None:
    status, lines = route_for(config, "http://shop.example/cart", "--method", "POST", *headers)
    assert status == 0
    assert lines[0] == "request: POST http://shop.example/cart"
    assert lines[-4].startswith(f"  shop/canary (path_prefix /, match_headers x-canary: 1): {why}")
    assert lines[-3:-1] == ["  shop/stable (path_prefix /): takes it", "route: shop/stable (upstream 10.0.0.1:80)"]


def test_no_route_is_exit_1_with_the_404_and_why(config: Path) -> None:
    status, lines = route_for(config, "http://cart.example/basket")
    assert status == 1
    assert lines[-3:] == [
        "routes of that host, longest path_prefix first, then more match_headers, then claim order:",
        "  default/api (path_prefix /api): path /basket is not under its prefix",
        "route: none: the proxy answers 404 (no route for this host and path)",
    ]
    status, lines = route_for(config, "http://other.test/")
    assert (status, lines[-2:]) == (
        1,
        [
            "host: other.test meets no route's hosts",
            "route: none: the proxy answers 404 (no route for this host and path)",
        ],
    )


def test_a_request_the_proxy_refuses_before_routing_is_exit_1_with_its_answer(config: Path) -> None:
    status, lines = route_for(config, "/cart")
    assert status == 1
    assert (
        lines[-1] == "route: none: the proxy refuses the request itself (400: an HTTP/1.1 request needs a Host header)"
    )
    # A path with the Host given as a header is what a client sends.
    assert (
        route_for(config, "/api/x", "-H", "Host: cart.example:8080")[1][-2]
        == "route: default/api (upstream 10.0.0.2:80)"
    )


def test_equal_routes_go_by_claim_order_which_for_the_file_is_by_namespace_and_name(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    # The file lists zeta first; alpha is the older claim (file routes are placed by <namespace>/<name>).
    upstream = "upstream: {address: '10.0.0.1:80'}, wake: none"
    path.write_text(
        "proxy:\n  routes:\n"
        f"    - {{name: zeta, match_headers: {{x-a: '1'}}, {upstream}}}\n"
        f"    - {{name: alpha, match_headers: {{x-b: '1'}}, {upstream}}}\n"
    )
    status, lines = route_for(path, "http://any.example/", "-H", "x-a: 1", "-H", "x-b: 1")
    assert (status, lines[-2]) == (0, "route: default/alpha (upstream 10.0.0.1:80)")


def test_the_output_says_route_objects_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    activator = "{proxy_service: {service: zeroscale-proxy, namespace: zeroscale}, lease_namespace: zeroscale}"
    path.write_text(
        CONFIG.replace("proxy:\n", f"proxy:\n  activator: {activator}\n  route_objects: {{enabled: true}}\n")
    )
    status, lines = route_for(path, "http://shop.example/")
    assert status == 0
    assert lines[1].startswith("note: route objects (proxy.route_objects.enabled) are not read here")


def test_a_bad_url_or_header_is_a_usage_error(config: Path) -> None:
    for args in (["shop.example/cart"], ["http://shop.example/café"], ["/cart", "-H", "no colon"]):
        result = run(config, *args)
        assert result.returncode == 2
        assert "is not" in result.stderr.splitlines()[-1]


CHOICES = """
proxy:
  routes:
    - name: web
      namespace: shop
      hosts: [shop.example]
      upstream: {service: web, namespace: shop, port: http}
      target: {namespace: shop, name: web}
      also_wake: [{namespace: shop, name: api}]
      waking_page: {refresh: 3}
      fallback: {service: static, port: 8080, after: 20s}
      never_wake:
        - {path: /healthz, response: {status: 200, body: ok}}
        - {path: /robots.txt, when: always, response: {status: 200, body: "User-agent: *"}}
"""
CHROME = ["--header", "Accept: text/html,application/xhtml+xml,*/*;q=0.8", "--header", "Sec-Fetch-Mode: navigate"]


@pytest.mark.parametrize(
    ("path", "headers", "rule"),
    [
        (
            "/healthz",
            [],
            "rule: never_wake[0] (when: cold): while cold the proxy answers 200 itself and wakes nothing; "
            "forwarded when warm",
        ),
        (
            "/robots.txt",
            CHROME,
            "rule: never_wake[1] (when: always): the proxy answers 200 itself and wakes nothing, cold or warm "
            "(never forwarded)",
        ),
        (
            "/cart",
            CHROME,
            "rule: a browser navigation (waking_page): while cold the waking page (503, refresh 3s) at once while "
            "web + api wake; forwarded when warm",
        ),
        (
            "/cart",
            ["--header", "Accept: application/json"],
            "rule: none: while cold held up to 120s while web + api wake, sent to the fallback Service shop/static "
            "after 20s; forwarded when warm",
        ),
        # Sent twice, Sec-Fetch-Mode is no navigation (as for the proxy): held like a program's request.
        (
            "/cart",
            [*CHROME, "--header", "Sec-Fetch-Mode: navigate"],
            "rule: none: while cold held up to 120s while web + api wake, sent to the fallback Service shop/static "
            "after 20s; forwarded when warm",
        ),
    ],
)
def test_the_rule_line_says_what_the_route_does_cold_and_warm(
    tmp_path: Path, path: str, headers: list[str], rule: str
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text(CHOICES)
    code, lines = route_for(config, f"http://shop.example{path}", *headers)
    assert code == 0
    assert lines[-2:] == ["route: shop/web (upstream Service shop/web)", rule]
