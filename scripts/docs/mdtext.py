"""Text from docstrings and help strings, made safe for the generated Markdown pages."""

from __future__ import annotations

import html
import re

# A code span (`...`): its text is shown as written, so nothing in it is escaped.
_CODE = re.compile(r"(`[^`]*`)")


def inline(text: str) -> str:
    """`text` as Markdown prose: `<`, `>` and `&` outside code spans as entities, so no text is read as HTML."""
    return "".join(part if _CODE.fullmatch(part) else html.escape(part, quote=False) for part in _CODE.split(text))


def cell(text: str) -> str:
    """`text` in a table cell: on one line, `|` escaped (inside code spans too: the table is split first)."""
    return inline(" ".join(text.split())).replace("|", "\\|")
