"""Kubernetes Quantity strings: the canonical form the API serves, and the parser."""

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.api.quantity import QuantityError, format_milli, format_quantity, parse_quantity, to_milli


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "0"),
        (1, "1"),
        (1.5, "1500m"),
        (0.5, "500m"),
        (0.001, "1m"),
        (2, "2"),
        (1500, "1500"),
        (2000, "2k"),
        (3_000_000, "3M"),
        (7e9, "7G"),
        (-1.5, "-1500m"),
        (-2000, "-2k"),
        (12.25, "12250m"),
    ],
)
def test_format_canonical(value, text):
    assert format_quantity(value) == text


def test_precision_loss_rounds_up_like_kubernetes():
    # 0.0004 cannot be held in milli-units; Kubernetes rounds away from zero
    assert format_quantity(0.0004) == "1m"
    assert format_quantity(-0.0004) == "-1m"
    assert format_quantity(0.6666, rounding="floor") == "666m"
    assert format_quantity(0.6666, rounding="nearest") == "667m"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_not_finite_or_out_of_range_is_refused(bad):
    with pytest.raises(ValueError):
        to_milli(bad)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1500m", Decimal("1.5")),
        ("1.5", Decimal("1.5")),
        ("2k", Decimal(2000)),
        ("1Ki", Decimal(1024)),
        ("1.5Gi", Decimal(1.5 * 2**30)),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("100u", Decimal("0.0001")),
        ("5n", Decimal("5e-9")),
        ("-3", Decimal(-3)),
        ("+3", Decimal(3)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("0", Decimal(0)),
    ],
)
def test_parse(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "m", "1.5.5", "1 k", " 1", "1x", "1Kib", "--1", "1e", ".", "1mm", "1e9999999999"])
def test_parse_rejects(bad):
    with pytest.raises(QuantityError):
        parse_quantity(bad)


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_round_trip_milli(milli):
    text = format_milli(milli)
    assert parse_quantity(text) * 1000 == milli
    # canonical: a whole number never carries the m suffix, a fraction always does
    assert text.endswith("m") == (milli % 1000 != 0)


@given(st.decimals(min_value=-1e12, max_value=1e12, allow_nan=False, places=3))
def test_round_trip_decimal(d):
    assert parse_quantity(format_quantity(d)) == d
