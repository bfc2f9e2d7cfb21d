"""Which cold-start choice a request meets, as pure functions of the request (no sockets, no route state): the
never-wake rule it matches, and whether it is a browser navigation (docs/architecture.md#waking-page).

The proxy calls them for routes that have such options, and `zeroscale proxy --route-for URL` (a dry run) calls them
to tell which rule a request would meet. Whether the route is warm decides the rest (choices.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from urllib.parse import unquote_to_bytes

from adapter.config.cold import NeverWakeRule
from adapter.proxy.routing import at_boundary

# RFC 9110 12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"^(?:0(?:\.\d{0,3})?|1(?:\.0{0,3})?)$")
_OWS = " \t"


# What a header sent more than once reads as: a value no rule can name (the config refuses control characters).
SENT_MORE_THAN_ONCE = "\x00"


def request_headers(pairs: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A request's headers as the rules read them: names lower-cased, values trimmed, bytes read as Latin-1 (any byte
    a client sent is kept and compared). A header sent more than once meets no condition, as in routing
    (routing.unmet): a list of values is not the one value a rule names, and a proxy before this one may have joined
    or split it; so it reads as SENT_MORE_THAN_ONCE (and a repeated Sec-Fetch-Mode or Accept is no navigation)."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in pairs:
        name = raw_name.decode("latin-1").lower()
        headers[name] = SENT_MORE_THAN_ONCE if name in headers else raw_value.decode("latin-1").strip(_OWS)
    return headers


def path_of(target: str) -> str:
    """The path of a request target (origin form): without its query."""
    return target.split("?", 1)[0]


def rule_path(path: bytes) -> bytes:
    """A path as a never-wake rule compares it (the request's and the rule's own alike): percent-decoded once, without
    `.` and `..` segments and repeated slashes, a trailing slash kept. An upstream reads `/%61dmin`, `//admin` or
    `/x/../admin` as `/admin` (servers decode and clean a path before routing it): spelled so, a request would
    pass a `when: always` rule and reach it. Rule paths are compared as UTF-8 bytes, as a route's path_prefix."""
    if not path.startswith(b"/"):
        return path  # `*` (OPTIONS): no path to clean
    decoded = unquote_to_bytes(path)
    segments: list[bytes] = []
    for segment in decoded.split(b"/"):
        if segment == b"..":
            if segments:
                segments.pop()
        elif segment not in (b"", b"."):
            segments.append(segment)
    last = decoded.rsplit(b"/", 1)[-1]
    trailing = b"/" if segments and last in (b"", b".", b"..") else b""
    return b"/" + b"/".join(segments) + trailing


@lru_cache(maxsize=4096)
def _configured(path: str) -> bytes:
    """A rule's own path as rule_path reads it (once per path, not once per request)."""
    return rule_path(path.encode())


def _path_matches(rule: NeverWakeRule, path: bytes) -> bool:
    if rule.path:
        return path == _configured(rule.path)
    # At a `/` boundary, as a route's path_prefix: /health takes /health and /health/x, not /healthz.
    return at_boundary(_configured(rule.path_prefix), path)


def never_wake_rule(rules: Sequence[NeverWakeRule], method: str, path: str, headers: Mapping[str, str]) -> int | None:
    """The index of the first rule a request matches (its path without the query, as rule_path reads it; its method;
    every header the rule names with exactly that value, `headers` as request_headers gives them), or None. `path`:
    the target's bytes read as Latin-1."""
    compared = rule_path(path_of(path).encode("latin-1"))
    for index, rule in enumerate(rules):
        if (
            _path_matches(rule, compared)
            and (not rule.methods or method in rule.methods)
            and all(headers.get(name) == value for name, value in rule.headers.items())
        ):
            return index
    return None


def _media_ranges(accept: str) -> Iterable[tuple[str, float]]:
    """(media range lower-cased, q) of each element of an Accept value; an element with a malformed q is left out."""
    for element in accept.split(","):
        media, *parameters = element.split(";")
        media = media.strip(_OWS).lower()
        if not media:
            continue
        q = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip(_OWS).lower() == "q":
                value = value.strip(_OWS)
                q = float(value) if _QVALUE.match(value) else -1.0
        if q >= 0:
            yield media, q


def is_navigation(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request is a browser opening a page (docs/architecture.md#waking-page): a GET whose Accept names
    text/html itself (not through */* or text/*) with a q above 0 and not below any other type it names, and whose
    Sec-Fetch-Mode, when sent, is `navigate` (a page's own fetch() asking for HTML is not a person waiting)."""
    if method != "GET":
        return False
    mode = headers.get("sec-fetch-mode")
    if mode is not None and mode.lower() != "navigate":
        return False
    html = 0.0
    highest = 0.0
    for media, q in _media_ranges(headers.get("accept", "")):
        if media == "text/html":
            html = max(html, q)
        highest = max(highest, q)
    return html > 0 and html >= highest
