"""What a route does with a request besides holding it: the waking page for people, the paths that never wake, the
fallback Service, and what a full queue does. Each is a route option a person can read in the route
(docs/architecture.md#cold-start-choices); a route without them holds every request, as before.

Everything here is bounded: a route object is a tenant's input to a shared proxy, which keeps every route it reads.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from adapter.config.base import Duration, Strict

# A header name as RFC 9110 spells a token, lowered (HTTP/2 sends names lower case; HTTP/1.1 is compared lowered).
# Both are checked with fullmatch: `$` also matches before a trailing newline, which would let "x\n" through.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]{1,256}")
# A field value without control characters (no CR/LF: a configured value is never a way to split a response).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]{0,4096}")
# Statuses whose responses never have content (RFC 9110 15.3.5, 15.3.6, 15.4.5): a client reads no body after their
# head, so bytes written there would be read as the next response on the connection (a forged answer to whoever sends
# the next request on it: a proxy in front pools its connections across hosts). The proxy's writer (http1.py) never
# writes one either.
NO_CONTENT = frozenset({204, 205, 304})
MAX_HEADERS = 16
MAX_BODY_BYTES = 64 * 1024
# Response headers the proxy writes itself (framing, hop-by-hop, the fixed content type): never configured.
_OWN_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-type",
        "upgrade",
        "te",
        "trailer",
        "proxy-connection",
        "cache-control",
        "x-content-type-options",
    }
)
# Request headers HTTP/1.1 and HTTP/2 carry differently, so a condition on them would treat one request two ways by
# the client's protocol (match_headers and never-wake rules alike).
_NOT_CONDITIONS = {
    "host": "HTTP/2 sends it as :authority; a route matches the host by its hosts",
    "cookie": "HTTP/2 clients may split it into several fields, one per cookie",
}
METHOD = Annotated[str, Field(pattern=r"^[A-Z]{1,16}$")]


def _body_bytes(body: str) -> str:
    if len(body.encode()) > MAX_BODY_BYTES:
        raise ValueError(f"the body is larger than {MAX_BODY_BYTES} bytes (64 KiB) in UTF-8: make it smaller")
    return body


# A configured body, bounded as it is sent: in UTF-8 bytes (a character may take four), not in characters.
Body = Annotated[str, Field(max_length=MAX_BODY_BYTES), AfterValidator(_body_bytes)]


def lowered_headers(headers: dict[str, str], *, response: bool) -> dict[str, str]:
    """Header names lowered and checked; a response's may not name what the proxy writes itself."""
    lowered: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if HEADER_NAME.fullmatch(key) is None:
            raise ValueError(f"{name!r} is not a header name")
        if _HEADER_VALUE.fullmatch(value) is None:
            raise ValueError(f"the value of {name} has control characters or is longer than 4096 bytes")
        if not response and key in _NOT_CONDITIONS:
            raise ValueError(f"a header condition cannot name {key}: {_NOT_CONDITIONS[key]}")
        if response and value != value.strip(" \t"):
            # RFC 9110 5.5: a field value has none; an HTTP/2 client takes such a response as malformed.
            raise ValueError(f"the value of {name} has whitespace around it")
        if response and (key in _OWN_HEADERS or key.startswith(":")):
            raise ValueError(f"{name} is written by the proxy itself: it cannot be configured")
        if key in lowered:
            raise ValueError(f"{name} is given twice")
        lowered[key] = value
    return lowered


class FixedResponse(Strict):
    """A response the proxy gives itself; served with `Cache-Control: no-store`."""

    status: int = Field(default=200, ge=200, le=599)
    """The status code (a 204, 205 or 304 with an empty body: those responses have none)."""
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    """Extra response headers (not the framing ones, Content-Type or Cache-Control, which the proxy writes)."""
    content_type: Literal["text/plain; charset=utf-8", "application/json", "text/html; charset=utf-8"] = (
        "text/plain; charset=utf-8"
    )
    """The body's type: one of a fixed few, so a configured body is never sniffed as something else."""
    body: Body = ""
    """The body (at most 64 KiB)."""

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return lowered_headers(headers, response=True)

    @model_validator(mode="after")
    def _no_content(self) -> FixedResponse:
        if self.status in NO_CONTENT and self.body:
            raise ValueError(
                f"a {self.status} response has no body (a client would read it as the next response): "
                "give an empty body or another status"
            )
        return self


class WakingPage(Strict):
    """The page a browser navigation gets at once while the workload is cold (and the workload still wakes).

    A navigation is a GET whose `Accept` ranks `text/html` above every other type it names, as browsers send for a
    page they open (docs/architecture.md#waking-page); every other request is held as before. The default page says
    which route is waking and reloads itself after `refresh` seconds without JavaScript; it never shows anything
    the request carried (Host, path, headers)."""

    status: int = Field(default=503, ge=200, le=599)
    """The page's status: 503 by default, with Retry-After, so crawlers and caches do not keep it (not 204, 205 or
    304: those responses have no body)."""
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    """Extra response headers (not the framing ones, Content-Type or Cache-Control, which the proxy writes)."""
    body: Body = ""
    """The page's HTML (at most 64 KiB), served as `text/html; charset=utf-8`; empty: the default page."""
    refresh: int = Field(default=5, ge=1, le=3600)
    """Seconds the default page waits before it reloads itself, and the Retry-After of every waking page."""

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return lowered_headers(headers, response=True)

    @field_validator("status")
    @classmethod
    def _status(cls, status: int) -> int:
        if status in NO_CONTENT:
            raise ValueError(f"a waking page is a body: its status cannot be {status} (a response without content)")
        return status


class WakingPageWithFile(WakingPage):
    """The config file's waking page: its body may also come from a file (a mounted ConfigMap key)."""

    body_file: str = ""
    """A file whose content is the page (at most 64 KiB, read at start and on every config reload); a ConfigMap
    key mounted as a file is the usual source. Route objects cannot name files: they give `body`."""

    def page_body(self) -> str:
        """The page's HTML: `body`, or the content of `body_file` read now; raises ValueError naming the file."""
        return read_body_file(self.body_file) if self.body_file else self.body

    @model_validator(mode="after")
    def _one_body(self) -> WakingPageWithFile:
        if self.body and self.body_file:
            raise ValueError("give the waking page's body or body_file, not both")
        return self


def read_body_file(path: str) -> str:
    """A page body from a file (UTF-8, at most MAX_BODY_BYTES); raises ValueError saying what is wrong with it."""
    try:
        # Not blocking: opening a FIFO would wait for a writer (the proxy would never start); it is refused below.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ValueError(
                    f"waking_page.body_file {path} is not a regular file (a FIFO, a device): give a file's path"
                )
            data = file.read(MAX_BODY_BYTES + 1)
    except OSError as err:
        raise ValueError(f"waking_page.body_file {path}: cannot read it: {err.strerror or err}") from None
    if len(data) > MAX_BODY_BYTES:
        raise ValueError(
            f"waking_page.body_file {path} is larger than {MAX_BODY_BYTES} bytes (64 KiB): a waking page is sent "
            "whole to every browser that waits; make it smaller"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"waking_page.body_file {path} is not UTF-8 (it is served as text/html; charset=utf-8)"
        ) from None


class NeverWakeRule(Strict):
    """Requests the proxy answers itself with a fixed response: they never wake the workload and are never counted
    as pending. All the rule's conditions must hold (path or path prefix, method, headers)."""

    path: str = Field(default="", max_length=1024)
    """An exact path (without the query)."""
    path_prefix: str = Field(default="", max_length=1024)
    """A path prefix, at a `/` boundary as a route's own."""
    methods: list[METHOD] = Field(default_factory=list, max_length=16)
    """The methods it takes (upper case); empty: any."""
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    """Request headers that must have exactly these values (names case-insensitive)."""
    when: Literal["cold", "always"] = "cold"
    """cold: answered here only while the workload has no ready endpoint, forwarded when it has one; always:
    answered here every time, never forwarded."""
    response: FixedResponse = Field(default_factory=FixedResponse)
    """What the proxy answers."""

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return lowered_headers(headers, response=False)

    @model_validator(mode="after")
    def _one_path(self) -> NeverWakeRule:
        if bool(self.path) == bool(self.path_prefix):
            raise ValueError("a never_wake rule gives path (exact) or path_prefix, one of them")
        if not (self.path or self.path_prefix).startswith("/"):
            raise ValueError("a never_wake rule's path starts with /")
        return self


class Fallback(Strict):
    """A second Service in the route's namespace that takes held requests the workload did not get ready for in
    time (a static site, a "we are busy" service, a cheaper replica), instead of answering them 504."""

    service: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """The Service's name, in the route's own namespace."""
    port: (
        Annotated[str, Field(max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")]
        | Annotated[int, Field(ge=1, le=65535)]
    ) = Field(default="", json_schema_extra={"x-kubernetes-int-or-string": True})
    """The Service port's name or number; empty: its only port."""
    protocol: Literal["auto", "http1", "h2c"] = "auto"
    """The HTTP the fallback speaks (as the upstream's `protocol`)."""
    after: Duration = Field(default=10.0, gt=0)
    """A request held this long without a ready endpoint goes to the fallback (it must be below limits.hold_timeout,
    which still bounds the whole wait). A request at the fallback is no longer pending for the workload: with wake:
    hpa, keep this above the HPA's sync period plus the metric's refresh, or the HPA may never see the request."""


Overflow = Literal["reject", "waking_page", "fallback"]
"""What a request meets when the route already holds limits.max_held_requests: reject (503 with Retry-After), the
waking page (a navigation gets it, any other request the 503), or the fallback Service."""
