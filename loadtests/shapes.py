"""Load shapes: target request rate as a pure function of time.

These sit *before* the loop: they generate the demand that the observe step
later measures. The locust ``LoadTestShape`` in ``loadtests/locustfile.py``
turns them into users and per-user pacing; the simulator (``autoscaler/sim``)
imports the same objects so a simulated run and a real load test see the same
curve. Nothing here imports locust, reads a clock or does I/O except
``load_trace_csv`` (which reads a file the caller names, with the simulator's parser).

Every shape answers two questions for a time ``t_s`` (seconds since the test
started):

- ``total_rps(t_s)``: the total target arrival rate, req/s;
- ``model_rps(t_s)``: per-model target rates when the shape knows them (a
  replayed trace does), else ``None`` and the caller splits the total by its
  own weights.

A shape is finite: ``duration_s`` says when it ends; ``total_rps`` past the end
is 0.0 (the load test stops there, it does not run at a leftover rate).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


class ShapeError(ValueError):
    """A shape specification that cannot describe a load; the message names field and value."""


@runtime_checkable
class Shape(Protocol):
    duration_s: float

    def total_rps(self, t_s: float) -> float: ...

    def model_rps(self, t_s: float) -> dict[str, float] | None: ...


def _check_nonneg(field_name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{field_name}: must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ShapeError(f"{field_name}: must be a finite number >= 0, got {value!r}")
    return v


def _check_pos(field_name: str, value: float) -> float:
    v = _check_nonneg(field_name, value)
    if v <= 0:
        raise ShapeError(f"{field_name}: must be > 0, got {value!r}")
    return v


@dataclass(frozen=True)
class _Base:
    duration_s: float

    def __post_init__(self) -> None:
        _check_pos("duration_s", self.duration_s)

    def _inside(self, t_s: float) -> bool:
        return 0.0 <= t_s < self.duration_s

    def model_rps(self, t_s: float) -> dict[str, float] | None:
        return None

    def __call__(self, t_s: float) -> float:
        return self.total_rps(t_s)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Constant(_Base):
    rps: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nonneg("rps", self.rps)

    def total_rps(self, t_s: float) -> float:
        return float(self.rps) if self._inside(t_s) else 0.0


@dataclass(frozen=True)
class Step(_Base):
    """``levels`` held for equal slices of the run: (10, 20, 40) over 90 s = 30 s each."""

    levels: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.levels:
            raise ShapeError("levels: needs at least one level, got ()")
        for i, v in enumerate(self.levels):
            _check_nonneg(f"levels[{i}]", v)

    def total_rps(self, t_s: float) -> float:
        if not self._inside(t_s):
            return 0.0
        i = min(int(t_s / (self.duration_s / len(self.levels))), len(self.levels) - 1)
        return float(self.levels[i])


@dataclass(frozen=True)
class Ramp(_Base):
    """Linear from ``start_rps`` to ``end_rps`` over ``ramp_s`` (default: the whole run), then hold."""

    start_rps: float = 0.0
    end_rps: float = 0.0
    ramp_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nonneg("start_rps", self.start_rps)
        _check_nonneg("end_rps", self.end_rps)
        if self.ramp_s is not None:
            _check_pos("ramp_s", self.ramp_s)

    def total_rps(self, t_s: float) -> float:
        if not self._inside(t_s):
            return 0.0
        ramp = self.ramp_s or self.duration_s
        frac = min(t_s / ramp, 1.0)
        return self.start_rps + (self.end_rps - self.start_rps) * frac


@dataclass(frozen=True)
class Spike(_Base):
    """``base_rps``, jumping to ``peak_rps`` during [spike_at_s, spike_at_s + spike_s).

    Defaults put the spike in the middle fifth of the run: 120 s → 48 s..72 s, so the
    autoscaler sees a steady state before and a recovery after.
    """

    base_rps: float = 0.0
    peak_rps: float = 0.0
    spike_at_s: float | None = None
    spike_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nonneg("base_rps", self.base_rps)
        _check_nonneg("peak_rps", self.peak_rps)
        if self.spike_at_s is not None:
            _check_nonneg("spike_at_s", self.spike_at_s)
        if self.spike_s is not None:
            _check_pos("spike_s", self.spike_s)

    @property
    def window(self) -> tuple[float, float]:
        at = self.spike_at_s if self.spike_at_s is not None else 0.4 * self.duration_s
        length = self.spike_s if self.spike_s is not None else 0.2 * self.duration_s
        return at, at + length

    def total_rps(self, t_s: float) -> float:
        if not self._inside(t_s):
            return 0.0
        a, b = self.window
        return float(self.peak_rps if a <= t_s < b else self.base_rps)


@dataclass(frozen=True)
class Diurnal(_Base):
    """A day compressed into ``period_s``: trough ``base_rps`` at t=0, peak ``peak_rps`` at period/2.

    rps(t) = base + (peak - base) * (1 - cos(2π t / period)) / 2.
    """

    base_rps: float = 0.0
    peak_rps: float = 0.0
    period_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nonneg("base_rps", self.base_rps)
        _check_nonneg("peak_rps", self.peak_rps)
        if self.period_s is not None:
            _check_pos("period_s", self.period_s)

    def total_rps(self, t_s: float) -> float:
        if not self._inside(t_s):
            return 0.0
        period = self.period_s or self.duration_s
        return self.base_rps + (self.peak_rps - self.base_rps) * (1 - math.cos(2 * math.pi * t_s / period)) / 2


@dataclass(frozen=True)
class TraceReplay(_Base):
    """Per-model rates from a trace; a model's rate holds from its row's ``t_s`` until its next row.

    ``points`` maps model -> sorted ((t_s, rps), ...). Before a model's first row its rate is 0.
    ``duration_s`` defaults (in ``from_rows``) to the last row's time + the most common row
    spacing, so the last row is held for one sample period rather than not at all.
    """

    points: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    speedup: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_pos("speedup", self.speedup)

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[tuple[float, str, float]],
        duration_s: float | None = None,
        speedup: float = 1.0,
    ) -> TraceReplay:
        if not rows:
            raise ShapeError("trace: has no rows, got 0 rows")
        by_model: dict[str, list[tuple[float, float]]] = {}
        for i, (t, model, rps) in enumerate(rows):
            t = _check_nonneg(f"trace row {i + 1}.t_s", t)
            rps = _check_nonneg(f"trace row {i + 1}.rps", rps)
            if not model:
                raise ShapeError(f"trace row {i + 1}.model: must not be empty, got {model!r}")
            by_model.setdefault(model, []).append((t, rps))
        pts = {m: tuple(sorted(v)) for m, v in by_model.items()}
        if duration_s is None:
            times = sorted({t for v in pts.values() for t, _ in v})
            gaps = [round(b - a, 9) for a, b in itertools.pairwise(times)]
            # the most common spacing (ties: the smaller), the same rule as autoscaler/sim/traces.py
            # one time only: one per-minute sample, as the simulator reads it
            step = min(set(gaps), key=lambda g: (-gaps.count(g), g)) if gaps else 60.0
            duration_s = (times[-1] + step) / speedup
        return cls(duration_s=duration_s, points=pts, speedup=speedup)

    @property
    def models(self) -> list[str]:
        return sorted(self.points)

    def model_rps(self, t_s: float) -> dict[str, float] | None:
        if not self._inside(t_s):
            return {m: 0.0 for m in self.points}
        trace_t = t_s * self.speedup
        out: dict[str, float] = {}
        for m, pts in self.points.items():
            i = bisect.bisect_right([p[0] for p in pts], trace_t) - 1
            out[m] = pts[i][1] if i >= 0 else 0.0
        return out

    def total_rps(self, t_s: float) -> float:
        return float(sum((self.model_rps(t_s) or {}).values()))


def load_trace_csv(path: str | Path) -> list[tuple[float, str, float]]:
    """Rows ``(t_s, model, rps)`` of a trace file, read and checked by the simulator's own
    parser (``autoscaler/sim/traces.py``: header, names, numbers, duplicates, size), so a load
    test takes exactly the traces a simulation takes and replays the same curve."""
    from autoscaler.sim.traces import TraceError, read_csv

    try:
        trace = read_csv(path)
    except TraceError as exc:
        raise ShapeError("trace: " + "; ".join(exc.problems)) from None
    return [(float(t), m, float(trace.rps[i, k])) for i, m in enumerate(trace.models) for k, t in enumerate(trace.t_s)]


SHAPES = ("constant", "step", "ramp", "spike", "diurnal", "trace")


def parse_shape_args(text: str | None) -> dict[str, str]:
    """``"spike_at_s=30,spike_s=10"`` -> {"spike_at_s": "30", "spike_s": "10"}."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ShapeError(f"shape-args: each item must be key=value, got {part!r}")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def shape_from_spec(
    name: str,
    duration_s: float,
    base_rps: float = 10.0,
    peak_rps: float | None = None,
    **kwargs: object,
) -> Shape:
    """Build a shape by name.

    - ``constant``: ``base_rps`` throughout;
    - ``step``: ``steps`` (default 4) equal levels from base to peak, or explicit ``levels="5;10;20"``;
    - ``ramp``: base → peak over ``ramp_s`` (default: whole run);
    - ``spike``: base, peak during [``spike_at_s``, +``spike_s``) (default: middle fifth);
    - ``diurnal``: trough base, crest peak, ``period_s`` (default: whole run);
    - ``trace``: ``path=FILE.csv`` (``t_s,model,rps``), optional ``speedup``; ``duration_s`` <= 0
      means "the trace's own length".

    ``peak_rps`` defaults to ``4 * base_rps``.
    """
    known = set(kwargs)

    def take(key: str, conv=float, default=None):
        known.discard(key)
        if key not in kwargs or kwargs[key] is None:
            return default
        try:
            return conv(kwargs[key])
        except (TypeError, ValueError):
            raise ShapeError(f"shape-args.{key}: must be a number, got {kwargs[key]!r}") from None

    name = (name or "").strip().lower()
    base = _check_nonneg("base_rps", base_rps)
    peak = _check_nonneg("peak_rps", peak_rps) if peak_rps is not None else 4 * base
    if name == "trace":
        path = kwargs.get("path")
        known.discard("path")
        if not path:
            raise ShapeError("shape-args.path: the trace shape needs path=FILE.csv, got nothing")
        speedup = take("speedup", float, 1.0)
        dur = float(duration_s) if duration_s and float(duration_s) > 0 else None
        shape: Shape = TraceReplay.from_rows(load_trace_csv(str(path)), duration_s=dur, speedup=speedup)
    elif name == "constant":
        shape = Constant(duration_s=duration_s, rps=base)
    elif name == "step":
        levels_txt = kwargs.get("levels")
        known.discard("levels")
        if levels_txt:
            try:
                levels = tuple(float(x) for x in str(levels_txt).split(";") if x.strip())
            except ValueError:
                raise ShapeError(f"shape-args.levels: must be numbers separated by ';', "
                                 f"got {levels_txt!r}") from None
        else:
            n = take("steps", int, 4)
            if n < 1:
                raise ShapeError(f"shape-args.steps: must be >= 1, got {n}")
            levels = tuple(base + (peak - base) * i / max(n - 1, 1) for i in range(n))
        shape = Step(duration_s=duration_s, levels=levels)
    elif name == "ramp":
        shape = Ramp(duration_s=duration_s, start_rps=base, end_rps=peak, ramp_s=take("ramp_s"))
    elif name == "spike":
        shape = Spike(duration_s=duration_s, base_rps=base, peak_rps=peak,
                      spike_at_s=take("spike_at_s"), spike_s=take("spike_s"))
    elif name == "diurnal":
        shape = Diurnal(duration_s=duration_s, base_rps=base, peak_rps=peak, period_s=take("period_s"))
    else:
        raise ShapeError(f"shape: must be one of {', '.join(SHAPES)}, got {name!r}")
    if known:
        raise ShapeError(f"shape-args: {sorted(known)} not understood by the {name} shape")
    return shape


def split_rps(total_rps: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Split a total rate by weights: 100 rps over {a: 3, b: 1} -> {a: 75, b: 25}."""
    s = sum(w for w in weights.values() if w > 0)
    if s <= 0:
        return {m: 0.0 for m in weights}
    return {m: total_rps * max(w, 0.0) / s for m, w in weights.items()}


def rates_at(shape: Shape, t_s: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Per-model target rates at ``t_s``: the shape's own split if it has one, else by ``weights``."""
    per = shape.model_rps(t_s)
    if per is not None:
        return dict(per)
    return split_rps(shape.total_rps(t_s), weights)


def plan_users(total_rps: float, user_rps: float, users_max: int) -> tuple[int, float]:
    """(users, per-user rate) that deliver ``total_rps`` with one-at-a-time users.

    A user waits for each answer, so it cannot exceed 1/latency req/s; ``user_rps`` is the
    pace we trust one user with. 95 req/s at 10 per user -> 10 users at 9.5 each. Capped at
    ``users_max`` (then each user is asked for more than ``user_rps``). No load -> one idle user,
    so the run keeps its clients and statistics.
    """
    if total_rps <= 0:
        return 1, 0.0
    users = max(1, min(users_max, math.ceil(total_rps / user_rps)))
    return users, total_rps / users
