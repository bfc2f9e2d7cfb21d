"""Quantity formatting against Go's canonical form (docs/protocols.md#quantity)."""

from __future__ import annotations

import re
from decimal import ROUND_UP, Context, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.k8s_wire.quantity import format_quantity, milli_value

# The worked examples of docs/protocols.md#quantity-canonical, plus signs and the e >= 21 fallback.
WORKED = [
    (1.5, "1500m"),
    (0.5, "500m"),
    (0.1, "100m"),
    (100, "100"),
    (1000, "1k"),
    (1500, "1500"),
    (120000, "120k"),
    (1234567, "1234567"),
    (10**6, "1M"),
    (10**18, "1E"),
    (1.5e18, "1500P"),
    (1e-4, "100u"),
    (2.5e-10, "1n"),
    (0, "0"),
    (-1.5, "-1500m"),
    (Decimal("0.0000000001"), "1n"),
    (10**21, "1e21"),
    (Decimal("1.5e22"), "15e21"),
]

# Wide enough that no test value is rounded except at the nano step Go rounds at.
_WIDE = Context(prec=100, rounding=ROUND_UP)
_SUFFIX_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_CANONICAL = re.compile(r"^(-?)([1-9][0-9]*)(?:([numkMGTPE]?)|e([0-9]+))$")


def parse_canonical(text: str) -> Decimal:
    """An independent reader of the canonical form: mantissa and suffix, nothing else."""
    if text == "0":
        return Decimal(0)
    match = _CANONICAL.match(text)
    assert match is not None, f"{text!r} is not canonical"
    sign, mantissa, suffix, exponent = match.groups()
    power = int(exponent) if exponent is not None else _SUFFIX_EXPONENT[suffix]
    value = Decimal(mantissa).scaleb(power, context=_WIDE)
    return value.copy_negate() if sign else value


def go_rounded(value: Decimal) -> Decimal:
    """ParseQuantity rounds non-zero values up, away from zero, to a multiple of 1e-9."""
    return value.quantize(Decimal("1e-9"), context=_WIDE)


@pytest.mark.parametrize(("value", "expected"), WORKED)
def test_worked_examples(value: object, expected: str) -> None:
    assert format_quantity(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("-Infinity")])
def test_non_finite_values_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="finite"):
        format_quantity(value)  # type: ignore[arg-type]


def _assert_canonical_round_trip(value: Decimal, text: str) -> None:
    assert parse_canonical(text) == go_rounded(value)
    match = _CANONICAL.match(text)
    if match is not None and match.group(4) is None and match.group(3) != "E":
        # Below exa, a mantissa with three trailing zeros would have taken the next suffix.
        assert int(match.group(2)) % 1000 != 0, text


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_integers_round_trip(value: int) -> None:
    text = format_quantity(value)
    _assert_canonical_round_trip(Decimal(value), text)
    if 0 <= value < 1000:
        assert text == str(value)


@given(st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**20), max_value=10**20, places=12))
def test_decimals_round_trip(value: Decimal) -> None:
    _assert_canonical_round_trip(value, format_quantity(value))


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20))
def test_floats_go_through_their_shortest_repr(value: float) -> None:
    _assert_canonical_round_trip(Decimal(repr(value)), format_quantity(value))


@pytest.mark.parametrize(
    ("value", "milli"),
    [("1n", 1), (Decimal("0.0001"), 1), (Decimal("1.5"), 1500), (7, 7000), (Decimal("-0.0001"), -1)],
)
def test_milli_value_rounds_up_like_the_hpa(value: object, milli: int) -> None:
    number = parse_canonical(value) if isinstance(value, str) else value
    assert milli_value(number) == milli  # type: ignore[arg-type]
