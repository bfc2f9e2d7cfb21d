"""Credentials out of log lines and error messages.

An error body may echo the request that caused it (a TokenReview's token, our own
Authorization header), and a request target may carry a token in its query. Whatever text
came from a peer passes through `redact` before it is logged or put into an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"
# A bearer or basic credential, a JWT anywhere (service-account tokens are JWTs), the password of a
# URL's user-info, and the value of any query, form, YAML or JSON field whose name says it holds a secret.
_PATTERNS = re.compile(
    r"(?i)(?P<scheme>\b(?:bearer|basic)\s+)[^\s\"',;]+"
    r"|eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
    r"|(?P<userinfo>//[^/\s:@]*:)[^/\s@]+(?=@)"
    r"|(?P<field>\b(?:access_token|token|password|passwd|secret|api[-_]?key)\"?\s*[:=]\s*\"?)[^\s\"&,;}]+"
)


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every known secret and anything shaped like a credential replaced by [redacted]."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return _PATTERNS.sub(_replacement, text)


def _replacement(match: re.Match[str]) -> str:
    kept = match.group("scheme") or match.group("userinfo") or match.group("field") or ""
    return kept + REDACTED
