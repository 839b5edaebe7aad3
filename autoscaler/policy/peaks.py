"""The right-size window's memory: per-minute peaks of the req/s a model required (pure).

``decide`` records each tick's required req/s here (``record_peak``). When a
model's replica count holds, it asks the planner for the highest of those over
the right-size window (``held_rps``, 30 min by default) rather than for what
runs, so the planner may swap an oversized replica for a smaller profile once
demand has stayed low that long.
"""

from __future__ import annotations

import math

PEAK_BUCKET_S = 60.0


def bucket_s(window_s: float) -> float:
    """One peak bucket: a minute, or a 30th of a right-size window under a minute
    (a 4 s window in compressed-time runs would otherwise wait for a whole minute)."""
    return PEAK_BUCKET_S if window_s <= 0 or window_s >= PEAK_BUCKET_S else window_s / 30.0


def record_peak(peaks: tuple, now_s: float, required: float | None, keep_s: float) -> tuple:
    """Per-minute maxima of the req/s required (None: a minute with an unknown one),
    kept for ``keep_s``: what right-sizing looks back over, 30 entries for 30 min."""
    bucket = bucket_s(keep_s)
    b = math.floor(now_s / bucket) * bucket
    if peaks and peaks[-1][0] == b:
        v = peaks[-1][1]
        v = None if v is None or required is None else max(v, required)
        peaks = peaks[:-1] + ((b, v),)
    else:
        peaks = peaks + ((b, required),)
    if peaks[0][0] + bucket <= now_s - keep_s:
        peaks = tuple(p for p in peaks if p[0] + bucket > now_s - keep_s)
    return peaks


def held_rps(peaks: tuple, now_s: float, rightsize_window_s: float | None,
             scale_down_window_s: float) -> float | None:
    """Max req/s required over the right-size window (at least the scale-down window), to
    the minute; None if any of it is unknown or right-sizing is off (no window)."""
    if not rightsize_window_s:
        return None  # right-sizing off: a holding count holds its capacity
    window = max(scale_down_window_s, rightsize_window_s)
    vals = [v for b, v in peaks if b + bucket_s(window) > now_s - window]
    if not vals or any(v is None for v in vals):
        return None
    return max(vals)
