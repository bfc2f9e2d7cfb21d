"""adapter.k8s_wire.quantity: reading Quantity strings as Go's ParseQuantity does (docs/protocols.md#quantity-grammar,
docs/protocols.md#quantity-precision)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from adapter.k8s_wire.quantity import QuantityError, parse_quantity, quantity_milli


@pytest.mark.parametrize(
    ("text", "value", "fact"),
    [
        ("0", Decimal(0), "quantity-grammar: '0' is special-cased"),
        ("1500m", Decimal("1.5"), "quantity-grammar: decimalSI m = 1e-3"),
        ("2k", Decimal(2000), "quantity-grammar: k = 1e3"),
        ("1Mi", Decimal(2**20), "quantity-grammar: binarySI Mi"),
        ("1E", Decimal("1e18"), "quantity-grammar: bare E means exa"),
        ("1E3", Decimal(1000), "quantity-grammar: E3 is an exponent"),
        ("1e-3", Decimal("0.001"), "quantity-grammar: signed decimal exponent"),
        ("5n", Decimal("5e-9"), "quantity-grammar: n is valid though missing from the BNF"),
        ("3u", Decimal("3e-6"), "quantity-grammar: u is valid"),
        (".5", Decimal("0.5"), "quantity-grammar: .<digits>"),
        ("5.", Decimal(5), "quantity-grammar: <digits>."),
        ("+2", Decimal(2), "quantity-grammar: signed number"),
        ("-1.5", Decimal("-1.5"), "quantity-grammar: signed number"),
        ("0.0000000001", Decimal("1e-9"), "quantity-precision: non-zero values round up to a multiple of 1e-9"),
        (10, Decimal(10), "em-response: Go also accepts an unquoted number"),
        (0.1, Decimal("0.1"), "quantity-python: floats go through repr, never binary expansion"),
    ],
)
def test_parse(text: str | int | float, value: Decimal, fact: str) -> None:
    assert parse_quantity(text) == value, fact


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("", "quantity-grammar: an empty string is an error"),
        ("1K", "quantity-grammar: upper-case K is not a suffix"),
        ("1e", "an exponent needs digits"),
        (".", "a number needs a digit"),
        ("1.2.3", "one decimal point at most"),
        (" 1", "no surrounding spaces"),
        ("1Ki2", "nothing after a suffix"),
        (True, "a YAML boolean is not a quantity"),
        ("1e400000", "an exponent beyond decimal arithmetic is an error, not an ArithmeticError"),
        ("1e999999999", "an exponent beyond the decimal context's range, the same"),
    ],
)
def test_reject(text: str, fact: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "milli", "fact"),
    [
        ("1n", 1, "quantity-precision: '1n' is read by the HPA as 1 milli-unit"),
        ("0.0001", 1, "quantity-precision: '0.0001' becomes 1m"),
        ("1500m", 1500, "em-response example value"),
        ("-1n", -1, "quantity-precision: MilliValue rounds away from zero"),
        ("100Mi", 104857600000, "binary suffix in milli-units"),
    ],
)
def test_milli_value(text: str, milli: int, fact: str) -> None:
    assert quantity_milli(text) == milli, fact
