"""Kubernetes `resource.Quantity` in Go's canonical DecimalSI form (docs/protocols.md#quantity).

Go rounds any non-zero value up, away from zero, to a multiple of 1e-9, then writes an
integer mantissa with the largest SI suffix whose exponent is a multiple of 3, never a
fraction: 1.5 -> "1500m", 1000 -> "1k", 1500 -> "1500", 2.5e-10 -> "1n".
"""

from __future__ import annotations

import decimal
from decimal import ROUND_UP, Decimal

_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
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
