"""Demand traces: the input of the simulator (what arrives before the loop observes it).

A trace is per-model request rates over time, piecewise constant. On disk it is
a CSV with the header ``t_s,model,rps``: each row sets ``model``'s rate to
``rps`` req/s from ``t_s`` until that model's next row (the same rule as
``loadtests.shapes.TraceReplay``, so a load test and a simulation replay the
same curve). The trace ends one sample period after its last timestamp; the
period is the most common spacing between consecutive timestamps (60 s for the
per-minute traces written here), so a 24 h per-minute trace has rows at
0..86340 s and ends at 86400 s. A model with no row yet has rate 0.

Generators are seedable (``numpy.random.Generator``) and pure: the same seed
gives the same trace, byte for byte. ``generate`` makes a trace of one kind:
a single-model kind for each model (``sim/kinds.py``: ``diurnal``, ``bursty``,
``flash``, ``azure``) or a fleet family (``sim/families.py``: ``heavytail``,
``flashcrowd``, ``onoff``, ``steps``, ``weekly``, ``mixed``, and the extra
``cron``, ``ramp``, ``failover``).

No public production trace is shipped: none is in an installed package, and
this project does not download data (docs/traces.md cites the published
statistics the generators follow).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoscaler.config.duration import format_seconds
from autoscaler.config.duration import parse_duration as _parse_duration
from autoscaler.config.io import ConfigError, read_text
from autoscaler.sim.families import FAMILIES, FAMILY_STEP_S
from autoscaler.sim.kinds import azure, azure_popularity, bursty, diurnal, flash

# What one trace may hold. Each bound keeps a mistyped input (``--duration 10000000h``,
# a row at t_s=1e12) to a clear error instead of hours of work or all the memory:
# a month is four times the longest trace the benchmarks run, a million points per
# model a month at 2.7 s, and the file cap far above a month of per-second rows.
MAX_DURATION_S = 31 * 86400.0
MAX_SAMPLES = 1_000_000
MAX_FILE_BYTES = 256 << 20
# A rate above a billion req/s for one model is a typing error (1e308 would make every sum
# infinite); a generated mean is capped a thousand times lower, so the bursts a generator
# adds on top (at most ~13x the mean) always fit a trace file.
MAX_RPS = 1e9
MAX_MEAN_RPS = 1e6

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a model name: a DNS-1035 label, as in models.yaml


class TraceError(ValueError):
    """A trace that cannot be used; ``problems`` are one line each, naming the field and value."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Trace:
    """Per-model piecewise-constant rates on one shared, strictly increasing time grid.

    ``rps[m, k]`` is model ``models[m]``'s rate from ``t_s[k]`` to ``t_s[k+1]``
    (or to ``duration_s`` for the last sample).
    """

    t_s: np.ndarray  # (n,)
    models: tuple[str, ...]
    rps: np.ndarray  # (len(models), n)
    duration_s: float

    def __post_init__(self) -> None:
        problems = []
        t = np.asarray(self.t_s, dtype=float)
        r = np.asarray(self.rps, dtype=float)
        if t.ndim != 1 or len(t) == 0:
            problems.append(f"t_s: needs at least one sample, got shape {t.shape}")
        elif np.any(np.diff(t) <= 0) or t[0] < 0:
            problems.append("t_s: must start at >= 0 and strictly increase")
        elif not self.duration_s > t[-1]:
            problems.append(f"duration_s: must exceed the last t_s {t[-1]}, got {self.duration_s}")
        if r.shape != (len(self.models), len(t)):
            problems.append(f"rps: shape must be (models, samples) = {(len(self.models), len(t))}, got {r.shape}")
        elif not np.all(np.isfinite(r)) or np.any(r < 0):
            problems.append("rps: every rate must be a finite number >= 0")
        if len(set(self.models)) != len(self.models):
            problems.append(f"models: names must be unique, got {list(self.models)}")
        if problems:
            raise TraceError(problems)
        object.__setattr__(self, "t_s", t)
        object.__setattr__(self, "rps", r)

    # ------------------------------------------------------------ queries

    def index(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            raise KeyError(f"model {model!r} is not in the trace; it has {list(self.models)}") from None

    def rate_at(self, model: str, t_s: float) -> float:
        if t_s < self.t_s[0] or t_s >= self.duration_s:
            return 0.0
        k = int(np.searchsorted(self.t_s, t_s, side="right")) - 1
        return float(self.rps[self.index(model), k])

    def on_grid(self, step_s: float, duration_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean rate per bin of ``step_s`` from 0: ``(bin starts, rps[models, bins])``.

        Means, not point samples, so the number of requests is preserved exactly
        when the trace's own period is not a multiple of ``step_s``.
        """
        end = float(self.duration_s if duration_s is None else duration_s)
        n = max(1, math.ceil(end / step_s - 1e-9))
        edges = np.minimum(np.arange(n + 1) * step_s, end)
        # cumulative requests at each trace breakpoint
        bounds = np.append(self.t_s, self.duration_s)
        seg = np.diff(bounds)
        cum = np.concatenate([np.zeros((len(self.models), 1)), np.cumsum(self.rps * seg, axis=1)], axis=1)
        out = np.empty((len(self.models), n))
        for m in range(len(self.models)):
            c = np.interp(edges, bounds, cum[m], left=0.0, right=cum[m, -1])
            width = np.diff(edges)
            out[m] = np.divide(np.diff(c), width, out=np.zeros(n), where=width > 0)
        return edges[:-1], out

    def total_requests(self) -> float:
        seg = np.diff(np.append(self.t_s, self.duration_s))
        return float((self.rps * seg).sum())

    def peak_rps(self) -> dict[str, float]:
        return {m: float(self.rps[i].max()) for i, m in enumerate(self.models)}

    def mean_rps(self) -> dict[str, float]:
        seg = np.diff(np.append(self.t_s, self.duration_s))
        return {m: float((self.rps[i] * seg).sum() / self.duration_s) for i, m in enumerate(self.models)}


# ------------------------------------------------------------------ CSV


def write_csv(trace: Trace, path: str | Path | None = None) -> str:
    """Write ``t_s,model,rps`` rows (time-major); returns the text, and writes it when ``path`` is given."""
    buf = io.StringIO()
    buf.write("t_s,model,rps\n")
    for k, t in enumerate(trace.t_s):
        for m, name in enumerate(trace.models):
            buf.write(f"{t:g},{name},{trace.rps[m, k]:.6g}\n")
    text = buf.getvalue()
    if path is not None:
        Path(path).write_text(text)
    return text


def read_csv(path: str | Path) -> Trace:
    """Parse and validate a trace file; every problem is reported as ``line N: field: message, got VALUE``."""
    p = Path(path)
    if str(p) != "-" and not p.exists():
        raise TraceError([f"{p}: cannot read the trace: no such file"])
    if p.is_file() and (size := p.stat().st_size) > MAX_FILE_BYTES:
        raise TraceError([f"{p}: {size} bytes, over the {MAX_FILE_BYTES >> 20} MiB a trace may have"])
    try:
        # the config reader's refusals: missing, a directory, a FIFO (would block), size, not UTF-8
        text = read_text(p, max_bytes=MAX_FILE_BYTES, kind="a trace CSV")
    except ConfigError as exc:
        raise TraceError(exc.problems) from None
    return parse_csv(text, source=str(p))


def parse_csv(text: str, source: str = "trace") -> Trace:
    problems: list[str] = []
    # a spreadsheet's "CSV UTF-8" starts with a byte-order mark, as YAML files may
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    header = next(reader, None)
    if header is None:
        raise TraceError([f"{source}: empty file, expected the header t_s,model,rps"])
    cols = [h.strip() for h in header]
    if cols != ["t_s", "model", "rps"]:
        raise TraceError([f"{source} line 1: header must be exactly t_s,model,rps, got {','.join(cols)!r}"])
    rows: dict[str, dict[float, float]] = {}
    order: list[str] = []
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 3:
            problems.append(f"{source} line {lineno}: expected 3 fields t_s,model,rps, got {len(row)}: {row!r}")
            continue
        ts, model, rs = (c.strip() for c in row)
        try:
            t = float(ts)
            if not math.isfinite(t) or t < 0:
                raise ValueError
        except ValueError:
            problems.append(f"{source} line {lineno}: t_s: must be a finite number >= 0, got {ts!r}")
            continue
        if not _NAME.match(model):
            problems.append(f"{source} line {lineno}: model: must be a DNS-1035 label (a model name), got {model!r}")
            continue
        try:
            r = float(rs)
            if not 0 <= r <= MAX_RPS:  # also NaN and inf
                raise ValueError
        except ValueError:
            problems.append(f"{source} line {lineno}: rps: must be a number from 0 to {MAX_RPS:,.0f} req/s, got {rs!r}")
            continue
        per = rows.setdefault(model, {})
        if model not in order:
            order.append(model)
        if t in per:
            problems.append(f"{source} line {lineno}: t_s: duplicate time {ts} for model {model!r}")
            continue
        per[t] = r
    if not problems and not rows:
        problems.append(f"{source}: no data rows, expected at least one t_s,model,rps row")
    if problems:
        raise TraceError(problems)
    grid = np.array(sorted({t for per in rows.values() for t in per}))
    if grid[-1] >= MAX_DURATION_S:
        raise TraceError([(f"{source}: t_s: the last row is at {grid[-1]:g} s; a trace may span at most "
                           f"{format_seconds(MAX_DURATION_S)} ({MAX_DURATION_S:g} s)")])
    if len(grid) > MAX_SAMPLES:
        raise TraceError([f"{source}: {len(grid)} distinct times, over the {MAX_SAMPLES} a trace may have"])
    gaps = np.diff(grid)
    if len(gaps):
        vals, counts = np.unique(np.round(gaps, 9), return_counts=True)
        period = float(vals[np.argmax(counts)])
    else:
        period = 60.0  # one row per model: treat it as one per-minute sample
    rps = np.zeros((len(order), len(grid)))
    for m, name in enumerate(order):
        pts = sorted(rows[name].items())
        ts = np.array([p[0] for p in pts])
        vs = np.array([p[1] for p in pts])
        k = np.searchsorted(ts, grid, side="right") - 1
        rps[m] = np.where(k >= 0, vs[np.maximum(k, 0)], 0.0)
    return Trace(grid, tuple(order), rps, float(grid[-1] + period))


# ------------------------------------------------------------------ generators


def parse_duration(text: str | float, field: str = "duration") -> float:
    """``"24h"``, ``"90m"``, ``"1m30s"``, ``"2d"`` or plain seconds -> seconds (> 0), at most
    ``MAX_DURATION_S`` (config/duration.py's syntax); TraceError naming ``field`` otherwise."""
    try:
        return _parse_duration(text, field, max_s=MAX_DURATION_S)
    except ValueError as exc:
        raise TraceError([str(exc)]) from None


def _means(models: Sequence[str], mean_rps: float | Mapping[str, float]) -> np.ndarray:
    if isinstance(mean_rps, Mapping):
        missing = [m for m in models if m not in mean_rps]
        if missing:
            raise TraceError([f"mean_rps: no mean rate for models {missing}"])
        vals = [float(mean_rps[m]) for m in models]
    else:
        vals = [float(mean_rps)] * len(models)
    for m, v in zip(models, vals):
        if not 0 <= v <= MAX_MEAN_RPS:  # also NaN and inf
            raise TraceError([f"mean_rps.{m}: must be a number from 0 to {MAX_MEAN_RPS:,.0f} req/s, got {v!r}"])
    return np.array(vals)


KINDS = ("diurnal", "bursty", "flash", "azure", *FAMILIES)  # "mixed" is both a kind and a family


def default_step_s(kind: str) -> float:
    """The sample period a kind is generated at when none is asked for (60 s, or a family's own)."""
    return FAMILY_STEP_S.get(kind, 60.0)


def generate(
    kind: str,
    models: Sequence[str],
    duration_s: float,
    seed: int,
    mean_rps: float | Mapping[str, float] = 100.0,
    step_s: float | None = None,
) -> Trace:
    """A seeded trace of ``kind`` (one of KINDS) for ``models``, one sample per ``step_s``
    (None: the kind's own period, ``default_step_s``)."""
    if step_s is None:
        step_s = default_step_s(kind)
    problems = []
    if kind not in KINDS:
        problems.append(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    if not models:
        problems.append("models: needs at least one model name, got none")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        problems.append(f"seed: must be an integer >= 0, got {seed!r}")
    for m in models:
        if not _NAME.match(m):
            problems.append(f"models: {m!r} is not a DNS-1035 label (a model name)")
    if len(set(models)) != len(models):
        problems.append(f"models: names must be unique, got {list(models)}")
    if not (math.isfinite(step_s) and step_s > 0):
        problems.append(f"step_s: must be > 0, got {step_s!r}")
    elif not (duration_s >= step_s):
        problems.append(f"duration_s: must be at least one step ({step_s}s), got {duration_s!r}")
    elif not duration_s <= MAX_DURATION_S:
        problems.append(f"duration_s: must be at most {format_seconds(MAX_DURATION_S)}, got {duration_s!r}")
    elif duration_s / step_s > MAX_SAMPLES:
        problems.append(f"step_s: {duration_s:g} s in steps of {step_s:g} s is over {MAX_SAMPLES} samples; "
                        f"a step of at least {duration_s / MAX_SAMPLES:.3g} s, got {step_s!r}")
    if problems:
        raise TraceError(problems)
    means = _means(models, mean_rps)
    rng = np.random.default_rng(seed)
    n = math.ceil(duration_s / step_s - 1e-9)
    t = np.arange(n) * float(step_s)
    rps = np.zeros((len(models), n))
    if kind == "azure":
        # popularity redistributes the total: the busiest model gets most of it
        means = azure_popularity(rng, len(models)) * means.mean()
    if kind in FAMILIES:
        rps = FAMILIES[kind](rng, t, means, float(step_s))  # type: ignore[operator]
    else:
        gens = {"diurnal": diurnal, "bursty": bursty, "flash": flash, "azure": azure}
        for i in range(len(models)):
            rps[i] = gens[kind](rng, t, float(means[i]), float(step_s))
    return Trace(t, tuple(models), rps, float(n * step_s))
