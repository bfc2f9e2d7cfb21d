"""Kubernetes `resource.Quantity`, both directions: written in Go's canonical DecimalSI form
(docs/protocols.md#quantity) and read as Go's `ParseQuantity` does (docs/protocols.md#quantity-grammar,
docs/protocols.md#quantity-precision).

Go rounds any non-zero value up, away from zero, to a multiple of 1e-9, then writes an
integer mantissa with the largest SI suffix whose exponent is a multiple of 3, never a
fraction: 1.5 -> "1500m", 1000 -> "1k", 1500 -> "1500", 2.5e-10 -> "1n".
"""

from __future__ import annotations

import decimal
import re
from decimal import ROUND_UP, Decimal

_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_DECIMAL_SI = {suffix: exponent for exponent, suffix in _SUFFIXES.items()}  # the same table, read the other way
_NANO = Decimal("1e-9")
# Far more digits than any value we serve: rounding must only ever happen at the nano step.
_CONTEXT = decimal.Context(prec=200, rounding=ROUND_UP)


def to_decimal(value: Decimal | int | float | str) -> Decimal:
    """Exact decimal of a number; floats go through repr so 0.1 stays 0.1 (docs/protocols.md#quantity-python)."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(value)


def format_quantity(value: Decimal | int | float | str) -> str:
    """The canonical Quantity string for a finite number."""
    number = to_decimal(value)
    if not number.is_finite():
        raise ValueError(f"a Quantity must be finite, not {number}")
    if number.is_zero():
        return "0"
    rounded = number.quantize(_NANO, context=_CONTEXT)  # ROUND_UP is away from zero
    sign, digits, exponent = rounded.as_tuple()
    assert isinstance(exponent, int)  # finite numbers have integer exponents
    mantissa = int("".join(map(str, digits)))
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    remainder = exponent % 3
    mantissa *= 10**remainder
    exponent -= remainder
    prefix = "-" if sign else ""
    if exponent > 18:
        # No SI suffix above exa; Go (after kubernetes#140459) falls back to an exponent.
        return f"{prefix}{mantissa}e{exponent}"
    return f"{prefix}{mantissa}{_SUFFIXES[exponent]}"


def milli_value(value: Decimal | int | float | str) -> int:
    """What the HPA reads (`MilliValue()`): the value times 1000, rounded up away from zero."""
    scaled = to_decimal(value) * 1000
    return int(scaled.to_integral_value(rounding=ROUND_UP))


# Kubernetes' Quantity.MilliValue() is an int64: a larger value wraps around (2**63 reads as a negative
# number), so the HPA would act on a wrong number. Values outside this range are not served.
_MILLI_RANGE = range(-(2**63), 2**63)


def unservable(value: Decimal) -> str | None:
    """Why the HPA could not read `value` correctly (NaN, infinite, milli-value beyond int64), or None."""
    if not value.is_finite():
        return "is not a finite number"
    if milli_value(value) not in _MILLI_RANGE:
        return "is too large for a Kubernetes Quantity (its milli-value must fit in 64 bits: |value| < 9.2e15)"
    return None


# Go pre-splits with exactly this expression before looking at number and suffix apart.
_SPLIT = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_NUMBER = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$")
_EXPONENT = re.compile(r"^[eE][+-]?[0-9]+$")
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
