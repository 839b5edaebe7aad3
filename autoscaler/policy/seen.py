"""One model's observation in one tick: demand windows, panic, correction, forecast, headroom.

The first step of ``decide`` for each model (pure; zero I/O): it takes the
model's fresh signals from the ``Observation``, keeps its demand history and
panic state, updates the learned correction while capacity is settled, feeds
the forecaster measured arrivals only (never a saturation guess), and learns
the headroom over the reaction horizon. ``decide`` then predicts the req/s
required from the ``Seen`` it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.policy import burst as bu
from autoscaler.policy import demand as dm
from autoscaler.policy import forecast as fc
from autoscaler.policy.capacity import best_replica_capacity, by_model, current_capacity
from autoscaler.policy.state import PolicyConfig, PolicyState
from autoscaler.policy.types import ClusterState, ModelSpec, Observation


def fresh_signals(obs: Observation, model: str, now_s: float, stale_s: float):
    """The model's signals if the source answered and they are under ``stale_s`` old;
    else None (unknown, never zero)."""
    sig = obs.models.get(model) if obs.source_ok else None
    if sig is None:
        return None
    if sig.t_s is None or now_s - sig.t_s > stale_s:
        return None
    return sig


def valid_rate(sig) -> bool:
    """Defence in depth: sources already drop NaN/Inf/negative values, but a
    request rate that slipped through must not become demand."""
    v = sig.request_rate if sig is not None else None
    return v is None or (math.isfinite(v) and v >= 0)


@dataclass
class Seen:
    """What one tick observed of one model (scratch, read by decide)."""

    sig: object
    observed: float | None  # demand from the metrics window (may be a saturation guess)
    guess: bool  # observed is a guess above the served rate (saturated)
    hist: tuple
    panic: dm.PanicState
    corr: float
    est: dm.DemandEstimate | None
    n: int
    cap: float
    forecast: fc.Forecast
    headroom: fc.Headroom
    measured: float | None  # the arrival rate measured this tick (fast signals first)
    envelope: float | None  # the forecaster's highest rate over the horizon
    horizon_s: float
    recurring: float | None  # the recurring rise the envelope includes (None: none expected)


def observe_model(obs, state: PolicyState, cfg: PolicyConfig, spec: ModelSpec, now_s: float,
                  own: ClusterState | None = None) -> Seen:
    """Demand history, panic, correction, forecaster and headroom for one model
    (``own``: the cluster with only this model's replicas, from ``by_model``)."""
    name = spec.name
    if own is None:
        own = by_model(obs.cluster).get(name, ClusterState(obs.cluster.gpus, ()))
    n, cap, _ = current_capacity(spec, own)
    sig = fresh_signals(obs, name, now_s, cfg.metrics_stale_s)
    if not valid_rate(sig):
        sig = None
    drain = cfg.backlog_drain_s if cfg.backlog_drain_s is not None else cfg.short_window_s
    observed = dm.observed_demand(sig, drain, cap if cap > 0 else None)
    guess = observed is not None and dm.is_saturation_guess(sig, drain, cap if cap > 0 else None)
    # The windows (and panic) follow the freshest measured arrivals: the fast
    # signals' where the backend has them, else the metrics window's demand.
    fast = sig.fast if sig is not None else None
    fast_arrivals = bu.arrivals(fast, now_s, cfg.burst)
    from_fast = fast_arrivals is not None and observed is not None
    windowed = fast_arrivals if from_fast else observed
    # A p99 that reaches further back than the windows is judged against the capacity
    # and the load of its whole span: a scale-up or a burst inside it still shows.
    lat_w = sig.latency_window_s if sig is not None and sig.latency_window_s else None
    keep = max(cfg.long_window_s, cfg.short_window_s, lat_w or 0.0)
    hist = state.demand.get(name, ())
    if windowed is not None:
        hist = dm.record_demand(hist, dm.DemandSample(now_s, windowed, guess and not from_fast), keep)
    else:
        hist = tuple(s for s in hist if s.t_s > now_s - keep)
    panic = state.panic.get(name, dm.PanicState())
    corr = state.correction.get(name, 1.0)
    if observed is not None:
        short = dm.window_average(hist, now_s, cfg.short_window_s)
        # Knative counts at least one pod: with nothing running, a panic means
        # twice what one replica of the best profile serves, not "any traffic".
        panic_cap = cap if cap > 0 else (best_replica_capacity(spec) or 0.0)
        panic = dm.update_panic(panic, short, panic_cap, cfg.panic_threshold, cfg.stable_window_s, now_s)
        if dm.capacity_settled(spec.name, own, panic, now_s, max(cfg.short_window_s, lat_w or 0.0)):
            # against the corrected table, over the span the p99 covers
            util, busy = dm.span_utilization(hist, observed, now_s, lat_w, corr, cap)
            corr, _ = dm.update_correction(
                corr, sig.p99_ms, cfg.slo_p99_ms.get(name), util, sig.latency_is_average, cfg.correction,
                lowest_utilization=busy,
            )
        else:  # a miss refutes an optimistic table even while capacity moves
            corr, _ = dm.relax_optimism(corr, sig.p99_ms, cfg.slo_p99_ms.get(name), cfg.correction)
    est = (
        dm.estimate(hist, panic, now_s, cfg.short_window_s, cfg.long_window_s)
        if observed is not None
        else None
    )
    # The forecaster learns from measured arrivals only: the fast signals' arrivals,
    # else the metrics window's rate unless it is a saturation guess (a guess fed
    # in would ratchet the floor up; the served rate of a saturated model down).
    measured, t_meas, width = fast_arrivals, None, 0.0
    if measured is not None:
        t_meas, width = fast.t_s, fast.window_s
    elif observed is not None and not guess:
        measured, t_meas, width = observed, sig.t_s, cfg.metrics_window_hint_s
    f = state.forecast.get(name, fc.Forecast())
    if measured is not None:
        f = fc.update(f, t_meas, measured, cfg.forecasting)
    # Reaction horizon: how old the newest sample is (half its window, plus its
    # delay), one tick, and a replica start.
    age = (now_s - f.t_s if f.t_s is not None else 0.0) + width / 2
    horizon = max(0.0, age) + cfg.tick_s + cfg.replica_start_s
    out = fc.outlook(f, horizon, cfg.forecasting)
    h = fc.observe(state.headroom.get(name, fc.Headroom()), now_s, measured, out.envelope, horizon,
                   cfg.headroom_learning)
    return Seen(sig, observed, guess, hist, panic, corr, est, n, cap, f, h, measured, out.envelope, horizon,
                 out.recurring)
