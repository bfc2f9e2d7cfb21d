"""A route's cold-start choices at run time (docs/architecture.md#cold-start-choices): its never-wake rules and its
waking page, prepared once per route version as answers the proxy gives itself, and the reading of each request
that may meet them.

Only a route with never-wake rules or a waking page has a `ColdChoices` (Route.choices); for every other route the
data plane looks at that one attribute and goes on as before.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

from adapter.config.cold import FixedResponse
from adapter.config.route import RouteConfig
from adapter.proxy.cold_rules import is_navigation, never_wake_rule, request_headers
from adapter.proxy.http1 import Fields

# Exchange.choice: what a request of a route with choices is. A rule's index (>= 0): it matched that never-wake rule;
# NAVIGATION: a browser navigation (the waking page is its answer while cold); None: neither, held as any request.
NAVIGATION = -1

# The default page runs nothing and loads nothing: the policy forbids every source but its own inline style.
_PAGE_POLICY = b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
_DEFAULT_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Waking up {route}</title>
<style>body{{font-family:sans-serif;max-width:36em;margin:4em auto;padding:0 1em;color:#222}}</style>
</head>
<body>
<h1>Waking up</h1>
<p><strong>{route}</strong> was asleep and is starting now. This page reloads itself every {refresh} seconds
and shows the application as soon as it is ready.</p>
</body>
</html>
"""


class OwnAnswer:
    """An answer of the proxy's own, built once: its status, fields (lower-case names, no framing) and body."""

    __slots__ = ("body", "fields", "status")

    def __init__(self, status: int, fields: Fields, body: bytes) -> None:
        self.status = status
        self.fields = fields
        self.body = body


def _encoded(headers: dict[str, str]) -> Fields:
    # Names and values were checked by the config (a token name; no control characters).
    return [(name.encode("ascii"), value.encode("latin-1")) for name, value in headers.items()]


def fixed_answer(response: FixedResponse) -> OwnAnswer:
    """A never-wake rule's response: its content type (one of a fixed few), its headers, its body."""
    fields = [(b"content-type", response.content_type.encode("ascii")), *_encoded(response.headers)]
    return OwnAnswer(response.status, fields, response.body.encode("utf-8"))


def page_answer(config: RouteConfig) -> OwnAnswer:
    """The route's waking page: its body (configured, or the default naming the route, HTML-escaped, and nothing a
    request carried), served as HTML with Retry-After and a restrictive Content-Security-Policy unless the
    configured headers give their own."""
    page = config.waking_page
    assert page is not None
    body = page.page_body() or _DEFAULT_PAGE.format(refresh=page.refresh, route=html.escape(config.key))
    fields: Fields = [(b"content-type", b"text/html; charset=utf-8")]
    own = {"retry-after": b"%d" % page.refresh, "content-security-policy": _PAGE_POLICY}
    fields += [(name.encode("ascii"), value) for name, value in own.items() if name not in page.headers]
    fields += _encoded(page.headers)
    return OwnAnswer(page.status, fields, body.encode("utf-8"))


class ColdChoices:
    """What a route with never-wake rules or a waking page answers itself, and how a request is read for them."""

    __slots__ = ("overflow_page", "page", "page_seconds", "rule_answers", "rules")

    def __init__(self, config: RouteConfig) -> None:
        self.rules = config.never_wake
        self.rule_answers = [fixed_answer(rule.response) for rule in self.rules]
        self.page = page_answer(config) if config.waking_page is not None else None
        self.page_seconds = config.waking_page.refresh if config.waking_page is not None else 0
        # overflow: waking_page: a navigation the full queue refuses gets the page, not the 503.
        self.overflow_page = config.overflow == "waking_page"

    @classmethod
    def of(cls, config: RouteConfig) -> ColdChoices | None:
        """The route's choices; None for a route without never-wake rules and waking page (it pays nothing)."""
        return cls(config) if config.never_wake or config.waking_page is not None else None

    def classify(self, method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int | None:
        """The request's choice (Exchange.choice): the never-wake rule it matches first, else NAVIGATION, else None."""
        fields = request_headers(headers)
        verb = method.decode("latin-1")
        if self.rules:
            rule = never_wake_rule(self.rules, verb, target.decode("latin-1"), fields)
            if rule is not None:
                return rule
        if self.page is not None and is_navigation(verb, fields):
            return NAVIGATION
        return None
