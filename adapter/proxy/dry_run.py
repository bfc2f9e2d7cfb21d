"""`zeroscale proxy --route-for URL`: which route of the config file takes a request, and why, without serving
anything (docs/architecture.md#route-precedence).

The request is read by the HTTP/1.1 client end's own policy (`read_request_head`: the Host, an absolute-form target's
authority) and routed by the proxy's own router over the config file's routes in their claim order (`claims.place`),
so the answer is the proxy's. Route objects are not read: that would need the cluster, and the file's routes are the
platform's, older than any object (a note says so when `proxy.route_objects.enabled`). Exit status: 0 when a route
takes the request, 1 when none does (the proxy's 404, or its refusal of the request itself), 2 for a bad config.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass

from adapter.config.proxy import ProxyConfig
from adapter.config.route import AddressUpstream, RouteConfig
from adapter.proxy.claims import Candidate, place
from adapter.proxy.cold_rules import is_navigation, never_wake_rule, request_headers
from adapter.proxy.headers import MessageRefused, read_request_head
from adapter.proxy.routing import Conditions, Router, Step

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ABSOLUTE = ("http://", "https://")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The dry run's options of `zeroscale proxy`."""
    parser.add_argument(
        "--route-for",
        metavar="URL",
        type=_target,
        default=None,
        help="do not serve: print which route of the config file takes a request for URL (http://host/path, or "
        "/path with --header 'Host: ...') and why; exit 0 when one does, 1 when none does (the proxy's 404)",
    )
    parser.add_argument(
        "--header",
        "-H",
        metavar="'NAME: VALUE'",
        type=_header,
        action="append",
        default=[],
        help="a request header of the dry run (repeat for more; twice the same name is sent twice)",
    )
    parser.add_argument("--method", type=_method, default="GET", help="the dry run's request method (default: GET)")


def _target(text: str) -> str:
    if not text.startswith("/") and not text.lower().startswith(_ABSOLUTE):
        raise argparse.ArgumentTypeError(f"{text} is not http://host/path, https://host/path or /path")
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{text} is not ASCII: percent-encode it, as a client sends it")
    return text


def _header(text: str) -> tuple[bytes, bytes]:
    name, colon, value = text.partition(":")
    if not colon or _TOKEN.match(name) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a header: give 'Name: value'")
    return name.encode("latin-1"), value.strip(" \t").encode("latin-1")


def _method(text: str) -> str:
    if _TOKEN.match(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a request method")
    return text


@dataclass(frozen=True)
class Verdict:
    """The route taking the request (None: none does) and the lines a person reads, in order."""

    route: RouteConfig | None
    lines: list[str]


def route_for(config: ProxyConfig, method: str, target: str, headers: Sequence[tuple[bytes, bytes]]) -> Verdict:
    """Which route of `config`'s file takes `method target` with `headers`, and why."""
    lines = [f"request: {method} {target}", *(f"  {_text(name)}: {_text(value)}" for name, value in headers)]
    if config.route_objects.enabled:
        lines.append(
            "note: route objects (proxy.route_objects.enabled) are not read here: an object's claim comes after these "
            "routes and may take a host none of them claims, or an exact host under one of their wildcards"
        )
    sent = list(headers)
    if target.lower().startswith(_ABSOLUTE) and not any(name.lower() == b"host" for name, _ in sent):
        sent.append((b"host", target.split("/", 3)[2].encode("latin-1")))  # the client writes it; the target wins
    try:
        head = read_request_head(method.encode("latin-1"), "1.1", target.encode("latin-1"), sent)
    except MessageRefused as refused:
        lines.append(f"route: none: the proxy refuses the request itself ({refused.code}: {refused.message})")
        return Verdict(None, lines)
    host, path = head[1] or b"", head[2]
    shown = _text(host) or "(none)"
    served, _ = place([Candidate(route) for route in config.effective_routes()], config.route_objects)
    rule, steps = Router((route, route) for route in served).explain(host, path, sent)
    if rule is None:
        lines.append(f"host: {shown} meets no route's hosts")
    else:
        kind = "any host" if rule == "*" else "wildcard" if rule.startswith("*.") else "exact host"
        lines.append(f"host: {shown} meets {rule} ({kind}), the most specific host any route claims")
        lines.append("routes of that host, longest path_prefix first, then more match_headers, then claim order:")
        lines += [f"  {_step(step, path)}" for step in steps]
    route = steps[-1].value if steps and steps[-1].takes else None
    if route is None:
        lines.append("route: none: the proxy answers 404 (no route for this host and path)")
    else:
        lines.append(f"route: {route.key} (upstream {_upstream(route)})")
        lines.append(f"rule: {_rule(route, method, path.decode('latin-1'), sent)}")
    return Verdict(route, lines)


def _rule(route: RouteConfig, method: str, path: str, sent: Sequence[tuple[bytes, bytes]]) -> str:
    """What the route does with the request, cold and warm (docs/architecture.md#cold-start-choices)."""
    headers = request_headers(sent)
    index = never_wake_rule(route.never_wake, method, path, headers)
    if index is not None:
        rule = route.never_wake[index]
        answer = f"the proxy answers {rule.response.status} itself and wakes nothing"
        if rule.when == "always":
            return f"never_wake[{index}] (when: always): {answer}, cold or warm (never forwarded)"
        return f"never_wake[{index}] (when: cold): while cold {answer}; forwarded when warm"
    if route.waking_page is not None and is_navigation(method, headers):
        page = route.waking_page
        return (
            f"a browser navigation (waking_page): while cold the waking page ({page.status}, refresh {page.refresh}s) "
            f"at once{_waking(route)}; forwarded when warm"
        )
    held = f"held up to {route.limits.hold_timeout:g}s{_waking(route)}"
    if route.fallback is not None:
        fallback = f"{route.home}/{route.fallback.service}"
        held += f", sent to the fallback Service {fallback} after {route.fallback.after:g}s"
    return f"none: while cold {held}; forwarded when warm"


def _waking(route: RouteConfig) -> str:
    """What wakes while a request of the route waits: its target and also_wake (wake: scale/always), its HPA."""
    if route.wake == "hpa":
        return " while its HPA wakes the workload"
    if route.target is None or route.wake == "none":
        return ""
    names = [route.target.name, *(extra.name for extra in route.also_wake)]
    return f" while {' + '.join(names)} {'wakes' if len(names) == 1 else 'wake'}"


def _step(step: Step[RouteConfig], path: bytes) -> str:
    claim = f"{step.value.key} (path_prefix {_text(step.prefix)}{_conditions(step.conditions)})"
    if not step.prefix_matches:
        return f"{claim}: path {_text(path)} is not under its prefix"
    if step.unmet is not None:
        name, times, value = step.unmet
        wanted = _text(dict(step.conditions)[name])
        if times == 0:
            return f"{claim}: header {_text(name)} is not sent"
        if times > 1:
            return f"{claim}: header {_text(name)} is sent {times} times (a condition is met by one value sent once)"
        return f"{claim}: header {_text(name)} is {_text(value)!r}, not {wanted!r}"
    return f"{claim}: takes it"


def _conditions(conditions: Conditions) -> str:
    if not conditions:
        return ""
    return ", match_headers " + ", ".join(f"{_text(name)}: {_text(value)}" for name, value in conditions)


def _upstream(route: RouteConfig) -> str:
    upstream = route.upstream
    if isinstance(upstream, AddressUpstream):
        return upstream.address
    return f"Service {upstream.namespace}/{upstream.service}"


def _text(value: bytes) -> str:
    return value.decode("latin-1")


def run(config: ProxyConfig, args: argparse.Namespace) -> int:
    """Print the verdict for the request the options describe; 0 when a route takes it, 1 when none does."""
    verdict = route_for(config, args.method, args.route_for, args.header)
    print("\n".join(verdict.lines))
    return 0 if verdict.route is not None else 1
