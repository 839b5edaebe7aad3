"""Demand estimation, panic mode, capacity at the SLO and the correction factor (pure).

First stage of ``decide``: turns each tick's observed request rate into the
capacity (req/s) a model needs, before the HPA stages and the planner.

- Demand history is kept per model as ``(t_s, rps)`` samples; the *short*
  window (default 10 s) reacts to bursts, the *long* window (60 s) is the
  stable estimate -- Knative's panic/stable windows.
- Panic mode (Knative KPA, docs/autoscalers.md): enter when short-window demand is at
  least ``panic_threshold`` (2.0) times current capacity; while panicking
  nothing scales down; leave once the condition has not held for a whole
  stable window. What is asked for comes from the predictive floor and the
  burst layer (``forecast.py``, ``burst.py``), not from these windows.
- Required capacity = demand x correction x (1 + headroom). With 100 req/s,
  correction 1.0 and headroom 0.2 the planner is asked for 120 req/s.
- The correction factor is learned online: when observed p99 exceeds the SLO
  the capacity table was optimistic, so demand is inflated; when the model is
  busy yet far inside its SLO it deflates. Bounded to [0.5, 2]. ``decide``
  only lets it learn while the model's capacity is settled (no panic, every
  replica READY for a short window): a burst's backlog is not a table error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from types import EllipsisType

from autoscaler.policy.types import ClusterState, ModelSignals, ReplicaState


@dataclass(frozen=True)
class DemandSample:
    t_s: float
    rps: float
    guess: bool = False  # a saturation guess (served rate + backlog), not a measured rate


@dataclass(frozen=True)
class PanicState:
    panicking: bool = False
    since_s: float | None = None  # when this panic began
    last_trigger_s: float | None = None  # last tick the panic condition held


@dataclass(frozen=True)
class DemandEstimate:
    short_rps: float | None
    long_rps: float | None
    used_rps: float | None  # what capacity is sized for (None: unknown)
    panic: PanicState


@dataclass(frozen=True)
class CorrectionConfig:
    alpha: float = 0.2  # EWMA weight of one observation (in log space)
    lo: float = 0.5
    hi: float = 2.0
    # A sample only says the table is pessimistic when the model is busy:
    # at 10% utilisation a fast p99 tells nothing about capacity -- and nor
    # does 70%: latency is flat until close to capacity (M/M/1 worked number:
    # a 381 req/s, 100 ms-p99 replica at 70% load has p99 = 29 ms, under half
    # the SLO although the table is exact). Deflating there shrank capacity to
    # 0.5x and missed every following burst; at 90% load the same replica has
    # p99 = 55 ms, so only a really pessimistic table still deflates.
    min_utilization: float = 0.9
    low_band: float = 0.5  # p99 below half the SLO while busy -> deflate
    max_utilization_up: float = 1.0  # above it a slow p99 is overload, not a table error


# Queue time up to this multiple of compute time is ordinary batching wait;
# beyond it requests are piling up faster than the replicas finish them.
SATURATED_QUEUE_COMPUTE = 1.0
# Pressure is a guess about demand the rate cannot show; beyond a few times
# capacity it is noise: a 30 s queue behind a 20 ms compute is ratio 1500,
# and an uncapped (1 + 1500) / 2 = 750x would ask for 750x the capacity,
# which panic mode then holds and the scale-down window keeps for 5 minutes.
# HPA's behavior doubles capacity per period anyway, so 4x loses no speed.
MAX_SATURATION_PRESSURE = 4.0
# The served rate is saturated only near capacity; below 90% of it the rate is
# the demand itself and saturation pressure does not apply.
SATURATED_UTILIZATION = 0.9


def saturation_pressure(signals: ModelSignals | None) -> float:
    """How far beyond its capacity a model is driven, from Triton's queue:compute ratio (>= 1).

    The served rate saturates at capacity, and with closed-loop clients (each
    waits for its answer, as locust users and most RPC callers do) the backlog
    sits in the clients, not in Triton's queue -- so neither the rate nor
    ``pending`` shows how much more is wanted. Queue time does: a request that
    waits 3x as long as it computes (ratio 3) means about (1 + 3) / 2 = 2x the
    capacity is wanted. At or below ratio 1 this is exactly 1 (no effect),
    and a missing ratio is 1 too (the other terms still hold); it never
    exceeds ``MAX_SATURATION_PRESSURE``.
    """
    if signals is None:
        return 1.0
    q, c = signals.avg_queue_ms, signals.avg_compute_ms
    if q is not None and c is not None and c > 0 and q >= 0:
        ratio = q / c
    elif signals.queue_compute_ratio is not None:
        ratio = signals.queue_compute_ratio
    else:
        return 1.0
    if not math.isfinite(ratio) or ratio <= SATURATED_QUEUE_COMPUTE:
        return 1.0
    return min(MAX_SATURATION_PRESSURE, (1.0 + ratio) / (1.0 + SATURATED_QUEUE_COMPUTE))


def observed_demand(
    signals: ModelSignals | None, backlog_drain_s: float, capacity_rps: float | None = None
) -> float | None:
    """Arrival rate now: served rate, scaled by saturation pressure, or plus the queued backlog.

    The served rate saturates at capacity, so a queue of 200 requests with a
    10 s drain adds 20 req/s, and a queue:compute ratio above 1 scales the
    rate up (``saturation_pressure``) -- otherwise a saturated model would only
    ever ask for what it already has. A missing ``pending`` or ratio adds
    nothing (refinements); a missing request rate makes demand None.

    ``capacity_rps`` (what runs, at the SLO): a rate clearly below it
    (< ``SATURATED_UTILIZATION``) is not saturated, so it is the demand and
    queue time is ordinary load -- a single queue at 80% load already waits
    4x its compute time (rho / (1 - rho)), and reading that as 2.5x demand
    made capacity swing between 1x and 3x the load.
    """
    if signals is None or signals.request_rate is None:
        return None
    extra = 0.0
    if signals.pending is not None and backlog_drain_s > 0:
        extra = signals.pending / backlog_drain_s
    if capacity_rps is not None and capacity_rps > 0 and signals.request_rate < SATURATED_UTILIZATION * capacity_rps:
        return signals.request_rate + extra
    # Queued requests are what makes queue time long, so the backlog and the
    # pressure measure the same excess: take the larger, never both (adding
    # them asked a flash crowd at 3x capacity for 7x, filled the cluster and
    # starved every other model).
    return max(signals.request_rate * saturation_pressure(signals), signals.request_rate + extra)


def is_saturation_guess(
    signals: ModelSignals | None, backlog_drain_s: float, capacity_rps: float | None = None
) -> bool:
    """Is ``observed_demand`` above the served rate because the model is saturated?

    Then the value is a guess (pressure or backlog catch-up), not a measured
    arrival rate: good enough to scale up on, but it overshoots -- a flash crowd
    at 2.5x capacity read 5x (pressure capped at 4x, plus the backlog) -- so
    ``decide`` does not ratchet the panic requirement with it (a ratcheted
    guess held that overshoot for the whole panic). Same branches as
    ``observed_demand``.
    """
    if signals is None or signals.request_rate is None:
        return False
    if capacity_rps is not None and capacity_rps > 0 and signals.request_rate < SATURATED_UTILIZATION * capacity_rps:
        return False
    got = observed_demand(signals, backlog_drain_s, capacity_rps)
    return got is not None and got > signals.request_rate * (1.0 + 1e-9)


def record_demand(
    history: Iterable[DemandSample], sample: DemandSample, keep_s: float
) -> tuple[DemandSample, ...]:
    cutoff = sample.t_s - keep_s
    return tuple(s for s in history if s.t_s > cutoff) + (sample,)


def window_average(history: Iterable[DemandSample], now_s: float, window_s: float) -> float | None:
    """Mean of the samples inside ``(now_s - window_s, now_s]``; None when there are none."""
    vals = [s.rps for s in history if now_s - window_s < s.t_s <= now_s]
    if not vals:
        return None
    return sum(vals) / len(vals)


def update_panic(
    panic: PanicState,
    short_rps: float | None,
    capacity_rps: float,
    threshold: float,
    stable_window_s: float,
    now_s: float,
) -> PanicState:
    """Knative's panic transitions.

    Capacity 50 req/s, threshold 2.0: a short-window demand of 100 req/s
    starts (or extends) a panic. Without a trigger for ``stable_window_s``
    the panic ends. Unknown demand neither starts nor ends one.
    """
    if short_rps is None:
        return panic
    over = short_rps > 0 and short_rps >= threshold * capacity_rps
    if over:
        return PanicState(
            panicking=True,
            since_s=panic.since_s if panic.panicking else now_s,
            last_trigger_s=now_s,
        )
    if (
        panic.panicking
        and panic.last_trigger_s is not None
        and now_s - panic.last_trigger_s >= stable_window_s
    ):
        return PanicState()
    return panic


def estimate(
    history: Iterable[DemandSample],
    panic: PanicState,
    now_s: float,
    short_window_s: float,
    long_window_s: float,
) -> DemandEstimate:
    """Short and long window averages and the one to size for.

    Stable: the long window (smooth, slow to drop). Panicking: the larger of
    the two, so a burst is met within a short window.
    """
    hist = tuple(history)
    short = window_average(hist, now_s, short_window_s)
    long_ = window_average(hist, now_s, long_window_s)
    if panic.panicking:
        used = (
            max(v for v in (short, long_) if v is not None)
            if (short is not None or long_ is not None)
            else None
        )
    else:
        used = long_ if long_ is not None else short
    return DemandEstimate(short, long_, used, panic)


def required_capacity(demand_rps: float, correction: float, headroom: float) -> float:
    """req/s to plan for: 100 req/s x 1.1 x 1.2 = 132 req/s."""
    return max(0.0, demand_rps) * correction * (1.0 + headroom)


def span_utilization(
    hist: tuple[DemandSample, ...], observed: float, now_s: float, span_s: float | None, factor: float, capacity: float
) -> tuple[float | None, float | None]:
    """(highest, lowest) corrected utilization (demand x factor / capacity) over the
    span a p99 covers; without a span of its own (``span_s`` None) both are this
    window's demand.

    The highest excuses a miss: an overload anywhere in the span explains a slow
    p99. The lowest must still be busy for a fast p99 to show the table
    pessimistic, and it is read from measured rates only: a saturation guess
    (served rate + backlog) is no rate, and a busy moment inside a quiet minute
    does not make its p99 a busy one's. Taking the highest for both let one
    overload's guess (4x the load) stand for a minute in which the p99 was
    mostly the quiet replicas': the factor fell to its floor, the replicas went
    with it, the overload came back, and 200 models in the 8,000-GPU benchmark
    never settled."""
    if capacity <= 0:
        return None, None
    if span_s is None:
        u = observed * factor / capacity
        return u, u
    span = [x for x in hist if x.t_s > now_s - span_s]
    highest = max([observed, *(x.rps for x in span)])
    measured = [x.rps for x in span if not x.guess]
    lowest = min(measured) * factor / capacity if measured else None
    return highest * factor / capacity, lowest


def update_correction(
    factor: float,
    p99_ms: float | None,
    slo_p99_ms: float | None,
    utilization: float | None,
    latency_is_average: bool,
    cfg: CorrectionConfig = CorrectionConfig(),
    *,
    lowest_utilization: float | None | EllipsisType = ...,
) -> tuple[float, bool]:
    """One online step of the correction factor; returns (factor, learned?).

    ``utilization`` is corrected demand / table capacity of what runs
    (demand x factor / capacity); where the p99 covers a longer span than the
    demand, it is the span's highest and ``lowest_utilization`` its lowest
    (``span_utilization``; ``...``: the same as ``utilization``). The sample
    is observed p99 / SLO: the table promises p99 <= SLO up to full load, so

    - over the SLO while utilization <= 1: the table is optimistic. p99 80 ms
      vs SLO 50 ms gives 1.6 and, with alpha 0.2, factor 1.0 -> 1.6 ** 0.2 =
      1.099. An average latency above the SLO counts too (the p99 is higher
      still). Over the SLO while *over*loaded says nothing about the table --
      that is plain under-provisioning, which demand already fixes; learning
      from it would keep capacity inflated once the backlog is gone;
    - under half the SLO while busy (the lowest utilization >= ``min_utilization``, 0.9) and a
      real quantile: the table is pessimistic and the factor shrinks;
    - over the SLO with a factor below 1 at any other load: ``relax_optimism``;
    - otherwise unchanged. The factor stays within [lo, hi].
    """
    if p99_ms is None or slo_p99_ms is None or slo_p99_ms <= 0 or not math.isfinite(p99_ms) or p99_ms <= 0:
        return factor, False
    r = p99_ms / slo_p99_ms
    busy = utilization if lowest_utilization is ... else lowest_utilization
    if r > 1.0 and utilization is not None and utilization <= cfg.max_utilization_up:
        sample = min(r, cfg.hi)
    elif r > 1.0 and factor < 1.0:
        return relax_optimism(factor, p99_ms, slo_p99_ms, cfg)
    elif (
        r < cfg.low_band
        and not latency_is_average
        and busy is not None
        and busy >= cfg.min_utilization
    ):
        sample = max(r / cfg.low_band, cfg.lo)
    elif r <= 1.0 and factor > 1.0:
        # Healthy: let a learned pessimism leak back toward 1 (slowly: a fifth
        # of alpha), so one overload episode does not inflate capacity forever;
        # if the table really is optimistic the next miss raises it again.
        new = math.exp((1 - cfg.alpha / 5) * math.log(factor))
        return max(1.0, new), True
    else:
        return factor, False
    new = math.exp((1 - cfg.alpha) * math.log(factor) + cfg.alpha * math.log(factor * sample))
    return min(cfg.hi, max(cfg.lo, new)), True


def relax_optimism(
    factor: float, p99_ms: float | None, slo_p99_ms: float | None, cfg: CorrectionConfig = CorrectionConfig()
) -> tuple[float, bool]:
    """A factor below 1 moves toward 1 (at alpha, never past it) while the SLO is missed.

    A factor below 1 says the replicas serve more than their table. A missed
    SLO refutes that at any load: were they faster, the load would not miss.
    ``update_correction`` learns upward only at utilization <= 1, and a model
    whose corrected demand fits its replicas while its queue sheds never gets
    there: at factor 0.57 the 938 req/s arriving at a 675 req/s replica count
    as 538, nothing scales, and utilization (from the saturation guess) reads
    3.2, so the p99 of 600 ms against 100 ms teaches nothing -- the model stays
    stranded on one replica for hours. Moving toward 1 can only raise what is
    required, up to the table, so it needs no settled capacity either: a miss
    read wrongly costs capacity, never the SLO.
    """
    if (
        factor >= 1.0 or p99_ms is None or slo_p99_ms is None or slo_p99_ms <= 0
        or not math.isfinite(p99_ms) or p99_ms <= slo_p99_ms
    ):
        return factor, False
    return min(1.0, max(cfg.lo, math.exp((1 - cfg.alpha) * math.log(factor)))), True


def capacity_settled(model: str, cluster: ClusterState, panic: PanicState, now_s: float, window_s: float) -> bool:
    """May this tick's p99 teach the correction factor anything about the table?

    Only when capacity has been steady for a while: not while panicking,
    and every live replica READY for at least ``window_s`` (the short
    window). Right after a burst the latency window still holds the backlog
    of the minutes before, while ``cap`` already counts the new (starting)
    replicas, so utilization reads low and the slow p99 looked like an
    optimistic table: the factor went 1.0 -> 2.0 in six ticks and doubled
    every requirement for minutes after the burst had been served. Not the
    long window: where the table *is* optimistic (the demo's estimated
    resnet capacity) each new replica restarted that wait, the factor never
    learned during the burst and the p99 missed its SLO; with the short window
    the 24 h benchmark is as good (4 seeds: 98.3% / 268.7 GPU-h vs 98.2% / 267.2).
    A p99 that reaches further back than the short window (Triton's summaries,
    ``ModelSignals.latency_window_s``) waits that long instead: on real Triton
    the overload before a scale-up stayed in the p99 for most of a minute and the
    factor went 1.1 -> 2.0 with the new replicas already serving.
    """
    if panic.panicking:
        return False
    return not any(
        r.model == model and r.state in (ReplicaState.STARTING, ReplicaState.READY)
        and (r.state is not ReplicaState.READY or (r.since_s is not None and now_s - r.since_s < window_s))
        for r in cluster.replicas
    )
