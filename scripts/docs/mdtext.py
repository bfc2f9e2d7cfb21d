"""Text from docstrings and help strings, made safe for the generated Markdown pages."""

from __future__ import annotations

import html
import re

# A code span (`...`): its text is shown as written, so nothing in it is escaped.
_CODE = re.compile(r"(`[^`]*`)")
# A docstring's citation of a contributors' page (`docs/architecture.md#activator`): a link on the generated pages,
# which all sit in docs/reference/, so a reader of the manual can follow it (and the --strict build checks it).
_CITATION = re.compile(r"\bdocs/((?:architecture|protocols)\.md#[A-Za-z0-9_-]+)")


def _prose(text: str) -> str:
    return _CITATION.sub(r"[docs/\1](../\1)", html.escape(text, quote=False))


def inline(text: str) -> str:
    """`text` as Markdown prose: `<`, `>` and `&` outside code spans as entities, so no text is read as HTML, and
    citations of the contributors' pages as links."""
    return "".join(part if _CODE.fullmatch(part) else _prose(part) for part in _CODE.split(text))


def cell(text: str) -> str:
    """`text` in a table cell: on one line, `|` escaped (inside code spans too: the table is split first)."""
    return inline(" ".join(text.split())).replace("|", "\\|")
