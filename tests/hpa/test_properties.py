"""Properties over many inputs (hypothesis): Quantity round trips and the controller's invariants."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from adapter.k8s_wire.quantity import format_quantity, parse_quantity
from tests.hpa.builders import follow, make_controller

NANO = Decimal("1e-9")


@given(st.decimals(min_value=Decimal("-1e15"), max_value=Decimal("1e15"), allow_nan=False, places=12))
def test_parse_reads_back_what_the_formatter_writes(value: Decimal) -> None:
    """docs/protocols.md#quantity-precision, docs/protocols.md#quantity-canonical: format then parse gives the value
    rounded up (away from zero) to a multiple of 1e-9."""
    rounded = value.quantize(NANO, rounding="ROUND_UP") if value else value
    assert parse_quantity(format_quantity(value)) == rounded


@settings(max_examples=60, deadline=None)
@given(
    min_replicas=st.integers(0, 3),
    span=st.integers(0, 12),
    usages=st.lists(st.integers(0, 400), min_size=1, max_size=25),
    scale_down_window=st.sampled_from([0, 30, 300]),
)
def test_followed_decisions_stay_in_range_and_within_the_rate(
    min_replicas: int, span: int, usages: list[int], scale_down_window: int
) -> None:
    """docs/protocols.md#hpa-behavior: once inside [min, max], every decision stays there, and one 15 s step up never
    exceeds the default policies' max(start + 4, 2 * start)
    (no earlier scale-up inside the 15 s period at that spacing)."""
    max_replicas = max(min_replicas, 1) + span
    controller = make_controller(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        scaled_to_zero=True if min_replicas == 0 else None,
        behavior={"scaleDown": {"stabilizationWindowSeconds": scale_down_window}},
    )
    replicas = max(min_replicas, 1)
    for tick, usage in enumerate(usages):
        _, desired = follow(controller, tick * 15.0, replicas, str(usage))
        assert min_replicas <= desired <= max_replicas
        if desired > replicas:
            assert desired <= max(replicas + 4, 2 * replicas)
        replicas = desired
