"""Durations as people type them: ``90``, ``45s``, ``2m``, ``1m30s``, ``1.5h``, ``2d``, ``1d12h``.

Part of the config edge: the one syntax of every command-line duration
(``trace generate --duration/--step``, ``loadtest --duration/--warmup``), so a
form one command takes is never refused by another. Pure: no I/O.

A bare number is seconds. Otherwise the text is one or more ``NUMBER UNIT``
parts with units d, h, m, s, each at most once and largest first (``1h30m``,
not ``30m1h`` or ``1m1m``), case-insensitive. ``ms`` is refused rather than
read as minutes and seconds.
"""

from __future__ import annotations

import math
import re

_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_FORM = re.compile(rf"(?:{_NUMBER}[dhms])+")
_PART = re.compile(rf"({_NUMBER})([dhms])")
EXAMPLES = "90, 45s, 2m, 1m30s, 1.5h, 2d"


def parse_duration(text: str | float, field: str = "duration", *, allow_zero: bool = False,
                   max_s: float | None = None) -> float:
    """Seconds in ``text``; ValueError naming ``field`` and the value when it is not a
    duration, is not > 0 (>= 0 with ``allow_zero``), or is over ``max_s``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
    else:
        s = "".join(str(text).split()).lower()
        if re.fullmatch(_NUMBER, s):
            v = float(s)
        else:
            parts = _PART.findall(s) if _FORM.fullmatch(s) else []
            units = [u for _, u in parts]
            if not parts or units != sorted(set(units), key="dhms".index):
                raise ValueError(f"{field}: must be a duration such as {EXAMPLES}, got {text!r}")
            v = sum(float(n) * _SECONDS[u] for n, u in parts)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{field}: must be {'>=' if allow_zero else '>'} 0 seconds, got {text!r}")
    if max_s is not None and v > max_s:
        raise ValueError(f"{field}: must be at most {format_seconds(max_s)}, got {text!r}")
    return v


def format_seconds(s: float) -> str:
    """``2678400`` -> ``31d``; ``5400`` -> ``1h30m``: the largest units that divide it whole."""
    if s <= 0 or not math.isfinite(s):
        return f"{s:g}s"
    out, rest = [], float(s)
    for unit, size in _SECONDS.items():
        k = math.floor(rest / size + 1e-9)
        if k and unit != "s":
            out.append(f"{k}{unit}")
            rest -= k * size
    if rest > 1e-9 or not out:
        out.append(f"{rest:g}s")
    return "".join(out)
