"""Argument types the commands share (argparse `type=`): each error names what the value should be."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(what: str) -> Callable[[str], int]:
    """A whole number >= 0; a negative one is refused as `<text> is not <what>`."""

    def whole_number(text: str) -> int:  # argparse names the type by this name when int() fails
        value = int(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    return whole_number
