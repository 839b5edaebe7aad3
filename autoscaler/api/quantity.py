"""Kubernetes ``resource.Quantity`` strings: format and parse.

Part of the export step: every metric value the API serves is a Quantity
string, the way the HPA reads it (``k8s.io/apimachinery/pkg/api/resource``).
The HPA converts a Quantity with ``MilliValue()``, so milli precision is what
counts; we format from an integer number of milli-units and pick the
canonical form Kubernetes itself prints:

* a value that is not a whole number keeps the ``m`` suffix: 1.5 -> ``"1500m"``,
  0.001 -> ``"1m"``;
* a whole number takes the largest decimal-SI suffix that keeps the mantissa
  an integer: 2000 -> ``"2k"``, 1500 -> ``"1500"``, 3e6 -> ``"3M"``;
* zero is ``"0"``.

Rounding to milli goes UP in magnitude, like Kubernetes does when a Quantity
loses precision (``0.0004`` -> ``"1m"``), unless the caller asks for floor --
the HPA value in :mod:`autoscaler.api.signals` needs floor to stay below an
integer boundary.

:func:`parse_quantity` accepts the full grammar (binary ``Ki..Ei``, decimal
``n u m k M G T P E``, exponents ``1e3``) and returns an exact ``Decimal``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

__all__ = ["QuantityError", "format_milli", "format_quantity", "parse_quantity", "to_milli"]


class QuantityError(ValueError):
    """A string that is not a Kubernetes Quantity."""


_DECIMAL_SUFFIXES: tuple[tuple[int, str], ...] = (
    (18, "E"),
    (15, "P"),
    (12, "T"),
    (9, "G"),
    (6, "M"),
    (3, "k"),
)

_SUFFIX_VALUE: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}

# sign, digits with optional fraction, then a suffix or a decimal exponent.
# ".5" and "5." are valid Quantities; "." alone is not.
_QUANTITY_RE = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|(?P<exp>[eE][+-]?[0-9]+))?$"
)

# Kubernetes Quantities are int64 milli-values at the HPA; beyond that they overflow.
_MAX_MILLI = 2**63 - 1


def to_milli(value: float | Decimal, *, rounding: str = "up") -> int:
    """``value`` as integer milli-units.

    ``rounding="up"`` rounds away from zero (Kubernetes' rule when a Quantity
    loses precision); ``"floor"`` rounds toward minus infinity; ``"nearest"``
    rounds half to even. Raises ValueError for NaN/Inf or out-of-range values
    -- a metric that is not a finite number is not served at all.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    # a float goes through its shortest repr: Decimal(0.001) is 0.00100000000000000002...,
    # which would round UP to 2m
    d = value if isinstance(value, Decimal) else Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not d.is_finite():
        raise ValueError(f"not a finite number: {value!r}")
    scaled = d * 1000
    if rounding == "up":
        milli = int(scaled.to_integral_value(rounding="ROUND_UP"))
    elif rounding == "floor":
        milli = int(scaled.to_integral_value(rounding="ROUND_FLOOR"))
    elif rounding == "nearest":
        milli = int(scaled.to_integral_value(rounding="ROUND_HALF_EVEN"))
    else:
        raise ValueError(f"rounding must be up, floor or nearest, got {rounding!r}")
    if abs(milli) > _MAX_MILLI:
        raise ValueError(f"out of the int64 milli range: {value!r}")
    return milli


@lru_cache(maxsize=8192)  # the same few values are formatted for every pod of a tick
def format_milli(milli: int) -> str:
    """Canonical Quantity string of an integer number of milli-units."""
    if milli == 0:
        return "0"
    sign = "-" if milli < 0 else ""
    m = abs(milli)
    if m % 1000:
        return f"{sign}{m}m"
    whole = m // 1000
    for exp, suffix in _DECIMAL_SUFFIXES:
        div = 10**exp
        if whole % div == 0:
            return f"{sign}{whole // div}{suffix}"
    return f"{sign}{whole}"


def format_quantity(value: float | Decimal, *, rounding: str = "up") -> str:
    """Canonical Quantity string of ``value`` at milli precision (``1.5`` -> ``"1500m"``)."""
    return format_milli(to_milli(value, rounding=rounding))


def parse_quantity(text: str) -> Decimal:
    """Exact value of a Quantity string; raises QuantityError on bad syntax."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {text!r}")
    m = _QUANTITY_RE.match(text.strip())
    if m is None or text != text.strip():
        raise QuantityError(f"not a Kubernetes quantity: {text!r} (e.g. 1500m, 2, 1.5Gi, 1e3)")
    try:
        num = Decimal(m["num"])
    except InvalidOperation:  # pragma: no cover - the regex already guarantees digits
        raise QuantityError(f"not a Kubernetes quantity: {text!r}") from None
    try:
        if m["exp"]:
            num = num.scaleb(int(m["exp"][1:]))
        elif m["suffix"]:
            num = num * _SUFFIX_VALUE[m["suffix"]]
    except ArithmeticError:  # exponent beyond Decimal's range, e.g. "1e9999999"
        raise QuantityError(f"quantity out of range: {text!r}") from None
    return -num if m["sign"] == "-" else num
