"""Reading Kubernetes Quantity strings from HPA manifests (docs/protocols.md#quantity-grammar,
docs/protocols.md#quantity-precision).

The formatter lives in adapter.metrics.quantity; this is the other direction, kept here
because only manifests (targets, tolerances) and metric values read by the HPA need it.
"""

from __future__ import annotations

import re
from decimal import Decimal

from adapter.metrics.quantity import format_quantity, milli_value

# Go pre-splits with exactly this expression before looking at number and suffix apart.
_SPLIT = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$")
_EXPONENT = re.compile(r"^[eE][+-]?[0-9]+$")
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


class QuantityError(ValueError):
    """The text is not a Kubernetes Quantity."""


def parse_quantity(text: str | int | float) -> Decimal:
    """The exact value Go's `ParseQuantity` gives, rounded up (away from zero) to a multiple of 1e-9.

    YAML may hand us a number (`value: 10`); Go's UnmarshalJSON accepts numbers too.
    """
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    raw = repr(text) if isinstance(text, float) else str(text)
    if raw == "0":
        return Decimal(0)
    split = _SPLIT.match(raw)
    if split is None or not _NUMBER.match(split.group(1)):
        raise QuantityError(f"{raw!r} is not a quantity (e.g. 10, 1500m, 2k, 1Mi, 1e3)")
    number, suffix = Decimal(split.group(1)), split.group(2)
    try:
        if suffix in _DECIMAL_SI:
            value = number.scaleb(_DECIMAL_SI[suffix])
        elif suffix in _BINARY_SI:
            value = number * (2 ** _BINARY_SI[suffix])
        elif _EXPONENT.match(suffix):
            value = number.scaleb(int(suffix[1:]))
        else:
            raise QuantityError(f"{raw!r} has an unknown suffix {suffix!r} (use n u m k M G T P E, Ki..Ei or e<exp>)")
        # Reuse the formatter's nano rounding instead of repeating it: its output re-parses exactly.
        return value if value.is_zero() else _exact(format_quantity(value))
    except ArithmeticError:  # an exponent beyond what decimal arithmetic holds (1e400000): no Quantity
        raise QuantityError(f"{raw[:64]!r} is out of range for a quantity") from None


def _exact(canonical: str) -> Decimal:
    """Value of a canonical DecimalSI string produced by format_quantity."""
    if "e" in canonical:
        mantissa, exponent = canonical.split("e")
        return Decimal(mantissa).scaleb(int(exponent))
    suffix = canonical.lstrip("-0123456789")
    return Decimal(canonical[: len(canonical) - len(suffix)]).scaleb(_DECIMAL_SI[suffix])


def quantity_milli(text: str | int | float) -> int:
    """`ParseQuantity(text).MilliValue()`: what the HPA compares, in milli-units
    (docs/protocols.md#quantity-precision)."""
    return milli_value(parse_quantity(text))
