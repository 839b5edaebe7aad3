"""The reactive bound's rule as a policy (``sim/windowed.py``): its learned headroom,
its memory, its targets and when it calls the planner; and a whole simulated run."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler.config import parse_cluster, parse_models
from autoscaler.policy.capacity import failed_replicas
from autoscaler.policy.types import (
    ClusterState,
    GpuState,
    ModelSignals,
    ModelSpec,
    Observation,
    Replica,
    ReplicaState,
)
from autoscaler.sim import scenarios as sc
from autoscaler.sim import windowed as wm
from autoscaler.sim.run import POLICIES, SimError, simulate
from autoscaler.sim.traces import Trace

# quantile 0.99 fixed here (not the shipped default): the arithmetic below picks the top sample of ten
CFG = wm.WindowedMaxConfig(window_s=60.0, lag_s=30.0, history_s=600.0, min_samples=4, prior=0.2, hi=1.5, quantile=0.99)
SPEC = ModelSpec(name="m", capacity={"1g.10gb": 100.0, "2g.20gb": 210.0}, allowed_profiles=("1g.10gb", "2g.20gb"))
GPU = GpuState(id="g0", node="n0", product="A100-SXM4-80GB")


def _feed(rates, cfg=CFG, step=10.0):
    w = wm.ModelWindow()
    for k, r in enumerate(rates):
        w = wm.observe(w, k * step, r, cfg)
    return w


def test_headroom_is_the_prior_until_enough_ratios_then_their_quantile_clipped():
    w = _feed([100.0] * 5)  # ratios start once a maximum is lag_s old: t=30, 40 -> 2 ratios
    assert len(w.ratios) == 2 and wm.headroom(w, CFG) == 0.2
    w = _feed([100.0] * 8)
    assert len(w.ratios) == 5
    assert wm.headroom(w, CFG) == pytest.approx(0.0)  # flat: every ratio is 1
    # one rise to 1.6x among ten ratios: the 0.99 quantile is that sample, never above it
    w = _feed([100.0] * 12 + [160.0] + [100.0] * 3)
    assert max(r for _, r in w.ratios) == pytest.approx(1.6)
    assert wm.headroom(w, CFG) == pytest.approx(0.6)
    assert wm.headroom(w, wm.WindowedMaxConfig(**{**CFG.__dict__, "quantile": 0.5})) == pytest.approx(0.0)
    # a 5x rise is clipped at hi
    w = _feed([100.0] * 12 + [500.0])
    assert wm.headroom(w, CFG) == pytest.approx(1.5)


def test_a_rise_is_measured_against_the_maximum_lag_s_earlier_not_the_current_one():
    w = _feed([100.0] * 6 + [300.0])  # t=60: 300 against the max as of t<=30 (100)
    assert w.ratios[-1] == (60.0, pytest.approx(3.0))
    assert w.maxima[-1] == (60.0, 300.0)
    # 20 s later the rule still compares with a maximum from before the rise
    w = wm.observe(w, 70.0, 300.0, CFG)
    assert w.ratios[-1][1] == pytest.approx(3.0)
    # once the rise's own maximum is lag_s old, holding at 300 is a ratio of 1
    w = wm.observe(wm.observe(w, 80.0, 300.0, CFG), 90.0, 300.0, CFG)
    assert w.ratios[-1][1] == pytest.approx(1.0)


def test_memory_is_bounded_and_the_sorted_copy_stays_in_step():
    rng = np.random.default_rng(3)
    w = _feed(list(rng.uniform(50, 150, 300)))
    assert all(t > 2990 - CFG.window_s for t, _ in w.rates)
    assert all(t > 2990 - CFG.history_s for t, _ in w.ratios)
    assert len(w.ratios) == pytest.approx(CFG.history_s / 10, abs=1)
    assert list(w.sorted_ratios) == sorted(r for _, r in w.ratios)
    assert len(w.maxima) <= CFG.lag_s / 10 + 2


def test_a_missing_rate_records_nothing():
    w = _feed([100.0] * 6)
    w2 = wm.observe(w, 60.0, None, CFG)
    assert w2.ratios == w.ratios and w2.rates == tuple(x for x in w.rates if x[0] > 0.0)


def _obs(rate, replicas=(), source_ok=True, now=100.0):
    sig = {"m": ModelSignals(model="m", t_s=now, request_rate=rate)}
    return Observation(t_s=now, cluster=ClusterState((GPU,), tuple(replicas)), models=sig, source_ok=source_ok)


def test_targets_are_headroom_times_the_window_max_and_blind_models_hold_what_runs():
    running = (Replica("m-0", "m", "2g.20gb", "g0", 0, ReplicaState.READY, 0.0),
               Replica("m-1", "m", "1g.10gb", "g0", 2, ReplicaState.STARTING, 0.0),
               Replica("m-2", "m", "1g.10gb", "g0", 3, ReplicaState.FAILED, 0.0))
    st = wm.WindowedMaxState()
    for k, r in enumerate([80.0, 120.0, 90.0]):
        want, st = wm.targets(_obs(r, running, now=10.0 * k), st, [SPEC], CFG, 10.0 * k)
    assert wm.headroom(st.models["m"], CFG) == CFG.prior
    assert want["m"] == pytest.approx(1.2 * 120.0)
    # no rate, or the source down: hold the live replicas' capacity (210 + 100), not the failed one
    want, _ = wm.targets(_obs(None, running, now=30.0), st, [SPEC], CFG, 30.0)
    assert want["m"] == pytest.approx(310.0)
    want, _ = wm.targets(_obs(500.0, running, source_ok=False, now=30.0), st, [SPEC], CFG, 30.0)
    assert want["m"] == pytest.approx(310.0)
    # a non-finite or negative rate is no measurement either
    want, _ = wm.targets(_obs(float("nan"), running, now=30.0), st, [SPEC], CFG, 30.0)
    assert want["m"] == pytest.approx(310.0)


def test_replan_only_when_decide_would():
    ready = ClusterState((GPU,), (Replica("m-0", "m", "2g.20gb", "g0", 0, ReplicaState.READY, 0.0),))
    assert wm.replan(None, {"m": 100.0}, ready, [SPEC], 0.0, CFG)
    last = wm.LastCall(0.0, {"m": 300.0}, failed_replicas(ready))
    assert not wm.replan(last, {"m": 150.0}, ready, [SPEC], 15.0, CFG)  # covered, and recent
    assert not wm.replan(last, {"m": 250.0}, ready, [SPEC], 15.0, CFG)  # short, but the call saw more
    assert wm.replan(last, {"m": 320.0}, ready, [SPEC], 15.0, CFG)  # short of a higher target
    assert wm.replan(last, {"m": 150.0}, ready, [SPEC], CFG.replan_s, CFG)  # periodic
    failed = ClusterState((GPU,), ready.replicas + (Replica("m-1", "m", "1g.10gb", "g0", 3,
                                                             ReplicaState.FAILED, 0.0),))
    assert failed_replicas(failed) == {"m-1"}
    assert wm.replan(last, {"m": 150.0}, failed, [SPEC], 15.0, CFG)  # failed since the last call
    # one the last call already saw is not news: no planner call on every tick for it
    seen = wm.LastCall(0.0, {"m": 300.0}, failed_replicas(failed))
    assert not wm.replan(seen, {"m": 150.0}, failed, [SPEC], 15.0, CFG)


@pytest.mark.parametrize("field,value", [("quantile", 0.0), ("quantile", 1.5), ("window_s", 0.0),
                                         ("lag_s", -1.0), ("min_samples", 0), ("hi", float("inf")),
                                         ("lo", 2.0)])
def test_bad_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        wm.WindowedMaxConfig(**{field: value})


# ------------------------------------------------------------------ in the simulator


def _world(n_models=2, gpus=2):
    fl = sc.fleet(n_models)
    return parse_models({"models": fl}), parse_cluster(sc.cluster(gpus, policy={"tick_s": 15})), fl


def test_in_the_simulator_capacity_follows_a_step_up_and_back_down():
    mc, cc, fl = _world()
    base = {m["name"]: 1.0 * sc.best_slice_rps(m) for m in fl}
    names = list(base)
    t = np.array([0.0, 1200.0, 2400.0])
    rps = np.array([[base[n], 4 * base[n], base[n]] for n in names])
    trace = Trace(t_s=t, models=tuple(names), rps=rps, duration_s=3600.0)
    r = simulate(mc, cc, trace, "windowed-max", warmup_s=600)
    tl = r.timeline
    k = lambda s: int(s / (tl.t_s[1] - tl.t_s[0]))
    for i in range(len(names)):
        # before, during (after the reaction: a repartition and a start) and well after the step,
        # capacity covers demand
        for t0 in (1000.0, 2000.0, 3500.0):
            assert tl.capacity_rps[i, k(t0)] >= tl.demand_rps[i, k(t0)], (names[i], t0)
        # and it came back down once the window had forgotten the high rate
        assert tl.capacity_rps[i, k(3500.0)] < 0.6 * tl.capacity_rps[i, k(2000.0)]
    assert r.errors == []


def test_a_higher_quantile_buys_more_capacity_on_noisy_traffic():
    from autoscaler.sim import traces as tr

    mc, cc, fl = _world()
    means = {m["name"]: 1.5 * sc.best_slice_rps(m) for m in fl}
    trace = tr.generate("heavytail", list(means), 3 * 3600, seed=11, mean_rps=means)
    lo = simulate(mc, cc, trace, "windowed-max", warmup_s=600, baseline_target=0.5)
    hi = simulate(mc, cc, trace, "windowed-max", warmup_s=600, baseline_target=0.999)
    assert hi.gpu_hours > lo.gpu_hours
    assert hi.slo_attainment > lo.slo_attainment


def test_windowed_max_is_named_only_on_purpose():
    assert "windowed-max" not in POLICIES  # not in --policy all nor the policy benchmark
    mc, cc, fl = _world(1, 1)
    trace = Trace(t_s=np.array([0.0]), models=(fl[0]["name"],), rps=np.array([[10.0]]), duration_s=60.0)
    with pytest.raises(SimError, match="windowed-max"):
        simulate(mc, cc, trace, "windowed-maximum")


# ------------------------------------------------------------------ priced like the bound


def test_priced_offline_a_flat_trace_learns_no_headroom_and_serves_everything():
    d = np.full((1, 4000), 70.0)
    cfg = wm.WindowedMaxConfig(min_samples=10)
    att, gpu_h = wm.price_offline(d, np.array([10.0]), 5.0, 7, cfg)
    assert att == 1.0
    # 7 slices = 1 GPU while at the prior (1.2x) for the first 10 ticks plus the lag, 1 GPU after
    exact = 4000 * 5.0 / 3600.0
    assert exact < gpu_h < exact * 1.01


def test_priced_offline_never_beats_the_hindsight_bound_and_cannot_see_a_rise_coming():
    from autoscaler.sim import baselines as bl

    rng = np.random.default_rng(7)
    d = np.exp(rng.normal(0.0, 0.4, size=(3, 3000))) * np.array([[50.0], [120.0], [300.0]])
    rates = np.array([10.0, 20.0, 40.0])
    for q in (0.5, 0.9, 0.99):
        att, gpu_h = wm.price_offline(d, rates, 5.0, 7, wm.WindowedMaxConfig(quantile=q, min_samples=20))
        bound = bl.reactive_frontier(d, rates, 5.0, 7, 45.0, 300.0, [round(att, 6) - 1e-6])
        assert gpu_h >= bound[round(att, 6) - 1e-6] * (1 - 1e-9), q
    # a flat trace with one sudden 5x step: the step is missed for the lag, whatever the headroom
    flat = np.full((1, 2000), 100.0)
    flat[0, 1500:] = 500.0
    att, _ = wm.price_offline(flat, np.array([10.0]), 5.0, 7, wm.WindowedMaxConfig(quantile=1.0, hi=10.0))
    lag_steps = 45.0 / 5.0
    missed_at_least = lag_steps * (500.0 - 100.0) / flat.sum()
    assert 1.0 - att >= missed_at_least * 0.99


def test_cli_simulates_windowed_max_by_name_and_all_leaves_it_out(tmp_path):
    import json

    import yaml
    from typer.testing import CliRunner

    from autoscaler.cli import app
    from autoscaler.sim import traces as tr

    fl = sc.fleet(2)
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": fl}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(2, policy={"tick_s": 15})))
    means = {m["name"]: sc.best_slice_rps(m) for m in fl}
    tr.write_csv(tr.generate("diurnal", list(means), 1200, seed=1, mean_rps=means), tmp_path / "t.csv")
    args = ["simulate", str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"), str(tmp_path / "t.csv"),
            "--json", "--warmup-s", "300"]
    res = CliRunner().invoke(app, [*args, "--policy", "windowed-max"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert 0 < out["gpu_hours"] and set(out["per_model"]) == set(means) and out["ticks"] > 0
    res = CliRunner().invoke(app, [*args, "--policy", "all"])
    assert res.exit_code == 0, res.output
    ran = json.loads(res.output.strip().splitlines()[-1])["policies"]
    assert "migscale" in ran and "windowed-max" not in ran


def test_priced_in_whole_replicas_rounds_capacity_up_and_holds_the_floor():
    d = np.full((1, 4000), 70.0)
    cfg = wm.WindowedMaxConfig(min_samples=10)
    rate = np.array([10.0])  # req/s per compute slice: a 100 req/s replica is 10 slices
    exact_gpu_h = 4000 * 5.0 / 3600.0 / 7
    att, frac = wm.price_offline(d, rate, 5.0, 7, cfg)
    one = wm.Replicas(rps=np.array([100.0]), slices=np.array([10.0]), floor=np.array([0.0]))
    att_w, whole = wm.price_offline(d, rate, 5.0, 7, cfg, replicas=one)
    assert att == att_w == 1.0
    assert 7 * exact_gpu_h <= frac < 7 * exact_gpu_h * 1.01  # 70 req/s = 7 slices
    assert 10 * exact_gpu_h <= whole < 10 * exact_gpu_h * 1.001  # one whole replica, always
    _, two = wm.price_offline(d, rate, 5.0, 7, cfg, replicas=one._replace(floor=np.array([2.0])))
    assert two == pytest.approx(2 * whole)


def test_priced_through_queues_meets_a_p99_target_at_capacity_and_pays_for_a_late_step():
    cfg = wm.WindowedMaxConfig(min_samples=10, hi=0.0)  # no headroom: capacity = what was seen
    rep = wm.Replicas(rps=np.array([100.0]), slices=np.array([10.0]), floor=np.array([1.0]), slo_ms=np.array([50.0]))
    at_capacity = np.full((1, 4000), 100.0)
    att, _ = wm.price_offline(at_capacity, np.array([10.0]), 5.0, 7, cfg, replicas=rep)
    assert att == pytest.approx(0.99, abs=1e-3)  # a replica at its capacity-at-SLO: 99% within
    # a 2.5x step: a rule 45 s late misses the excess for 9 steps without queues; with them, the
    # backlog it builds makes requests late after capacity has arrived too
    step = np.full((1, 2000), 80.0)
    step[0, 1500:] = 200.0
    whole = wm.Replicas(rps=np.array([100.0]), slices=np.array([10.0]), floor=np.array([1.0]))
    queued = whole._replace(slo_ms=np.array([50.0]))
    a_whole, g_whole = wm.price_offline(step, np.array([10.0]), 5.0, 7, cfg, replicas=whole)
    a_queued, g_queued = wm.price_offline(step, np.array([10.0]), 5.0, 7, cfg, replicas=queued)
    missed_excess = 9 * (200.0 - 100.0) / step.sum()
    assert 1.0 - a_whole == pytest.approx(missed_excess, rel=0.05)
    assert g_queued == g_whole and 1.0 - a_queued > 1.0 - a_whole + missed_excess
    # queues that shed what waited past the SLO: at the same GPU-hours, they win back more than
    # the excess of what the backlog cost
    a_shed, g_shed = wm.price_offline(step, np.array([10.0]), 5.0, 7, cfg,
                                      replicas=queued._replace(queue_timeout_s=np.array([0.05])))
    assert g_shed == g_queued and a_shed - a_queued > missed_excess
    # reacting one step late instead of 45 s: the same rule wins back more than the excess
    a_fast, _ = wm.price_offline(step, np.array([10.0]), 5.0, 7, cfg, replicas=queued, react_s=5.0)
    assert a_fast - a_queued > missed_excess
    with pytest.raises(ValueError, match="react_s"):
        wm.price_offline(step, np.array([10.0]), 5.0, 7, cfg, react_s=-1.0)
