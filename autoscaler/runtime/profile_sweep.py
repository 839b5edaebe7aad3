"""Capacity profiling, the pure part: which points to measure and what they say.

Used by ``migscale profile`` (``commands.profile``) with ``runtime.profile``'s
``TritonMeasurer`` as the measurement; no I/O here, so the rules are tested
against a recorded table (``tests/unit/test_profile_sweep.py``).

The closed-loop sweep (``sweep``) walks concurrency 1, 2, 4, 8, ... and stops
at the first of: p99 > 2x the SLO (further points only queue), errors above 1%,
throughput saturated (less than 5% gain over two successive doublings: 8 -> 16
-> 32 with 80.1, 81.0, 81.3 req/s), or the concurrency limit. Capacity at SLO =
the highest throughput among the points whose p99 is within the SLO and whose
error rate is 0.

Arrivals. N requests kept in flight (``Arrivals.CLOSED``) is how a replica is
driven to saturation, but it is not how online traffic arrives: many
independent users send whether or not the last answer came back, so requests
arrive as a Poisson process and bunch up. With ``Arrivals.POISSON`` the
closed-loop sweep runs first (for the saturation curve and the plot), then an
open-loop search finds the highest *offered* rate whose p99 meets the SLO
(``rate_search``): it tries the closed-loop capacity itself, and if that
misses, bisects between 0 and it (``refine`` steps, resolution capacity /
2**refine). After the search, ``curve_search`` measures Poisson rates spread up
to the saturation throughput (0.6, 0.75, 0.9 of it): the simulator serves every
load a replica meets from them, and they never move the capacity at the SLO.
Measured on the emulated resnet (1g, max batch 8, SLO 150 ms): closed loop
64.5 req/s at p99 64 ms (4 in flight, batch 4.0); Poisson arrivals reach p99
125 ms at 30 req/s and 153 ms at 40 req/s -- the closed-loop figure overstates
what the replica serves to independent users by about 1.6x.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

import numpy as np


class Arrivals(str, Enum):
    CLOSED = "closed"  # N requests in flight (the concurrency sweep alone)
    POISSON = "poisson"  # then the open-loop rate search; its result is the capacity


class StopReason(str, Enum):
    LATENCY = "p99 above 2x SLO"
    ERRORS = "errors above 1%"
    SATURATED = "throughput saturated"
    MAX_CONCURRENCY = "concurrency limit reached"


@dataclass(frozen=True)
class PointRule:
    point_s: float = 3.0
    min_requests: int = 200
    warmup_s: float = 0.5
    max_factor: float = 5.0  # a point ends at max_factor * point_s even below min_requests
    # Requests sent at each Poisson rate. A point starts with the replica's queue nearly
    # empty, and near the SLO its tail takes tens of seconds to build, so a short point
    # reads its p99 low and the search over-promises. Measured with
    # benchmarks/profile_points.py (resnet, 1g, SLO 150 ms): 500 and 1,000 requests
    # reported a rate a 4,000-request point put over the SLO (152.4, 156.7 ms), every
    # search; 2,000 reported one it put within (146.9 ms). docs/profile-throughput.md.
    open_requests: int = 2000


@dataclass(frozen=True)
class SweepPoint:
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    avg_batch: float | None  # from Triton: delta nv_inference_count / delta nv_inference_exec_count
    unstable: bool = False
    offered_rps: float | None = None  # open-loop points: the Poisson rate sent (concurrency is then 0)

    @property
    def error_rate(self) -> float:
        return self.errors / (self.requests + self.errors) if (self.requests + self.errors) else 0.0


@dataclass
class ProfileResult:
    model: str
    profile: str
    slo_p99_ms: float
    points: list[SweepPoint] = field(default_factory=list)
    stop: StopReason | None = None
    env: str = "emulated"  # emulated | mig
    startup_s: float | None = None
    arrivals: Arrivals = Arrivals.CLOSED
    open_points: list[SweepPoint] = field(default_factory=list)  # the Poisson search, in order
    curve_points: list[SweepPoint] = field(default_factory=list)  # Poisson points up to saturation

    @property
    def closed_capacity_rps(self) -> float | None:
        return capacity_at_slo(self.points, self.slo_p99_ms)

    @property
    def capacity_rps(self) -> float | None:
        """The capacity at the SLO: ``capacity_point``'s offered rate under Poisson arrivals,
        its throughput under closed-loop ones."""
        cp = self.capacity_point
        if cp is None:
            return None
        return cp.offered_rps if self.arrivals is Arrivals.POISSON else cp.throughput_rps

    @property
    def capacity_point(self) -> SweepPoint | None:
        if self.arrivals is Arrivals.POISSON:
            ok = [p for p in _within(self.open_points, self.slo_p99_ms) if p.offered_rps is not None]
            return max(ok, key=lambda p: p.offered_rps) if ok else None
        ok = _within(self.points, self.slo_p99_ms)
        return max(ok, key=lambda p: p.throughput_rps) if ok else None

    @property
    def poisson_curve(self) -> list[SweepPoint]:
        """Offered rate vs p99 under Poisson arrivals: the search's points and those spread
        toward saturation, as one curve ordered by rate (the points with a p99)."""
        pts = [p for p in (*self.open_points, *self.curve_points)
               if p.p99_ms is not None and p.offered_rps is not None]
        return sorted(pts, key=lambda p: p.offered_rps)

    def to_dict(self) -> dict[str, Any]:
        cp = self.capacity_point

        def rows(points: Sequence[SweepPoint]) -> list[dict[str, Any]]:
            return [{k: _r(v) if isinstance(v, float) else v for k, v in asdict(p).items()} for p in points]

        out = {
            "capacity_rps": _r(self.capacity_rps),
            "slo_p99_ms": self.slo_p99_ms,
            "arrivals": self.arrivals.value,
            "at_concurrency": cp.concurrency if cp and cp.offered_rps is None else None,
            "avg_batch_at_capacity": _r(cp.avg_batch) if cp else None,
            "stop": self.stop.value if self.stop else None,
            "replica": self.env,
            "startup_s": _r(self.startup_s),
            "points": rows(self.points),
        }
        if self.arrivals is Arrivals.POISSON:
            out["closed_loop_capacity_rps"] = _r(self.closed_capacity_rps)
            out["poisson_points"] = rows(self.open_points)
            out["poisson_curve_points"] = rows(self.curve_points)
        return out


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(float(v), nd)


def _within(points: Sequence[SweepPoint], slo_p99_ms: float) -> list[SweepPoint]:
    return [p for p in points if p.p99_ms is not None and p.p99_ms <= slo_p99_ms and p.errors == 0
            and p.requests > 0]


def capacity_at_slo(points: Sequence[SweepPoint], slo_p99_ms: float) -> float | None:
    """Highest throughput whose p99 is within the SLO (and error-free); None when no point is."""
    ok = _within(points, slo_p99_ms)
    return max(p.throughput_rps for p in ok) if ok else None


def open_capacity_at_slo(points: Sequence[SweepPoint], slo_p99_ms: float) -> float | None:
    """Highest offered Poisson rate whose p99 is within the SLO (and error-free); None when none is."""
    ok = [p for p in _within(points, slo_p99_ms) if p.offered_rps is not None]
    return max(p.offered_rps for p in ok) if ok else None  # type: ignore[type-var]


def rate_search(
    measure_rate: Callable[[float], SweepPoint],
    slo_p99_ms: float,
    upper_rps: float,
    refine: int = 4,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """The open-loop points that bound the highest Poisson rate meeting the SLO.

    ``upper_rps`` is the closed-loop capacity: Poisson arrivals bunch, so a replica
    serves them no better than N requests in flight at the same rate. That rate is
    tried first; if it misses, ``refine`` bisection steps between 0 and it follow
    (4 steps: the answer is within upper/16 below the true crossing). A point
    misses on p99 above the SLO or on any error.
    """
    points: list[SweepPoint] = []

    def ok(rate: float) -> bool:
        p = measure_rate(rate)
        points.append(p)
        if on_point:
            on_point(p)
        return bool(_within([p], slo_p99_ms))

    if upper_rps <= 0 or ok(upper_rps):
        return points
    lo, hi = 0.0, upper_rps
    for _ in range(refine):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return points


CURVE_FRACTIONS = (0.6, 0.75, 0.9)


def curve_search(
    measure_rate: Callable[[float], SweepPoint],
    slo_p99_ms: float,
    saturation_rps: float,
    have: Sequence[SweepPoint] = (),
    fractions: Sequence[float] = CURVE_FRACTIONS,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Poisson points spread up to the saturation throughput, at ``fractions`` of it.

    ``rate_search``'s points gather where the p99 crosses the SLO, but the simulator
    serves every load a replica meets from these points (``sim.queueing.ServiceCurve``),
    up to saturation, where a batcher's p99 rises far more slowly than one service rate
    predicts. A fraction within 5% of a point in ``have`` is not measured again; the
    first point over twice the SLO or with errors ends the search (beyond, it only
    queues). These points never set the capacity at the SLO: that stays the search's."""
    points: list[SweepPoint] = []
    for f in fractions:
        rate = f * saturation_rps
        if rate <= 0 or any(p.offered_rps is not None and abs(p.offered_rps - rate) <= 0.05 * rate
                            for p in (*have, *points)):
            continue
        p = measure_rate(rate)
        points.append(p)
        if on_point:
            on_point(p)
        if p.errors or p.p99_ms is None or p.p99_ms > 2 * slo_p99_ms:
            break
    return points


def concurrency_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_concurrency`` (added when not a power of two)."""
    out, c = [], 1
    while c < max_concurrency:
        out.append(c)
        c *= 2
    out.append(max_concurrency)
    return out


def stop_reason(points: Sequence[SweepPoint], slo_p99_ms: float) -> StopReason | None:
    """Whether the sweep should end after the last point in ``points``."""
    last = points[-1]
    if last.p99_ms is not None and last.p99_ms > 2 * slo_p99_ms:
        return StopReason.LATENCY
    if last.error_rate > 0.01:
        return StopReason.ERRORS
    if len(points) >= 3:
        a, b, c = (p.throughput_rps for p in points[-3:])
        # 5%: run-to-run noise of a point on this machine is ~2%; a real gain from doubling
        # concurrency below saturation is 30-100%
        if a > 0 and b < a * 1.05 and c < a * 1.05:
            return StopReason.SATURATED
    return None


def sweep(
    measure: Callable[[int], SweepPoint],
    slo_p99_ms: float,
    levels: Sequence[int],
    on_point: Callable[[SweepPoint], None] | None = None,
) -> tuple[list[SweepPoint], StopReason]:
    points: list[SweepPoint] = []
    for c in levels:
        p = measure(c)
        points.append(p)
        if on_point:
            on_point(p)
        why = stop_reason(points, slo_p99_ms)
        if why is not None:
            return points, why
    return points, StopReason.MAX_CONCURRENCY


def table_capacity(cap_rps: float) -> float:
    """The capacity the table states: rounded down to 0.1 req/s, since the planner must not
    be promised more than was measured."""
    return float(np.floor(cap_rps * 10) / 10)


def capacity_document(results: Sequence[ProfileResult]) -> dict[str, Any]:
    """``{models: {name: {profile: rps}}, measured: {name: {profile: details}}}``.

    Profiles without a capacity (no point within the SLO) are left out of ``models``
    (the planner must not place a replica where it cannot meet the SLO) but stay in
    ``measured`` with their points, so the reason is visible.
    """
    models: dict[str, dict[str, float]] = {}
    measured: dict[str, dict[str, Any]] = {}
    for r in results:
        cap = r.capacity_rps
        if cap is not None and cap > 0:
            models.setdefault(r.model, {})[r.profile] = table_capacity(cap)
        measured.setdefault(r.model, {})[r.profile] = r.to_dict()
    return {"models": models, "measured": measured}
