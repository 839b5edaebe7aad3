"""Property tests (hypothesis) for ``decide`` over random tick sequences, with the real planner.

Each example is a short run: a small fleet, a few models, and ticks whose
signals are fresh (with or without latency, a partial count of reporting
replicas, the burst layer's fast signals), absent, stale, invalid, or
unreadable (the metrics source down). The plan's actions are carried out at
once between ticks; new replicas may still be starting at the next tick, one
may crash-loop, and the controller may restart with its state gone. Each tick:

- a model without fresh data, or on a partial picture, never loses capacity,
  nor does any model on the first tick after a restart (missing data is never zero);
- every model stays within its replica bounds and every layout is valid;
- what ``decide`` asks and reports is finite and not negative;
- what ``PolicyState`` keeps per model stays within its windows, so a long
  run's memory is bounded by the configuration, not by its length.

The same ticks from the same start give the same plans (``decide`` is pure), and
three calm hours after them the plans settle rather than move a model back and forth.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.mig import get_product
from autoscaler.mig.layout import check_layout
from autoscaler.policy.capacity import current_capacity
from autoscaler.policy.decide import decide
from autoscaler.policy.planner import apply_plan_to_cluster
from autoscaler.policy.state import PolicyConfig, PolicyState
from autoscaler.policy.types import (
    ClusterState,
    FastSignals,
    GpuState,
    ModelSignals,
    ModelSpec,
    Observation,
    Reason,
    ReplicaState,
)

A100 = "A100-SXM4-80GB"
# PLANNER_EXAMPLES also deepens this file (`make props-deep`): an example here is some forty
# ticks and three calm hours, so it runs a quarter of the planner tests' count (25 by default).
EXAMPLES = max(25, int(os.environ.get("PLANNER_EXAMPLES", "100")) // 4)
CALM_TICKS = 180
PER_SLICE = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}


@st.composite
def fleets(draw):
    n_models = draw(st.integers(1, 3))
    specs = []
    for i in range(n_models):
        base = draw(st.floats(20, 200))
        lo = draw(st.integers(0, 2))
        specs.append(ModelSpec(
            name=f"m{i}",
            capacity={p: round(base * k, 1) for p, k in PER_SLICE.items()},
            allowed_profiles=tuple(draw(st.lists(st.sampled_from(tuple(PER_SLICE)), min_size=1, unique=True))),
            min_replicas=lo,
            max_replicas=draw(st.integers(max(lo, 1), 6)),
            priority=draw(st.integers(0, 2)),
            high_availability=draw(st.booleans()),
        ))
    gpus = tuple(GpuState(f"node/{g}", "node", A100) for g in range(draw(st.integers(1, 3))))
    cfg = PolicyConfig(
        models=tuple(specs),
        slo_p99_ms={s.name: 100.0 for s in specs},
        tick_s=10.0,
        short_window_s=draw(st.sampled_from((10.0, 30.0))),
        long_window_s=draw(st.sampled_from((30.0, 60.0))),
        metrics_stale_s=60.0,
        repartition_s=draw(st.sampled_from((0.0, 180.0))),
        rightsize_window_s=draw(st.sampled_from((None, 120.0, 1800.0))),
        headroom_quantile=draw(st.sampled_from((None, 0.9))),
        churn_budget=draw(st.sampled_from((None, 1, 3))),
    )
    return cfg, gpus


# per model and tick: a fresh rate (with or without latency, a count of the replicas
# that reported, and the burst layer's fast signals), nothing, a sample older than
# metrics_stale_s, or a value no source should pass on
FRESH = st.fixed_dictionaries({
    "rate": st.floats(0, 1500),
    "p99_ms": st.none() | st.floats(1, 1000),
    "reported": st.none() | st.integers(0, 6),  # capped at the live count
    "fast": st.none() | st.tuples(st.floats(0, 3000), st.floats(0, 200), st.sampled_from((0.0, 2.0, 30.0))),
})
SIGNAL = st.one_of(
    st.tuples(st.just("rate"), FRESH),
    st.tuples(st.just("none"), st.none()),
    st.tuples(st.just("stale"), FRESH),
    st.tuples(st.just("invalid"), st.sampled_from((math.nan, math.inf, -5.0))),
)
TICK = st.tuples(
    st.sampled_from((10.0, 10.0, 10.0, 1.0, 45.0, 200.0)),  # seconds since the last tick
    st.booleans().map(lambda down: not down) | st.just(True),  # source readable
    st.lists(SIGNAL, min_size=3, max_size=3),
    st.integers(0, 19).map(lambda k: k == 0),  # the controller restarted: its state is gone
    st.booleans(),  # replicas created since the last tick are ready now (else still starting)
    st.none() | st.integers(0, 50),  # this replica (by index, if there is one) is crash-looping
)


def _signals(name: str, kind: str, drawn, now: float, live: int, stale_s: float) -> ModelSignals | None:
    if kind == "none":
        return None
    if kind == "invalid":
        return ModelSignals(name, now, request_rate=drawn)
    t = now if kind == "rate" else now - stale_s - 5
    fast = None
    if drawn["fast"] is not None:
        arrivals, pending, age = drawn["fast"]
        fast = FastSignals(t - age, 2.0, arrival_rps=arrivals, completed_rps=min(arrivals, drawn["rate"]),
                           pending=pending)
    reported = None if drawn["reported"] is None else min(drawn["reported"], live)
    return ModelSignals(name, t, request_rate=drawn["rate"], p99_ms=drawn["p99_ms"],
                        ready_replicas=reported, fast=fast)


def _world(cluster: ClusterState, started: bool, crash: int | None) -> ClusterState:
    """Between ticks: starting replicas become ready (or not yet), and one may crash-loop."""
    reps = list(cluster.replicas)
    if started:
        reps = [replace(r, state=ReplicaState.READY) if r.state is ReplicaState.STARTING else r for r in reps]
    if crash is not None and crash < len(reps):
        reps[crash] = replace(reps[crash], state=ReplicaState.CRASHLOOP)
    return replace(cluster, replicas=tuple(reps))


def _created_starting(cluster: ClusterState, before: set[str]) -> ClusterState:
    return replace(cluster, replicas=tuple(
        r if r.id in before else replace(r, state=ReplicaState.STARTING) for r in cluster.replicas))


def _live(cfg: PolicyConfig, cluster: ClusterState) -> dict[str, tuple[int, float]]:
    """Per model: live replicas (starting or ready) and their req/s."""
    return {s.name: current_capacity(s, cluster)[:2] for s in cfg.models}


def _kept_within(cfg: PolicyConfig, state: PolicyState, now_s: float, gap_s: float) -> list[str]:
    """Entries older than the longest window the state needs, plus one tick's gap."""
    windows = (cfg.long_window_s, cfg.short_window_s, cfg.rightsize_window_s or 0.0,
               cfg.scale_up.stabilization_window_s, cfg.scale_down.stabilization_window_s,
               *(p.period_s for p in (*cfg.scale_up.policies, *cfg.scale_down.policies)),
               cfg.headroom_learning.window_s)
    oldest = now_s - max(windows) - gap_s - cfg.tick_s
    bad = []
    for name, hist in state.demand.items():
        bad += [f"demand {name} @{s.t_s}" for s in hist if s.t_s < oldest]
    for name, recs in state.recommendations.items():
        bad += [f"recommendation {name} @{r.t_s}" for r in recs if r.t_s < oldest]
    for name, evs in state.scale_events.items():
        bad += [f"scale event {name} @{e.t_s}" for e in evs if e.t_s < oldest]
    for name, pk in state.required_peaks.items():
        bad += [f"peak {name} @{t}" for t, _ in pk if t < oldest]
    for name, h in state.headroom.items():
        bad += [f"headroom ratio {name} @{t}" for t, _ in h.ratios if t < oldest]
        bad += [f"headroom open {name} @{t}" for t, _, _ in h.open if t < oldest]
    return bad


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
@given(fleets(), st.lists(TICK, min_size=5, max_size=40))
def test_decide_over_random_ticks_keeps_its_promises(fleet, ticks):
    first = _run(*fleet, ticks)
    # decide is pure: the same observations from the same start make the same plans
    assert _run(*fleet, ticks) == first
    # Then three hours of calm (each model's last fresh rate, every replica ready, a tick a
    # minute): the plans settle. The learned headroom and the forecast may still move a
    # model a few times (the rises of the random ticks stay in the headroom's window), but
    # a model moving between two layouts would act on a tick in every few.
    last = {}
    for _gap, _ok, signals, *_ in ticks:
        for spec, (kind, drawn) in zip(fleet[0].models, signals):
            if kind in ("rate", "stale"):
                last[spec.name] = drawn["rate"]
    steady = [("rate", {"rate": last.get(s.name, 0.0), "p99_ms": None, "reported": None, "fast": None})
              for s in fleet[0].models]
    calm = _run(*fleet, ticks + [(60.0, True, steady, False, True, None)] * CALM_TICKS)[len(ticks):]
    busy = [i for i, (actions, _, _) in enumerate(calm) if actions]
    assert len(busy) <= CALM_TICKS // 10, busy


def _run(cfg: PolicyConfig, gpus: tuple[GpuState, ...], ticks) -> list:
    product = get_product(A100)
    cluster, state, now, out = ClusterState(gpus=gpus), PolicyState(), 0.0, []
    for gap, source_ok, signals, restart, started, crash in ticks:
        now += gap
        if restart:
            state = PolicyState()
        cluster = _world(cluster, started, crash)
        live = _live(cfg, cluster)
        counts = {name: n for name, (n, _) in live.items()}
        before = {name: cap for name, (_, cap) in live.items()}
        models, blind, partial = {}, set(), set()
        for spec, (kind, drawn) in zip(cfg.models, signals):
            models[spec.name] = _signals(spec.name, kind, drawn, now, counts[spec.name], cfg.metrics_stale_s)
            if kind != "rate" or not source_ok:
                blind.add(spec.name)
            elif drawn["reported"] is not None and drawn["reported"] < counts[spec.name]:
                partial.add(spec.name)
        before_ids = {r.id for r in cluster.replicas}
        obs = Observation(now, cluster, models=models, source_ok=source_ok)
        plan, state = decide(obs, state, cfg, now)
        cluster = _created_starting(apply_plan_to_cluster(cluster, plan), before_ids)
        live_after = _live(cfg, cluster)
        after = {name: cap for name, (_, cap) in live_after.items()}
        out.append((plan.actions, dict(plan.target_rps), dict(plan.reasons)))

        # never down on a partial picture, nor on the first tick after a restart (HPA
        # seeds a new target's history with its current count)
        for name in blind | partial | (set(before) if restart else set()):
            assert after[name] >= before[name] - 1e-6, (name, before[name], after[name], plan.reasons[name])
        for name in blind:
            # below its floor a model is raised to it first (HPA clamps before any metric)
            said = Reason.MIN_REPLICAS if counts[name] < cfg.spec(name).min_replicas else Reason.HOLD_MISSING_METRICS
            assert said in plan.reasons[name], (name, plan.reasons[name])
        short = any(Reason.SHORTFALL in r for r in plan.reasons.values())
        for spec in cfg.models:
            n = live_after[spec.name][0]
            assert n <= spec.max_replicas, (spec.name, n)
            # A short fleet is shared by priority (test_fleet_share.py); a churn budget may
            # hold a create for a tick while the delete whose room it needs goes first.
            if not short and Reason.CHURN_BUDGET not in plan.reasons[spec.name]:
                assert n >= spec.min_replicas, (spec.name, n, plan.reasons[spec.name])
            t = plan.target_rps.get(spec.name)
            assert t is not None and math.isfinite(t) and t >= 0, (spec.name, t)
            d = state.diagnostics[spec.name]
            for f in ("required_rps", "floor_rps", "burst_rps", "hold_rps", "rise_rps", "forecast_rps", "headroom"):
                v = getattr(d, f)
                assert v is None or (math.isfinite(v) and v >= 0), (spec.name, f, v)
        for g in cluster.gpus:
            assert not check_layout(product, g.layout), g
        assert not _kept_within(cfg, state, now, gap)
    return out
