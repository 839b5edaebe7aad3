"""The reactive bound (``sim/baselines.py: reactive_frontier``): what a windowed-max
reactive rule needs, in GPU-hours, to reach an attainment target -- checked against
hand-derived cases and against a step-by-step replay of the rule itself."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autoscaler.config import model_specs, parse_cluster, parse_models
from autoscaler.mig import get_product
from autoscaler.sim import baselines as bl
from autoscaler.sim import scenarios as sc

PRODUCT = "A100-SXM4-80GB"
STEP_S = 5.0


def _replay(d, rate, lag_s, window_s, h, floor=0.0, step_s=STEP_S, per_gpu=7):
    """The rule for one model, step by step, written independently of the vectorised code:
    (GPU-hours, missed req/s-steps, total req/s-steps)."""
    lag = math.floor(lag_s / step_s + 1e-9)
    w = max(1, round(window_s / step_s))
    slices = missed = 0.0
    for k in range(len(d)):
        seen = max(d[max(j, 0)] for j in range(k - lag - w + 1, k - lag + 1))  # before t = 0: the first rate
        cap = max((1 + h) * seen, floor * rate)
        slices += cap / rate
        missed += max(d[k] - cap, 0.0)
    return slices * step_s / 3600 / per_gpu, missed, float(np.sum(d))


def _bursty(rng, n, base):
    """A positive trace with slow drift and short bursts, so the headroom matters."""
    d = base * np.exp(0.3 * np.cumsum(rng.normal(0, 0.05, n)))
    bursts = rng.random(n) < 0.02
    d[bursts] *= rng.uniform(1.5, 3.0, bursts.sum())
    return d


def _specs(n=3):
    models = parse_models({"models": sc.fleet(n)})
    return model_specs(models, parse_cluster(sc.cluster(2)))


# ------------------------------------------------------------------ hand-derived cases


@pytest.mark.parametrize("lag_s", [0.0, 5.0, 45.0, 600.0])
@pytest.mark.parametrize("window_s", [5.0, 300.0])
def test_constant_demand_at_full_attainment_costs_exactly_the_oracle(lag_s, window_s):
    # a reactive rule sees the same rate it will get, so h = 0 is enough and nothing less is
    specs = _specs()
    rates, floors = bl.slice_rates(specs, PRODUCT)
    d = np.repeat((rates * np.array([2.5, 4.0, 0.7]))[:, None], 400, axis=1)  # the last one sits on its floor
    oracle_gpu_h, _ = bl.oracle_hours(specs, d, STEP_S, PRODUCT)
    got = bl.reactive_frontier(d, rates, STEP_S, get_product(PRODUCT).compute_slices, lag_s, window_s, [1.0],
                               floor_slices=floors)
    assert got[1.0] == pytest.approx(oracle_gpu_h, rel=1e-9)


@pytest.mark.parametrize("target", [0.9, 0.99, 0.999])
def test_constant_demand_below_full_attainment_under_provisions_by_the_allowed_misses(target):
    # capacity (1 + h) c with h < 0 misses -h of every request: the cheapest rule at target t is h = t - 1
    d = np.full((2, 300), 120.0)
    rates = np.array([40.0, 40.0])
    oracle = d.sum() / 40.0 * STEP_S / 3600 / 7
    got = bl.reactive_frontier(d, rates, STEP_S, 7, 45.0, 300.0, [target])
    assert got[target] == pytest.approx(target * oracle, rel=1e-9)
    # with headroom only >= 0 it cannot under-provision, and pays the oracle
    pos = bl.reactive_frontier(d, rates, STEP_S, 7, 45.0, 300.0, [target], headroom_grid=[0.0, 0.5, 1.0])
    assert pos[target] == pytest.approx(oracle, rel=1e-9)


def test_a_target_the_rule_cannot_see_coming_is_unreachable():
    # 0 req/s, then 5 req/s; with a 10 s lag the first two steps of the jump are blind whatever h is:
    # 10 of 500 req/s-steps missed, so 98% attainment at best
    d = np.concatenate([np.zeros(100), np.full(100, 5.0)])[None, :]
    got = bl.reactive_frontier(d, np.array([10.0]), STEP_S, 7, 10.0, 60.0, [0.97, 0.98, 0.99, 1.0])
    assert got[0.99] is None and got[1.0] is None
    assert got[0.97] is not None and got[0.98] is not None
    # no lag: the rule sees the step it serves
    assert bl.reactive_frontier(d, np.array([10.0]), STEP_S, 7, 0.0, 60.0, [1.0])[1.0] is not None
    # a floor that already serves 5 req/s covers the blind steps
    assert bl.reactive_frontier(d, np.array([10.0]), STEP_S, 7, 10.0, 60.0, [1.0],
                                floor_slices=np.array([0.5]))[1.0] is not None


def test_a_headroom_grid_too_small_for_the_target_is_unreachable():
    d = np.tile(np.r_[np.full(50, 100.0), np.full(50, 300.0)], 4)[None, :]
    got = bl.reactive_frontier(d, np.array([50.0]), STEP_S, 7, 45.0, 60.0, [0.999], headroom_grid=[0.0, 0.2])
    assert got[0.999] is None
    assert bl.reactive_frontier(d, np.array([50.0]), STEP_S, 7, 45.0, 60.0, [0.999])[0.999] is not None


# ------------------------------------------------------------------ orderings


def test_a_longer_lag_needs_more_gpu_hours_on_a_step_trace():
    # a square wave, 100 <-> 300 req/s every 10 min: the longer the rule is blind after a rise,
    # the more headroom it must hold the rest of the time
    d = np.tile(np.r_[np.full(120, 100.0), np.full(120, 300.0)], 8)[None, :]
    for target in (0.99, 0.999):
        hours = [bl.reactive_frontier(d, np.array([50.0]), STEP_S, 7, lag, 300.0, [target])[target]
                 for lag in (5.0, 45.0, 120.0)]
        assert None not in hours
        assert hours[0] < hours[1] < hours[2], (target, hours)


def test_a_higher_target_never_needs_fewer_gpu_hours():
    rng = np.random.default_rng(7)
    d = np.stack([_bursty(rng, 2000, b) for b in (50.0, 200.0, 800.0)])
    d[2, 500:600] = 0.0  # a gap longer than lag + window, then a restart the rule is blind to
    targets = [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999, 1.0]
    got = bl.reactive_frontier(d, np.array([30.0, 45.0, 60.0]), STEP_S, 7, 45.0, 300.0, targets,
                               floor_slices=np.array([1.0, 1.0, 2.0]))
    values = [got[t] for t in targets]
    reached = [v for v in values if v is not None]
    assert len(reached) >= 5
    assert values[: len(reached)] == reached, values  # None only at the top
    assert all(a <= b for a, b in itertools.pairwise(reached)), values
    assert values[-1] is None  # the restart after the gap is blind


# ------------------------------------------------------------------ against the rule itself


@pytest.mark.parametrize("lag_s,window_s", [(45.0, 300.0), (5.0, 60.0), (60.0, 5.0)])
def test_without_a_floor_the_answer_is_reached_by_the_rule(lag_s, window_s):
    # find the headroom whose GPU-hours equal the answer (they rise with h) and replay the rule there
    rng = np.random.default_rng(3)
    d = _bursty(rng, 600, 100.0)
    rate = 40.0
    for target in (0.99, 0.999):
        best = bl.reactive_frontier(d[None, :], np.array([rate]), STEP_S, 7, lag_s, window_s,
                                    [target])[target]
        assert best is not None
        lo, hi = -0.5, 10.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _replay(d, rate, lag_s, window_s, mid)[0] < best else (lo, mid)
        gpu_h, missed, total = _replay(d, rate, lag_s, window_s, hi)
        assert gpu_h == pytest.approx(best, rel=1e-6)
        assert 1 - missed / total >= target - 1e-6


@pytest.mark.parametrize("floor", [0.0, 2.0])
def test_the_answer_is_at_most_every_grid_choice_that_reaches_the_target(floor):
    # two models, every pair of headrooms on a coarse grid, replayed step by step
    rng = np.random.default_rng(11)
    d = np.stack([_bursty(rng, 400, 80.0), _bursty(rng, 400, 300.0)])
    rates = np.array([40.0, 90.0])
    grid = np.round(np.arange(0, 31) * 0.1, 10)
    curves = [[_replay(d[i], rates[i], 45.0, 120.0, h, floor) for h in grid] for i in range(2)]
    total = d.sum()
    for target in (0.98, 0.995, 0.999):
        pairs = [(a[0] + b[0], a[1] + b[1]) for a in curves[0] for b in curves[1]]
        brute = min((g for g, missed in pairs if 1 - missed / total >= target), default=None)
        got = bl.reactive_frontier(d, rates, STEP_S, 7, 45.0, 120.0, [target], headroom_grid=grid,
                                   floor_slices=np.array([floor, floor]))[target]
        assert brute is not None and got is not None
        assert got <= brute + 1e-9, (target, got, brute)
        # and a finer grid can only help
        finer = bl.reactive_frontier(d, rates, STEP_S, 7, 45.0, 120.0, [target],
                                     floor_slices=np.array([floor, floor]))[target]
        assert finer <= got + 1e-9


def test_slice_rates_price_a_slice_at_the_most_efficient_profile():
    specs = _specs(4)
    rates, floors = bl.slice_rates(specs, PRODUCT)
    prod = get_product(PRODUCT)
    for s, r, f in zip(specs, rates, floors):
        p = bl.best_profile(s, PRODUCT)  # every profile is allowed in the scenario fleet
        assert r == pytest.approx(s.capacity[p] / prod.profiles[p].compute)
        assert f >= s.min_replicas


# ------------------------------------------------------------------ input errors


_OK = {"demand_rps": np.ones((2, 10)), "per_slice_rps": np.array([1.0, 2.0]), "step_s": 5.0,
       "slices_per_gpu": 7, "lag_s": 45.0, "window_s": 300.0, "targets": [0.99]}


@pytest.mark.parametrize("arg,value,shown", [
    ("demand_rps", np.ones(10), "(10,)"),
    ("demand_rps", np.ones((2, 0)), "(2, 0)"),
    ("demand_rps", np.array([[1.0, -2.0], [1.0, 1.0]]), "-2.0"),
    ("demand_rps", np.array([[1.0, np.nan], [1.0, 1.0]]), "nan"),
    ("per_slice_rps", np.array([1.0]), "(1,)"),
    ("per_slice_rps", np.array([1.0, 0.0]), "0.0"),
    ("step_s", 0.0, "0.0"),
    ("slices_per_gpu", 0, "0"),
    ("slices_per_gpu", 7.0, "7.0"),
    ("lag_s", -5.0, "-5.0"),
    ("window_s", 0.0, "0.0"),
    ("window_s", math.inf, "inf"),
    ("targets", [], "none"),
    ("targets", [0.99, 1.5], "1.5"),
    ("targets", [0.0], "0.0"),
    ("floor_slices", np.array([1.0]), "(1,)"),
    ("floor_slices", np.array([1.0, -1.0]), "-1.0"),
    ("headroom_grid", [], "(0,)"),
    ("headroom_grid", [0.0, -1.0], "-1.0"),
])
def test_bad_input_is_a_value_error_naming_the_argument_and_value(arg, value, shown):
    kwargs = {**_OK, arg: value}
    with pytest.raises(ValueError, match=f"^{arg}:") as err:
        bl.reactive_frontier(**kwargs)
    assert shown in str(err.value)
