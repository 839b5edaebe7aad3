"""Simulator: the queue model against a per-request simulation, the simulated
cluster's actuator/metrics semantics, reproducibility, the oracle bound and an
end-to-end migscale run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.clock import VirtualClock
from autoscaler.config import parse_cluster, parse_models
from autoscaler.mig import Placement
from autoscaler.policy.types import (
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    Replica,
    ReplicaState,
)
from autoscaler.sim import queueing as q
from autoscaler.sim import scenarios as sc
from autoscaler.sim import traces as tr
from autoscaler.sim.cluster import SimCluster, SimConfig
from autoscaler.sim.run import POLICIES, largest_spike, recovery_s, simulate

# ------------------------------------------------------------------ queue model vs discrete-event


@pytest.mark.parametrize("load", [0.5, 0.8, 0.95])
def test_fluid_p99_matches_discrete_event_in_steady_state(load):
    cap, slo_ms = 300.0, 50.0
    mu = q.service_rate(cap, slo_ms)
    lam = np.full(300, load * cap)
    # tails are autocorrelated (busy periods): pool a few independent runs
    pooled = [soj[arr > 10] for arr, soj in (q.des_mm1_sojourns(lam, 1.0, mu, seed=s) for s in range(3))]
    des_p99 = np.quantile(np.concatenate(pooled), 0.99)  # skip the empty start
    x = np.array(q.stationary_x(load * cap, mu))
    fluid_p99 = float(q.quantile_s(x, np.array(mu), 0.99))
    assert fluid_p99 == pytest.approx(des_p99, rel=0.10)


def test_capacity_at_slo_means_p99_equals_slo():
    mu = q.service_rate(300.0, 50.0)
    x = np.array(q.stationary_x(300.0, mu))
    assert float(q.quantile_s(x, np.array(mu), 0.99)) == pytest.approx(0.050)
    assert float(q.within_slo(x, np.array(mu), 0.05)) == pytest.approx(0.99)


def test_fluid_overload_transient_matches_discrete_event():
    """0.5C for 60 s, 1.3C for 20 s, 0.5C for 120 s: SLO misses within 20% of the per-request mean."""
    cap, slo = 300.0, 0.05
    mu = q.service_rate(cap, slo * 1000)
    lam = np.concatenate([np.full(60, 0.5 * cap), np.full(20, 1.3 * cap), np.full(120, 0.5 * cap)])
    des = []
    for seed in range(4):
        tot, ok = q.des_mm1(lam, 1.0, mu, slo, seed=seed)
        des.append(tot.sum() - ok.sum())
    for step in (1.0, 5.0):  # the simulator's step must not matter much
        lam_s = lam.reshape(-1, int(step)).mean(axis=1)
        ft, fo = q.fluid_mm1(lam_s, step, mu, slo)
        assert ft.sum() - fo.sum() == pytest.approx(np.mean(des), rel=0.20)


def test_implicit_step_is_stable_and_exact_at_equilibrium():
    mu = np.array([1000.0])
    x_eq = q.stationary_x(800.0, 1000.0)
    x = q.step_x(np.array([0.0]), np.array([800.0]), mu, 15.0)  # a huge step
    assert x[0] == pytest.approx(x_eq, rel=0.01)
    assert q.step_x(np.array([x_eq]), np.array([800.0]), mu, 5.0)[0] == pytest.approx(x_eq)
    # overload grows the queue by about (lam - mu) per second
    x2 = q.step_x(np.array([10.0]), np.array([1200.0]), mu, 1.0)
    assert 195 < x2[0] - 10 < 210


# ------------------------------------------------------------------ the simulated cluster

SPEC = ModelSpec("m", {"1g.10gb": 100.0, "3g.40gb": 300.0, "7g.80gb": 600.0},
                 ("1g.10gb", "3g.40gb", "7g.80gb"))


TWO_3G = (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))


def _cluster(layout=TWO_3G, **cfg) -> tuple[SimCluster, VirtualClock]:
    clock = VirtualClock(0.0)
    gpu = GpuState("n/0", "n", "A100-SXM4-80GB", layout)
    c = SimCluster([SPEC], {"m": 50.0}, ClusterState((gpu,), ()), clock, SimConfig(**cfg))
    return c, clock


def _create(start=0, profile="3g.40gb", rid=None):
    return Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", profile=profile, start=start,
                  replica=rid)


def test_replica_starts_after_delay_and_serves():
    c, _ = _cluster(start_delay_s=30)
    assert c.apply([_create(rid="a")]) == []
    assert c.snapshot().replicas[0].state == ReplicaState.STARTING and c.converging()
    for _ in range(6):
        c.advance(np.array([100.0]))
    assert c.snapshot().replicas[0].state == ReplicaState.READY
    assert not c.converging()
    c.advance(np.array([100.0]))
    assert c.capacity[-1][0] == 300.0


def test_without_the_in_flight_hook_everything_is_busy_while_anything_converges():
    # the global gate that benchmarks/policies.py --diagnose compares the per-GPU answer with
    c, _ = _cluster(start_delay_s=30, drain_s=5, in_flight_hook=False)
    assert c.in_flight() == (frozenset(), frozenset())
    c.apply([_create(rid="a")])
    assert c.in_flight() == (frozenset({"n/0"}), frozenset({"m"}))  # only STARTING, yet all of it waits
    for _ in range(6):
        c.advance(np.array([100.0]))
    assert c.in_flight() == (frozenset(), frozenset())
    c, _ = _cluster(start_delay_s=30)
    c.apply([_create(rid="a")])
    assert c.in_flight() == (frozenset(), frozenset())  # with the hook: a start is not in flight


def _ready_cluster(**kw) -> SimCluster:
    clock = VirtualClock(0.0)
    gpu = GpuState("n/0", "n", "A100-SXM4-80GB", TWO_3G)
    rep = Replica("r0", "m", "3g.40gb", "n/0", 0, ReplicaState.READY, 0.0)
    return SimCluster([SPEC], {"m": 50.0}, ClusterState((gpu,), (rep,)), clock, SimConfig(step_s=1.0), **kw)


def test_phase_quantile_equals_the_stationary_p99_and_counts_failures():
    c = _ready_cluster(record_sojourns=True)
    for _ in range(200):
        c.advance(np.array([200.0]))
    mu = q.service_rate(300.0, 50.0)
    assert c.sojourn_quantile("m", 100, 200, 0.99) == pytest.approx(np.log(100) / (mu - 200.0), rel=1e-6)
    assert c.sojourn_quantile("m", 100, 200, 0.5) < c.sojourn_quantile("m", 100, 200, 0.99)
    assert c.sojourn_quantile("m", 500, 600, 0.99) is None  # nobody arrived then
    # overload past the queue timeout: >1% dropped, so the 99th percentile never finishes
    c2 = _ready_cluster(record_sojourns=True)
    for _ in range(60):
        c2.advance(np.array([2000.0]))
    assert c2.sojourn_quantile("m", 0, 60, 0.99) == float("inf")
    with pytest.raises(ValueError, match="record_sojourns"):
        _ready_cluster().sojourn_quantile("m", 0, 10, 0.99)


def test_measured_service_rate_overrides_the_table_for_the_world_only():
    slow = _ready_cluster(service_rps={"m": {"3g.40gb": 250.0}}, record_sojourns=True)
    table = _ready_cluster(record_sojourns=True)
    for c in (slow, table):
        for _ in range(100):
            c.advance(np.array([200.0]))
    # the table still reports 300 req/s of capacity (the policy's belief) ...
    assert slow.capacity[-1][0] == table.capacity[-1][0] == 300.0
    # ... but the world serves at the measured rate: slower, so a longer tail
    assert slow.sojourn_quantile("m", 50, 100, 0.99) == pytest.approx(np.log(100) / 50.0, rel=1e-6)
    assert slow.sojourn_quantile("m", 50, 100, 0.99) > table.sojourn_quantile("m", 50, 100, 0.99)


# A batching replica measured under Poisson arrivals (offered req/s, p99 ms): the emulated
# resnet on a 1g slice, max batch 8; its batcher keeps the p99 nearly flat up to saturation.
BATCHER_POINTS = [(40.4, 146.9, None), (45.4, 153.1, None), (50.5, 169.5, None), (60.6, 198.3, None),
                  (80.8, 475.3, None)]
BATCHER_SATURATION = 80.8


def _settle(curve, lam, seconds=600.0, dt=1.0):
    x = np.zeros(1)
    for _ in range(int(seconds / dt)):
        mu = q.curve_rates([curve], np.array([curve.mu[0]]), x, np.array([lam]), dt)
        x = q.step_x(x, np.array([lam]), mu, dt)
    return x, curve.rate(x)


def test_a_service_curve_holds_every_measured_p99_as_a_stationary_state():
    curve = q.ServiceCurve.from_poisson(BATCHER_POINTS, BATCHER_SATURATION, slo_p99_ms=150.0)
    # past twice the SLO the point only queued: not a stationary state, left out
    assert len(curve.x) == 4 and max(curve.x) < 3.0
    assert list(curve.mu) == sorted(curve.mu)  # a batcher does not slow as its queue grows
    for lam, p99_ms, _ in BATCHER_POINTS[:4]:
        x, mu = _settle(curve, lam)
        assert float(q.quantile_s(x, mu, 0.99)[0]) * 1000.0 == pytest.approx(p99_ms, rel=1e-3)
    # one rate calibrated on the light-load point overstates the heavy-load tail twofold
    one = q.service_rate(40.4, 146.9)
    assert math.log(100) / (one - 60.6) * 1000.0 > 2 * 198.3
    # departures never pass the measured saturation: above it the queue grows by the excess
    x0, _ = _settle(curve, 60.0)
    x1 = x0
    for _ in range(30):
        x1 = q.step_x(x1, np.array([100.0]), q.curve_rates([curve], np.array([70.0]), x1, np.array([100.0]), 1.0), 1.0)
    assert float(x1[0] - x0[0]) >= 30 * (100.0 - BATCHER_SATURATION) - 1e-6
    # a faster slice: rates scale, occupancies do not
    fast = curve.scaled(2.0)
    assert fast.x == curve.x and fast.mu == tuple(2 * m for m in curve.mu) and fast.saturation_rps == 161.6
    # nothing usable: no curve
    assert q.ServiceCurve.from_poisson([(80.8, 475.3, None)], 80.8, slo_p99_ms=150.0) is None
    assert q.ServiceCurve.from_poisson([]) is None


def test_a_replica_with_a_service_curve_serves_each_load_at_its_measured_p99():
    curve = q.ServiceCurve.from_poisson(BATCHER_POINTS, BATCHER_SATURATION, slo_p99_ms=150.0)
    single = q.service_rate(40.4, 146.9)
    got = {}
    for name, kw in (("curve", {"service_curves": {"m": {"3g.40gb": curve}}}), ("single", {})):
        c = _ready_cluster(service_rps={"m": {"3g.40gb": single}}, record_sojourns=True, **kw)
        for lam in (40.4, 60.6):
            for _ in range(300):
                c.advance(np.array([lam]))
        got[name] = [c.sojourn_quantile("m", t0, t0 + 100, 0.99) * 1000.0 for t0 in (200, 500)]
    assert got["curve"] == pytest.approx([146.9, 198.3], rel=2e-3)
    assert got["single"][0] == pytest.approx(146.9, rel=2e-3) and got["single"][1] > 400.0
    # the curve sets how the queue serves; the capacity the policy reads is still the table's
    c = _ready_cluster(service_curves={"m": {"3g.40gb": curve}})
    c.advance(np.array([50.0]))
    assert c.capacity[-1][0] == 300.0


def test_a_narrow_sojourn_law_keeps_the_p99_and_moves_the_rest_toward_it():
    from scipy.special import gammaincinv

    for k in (1.0, 4.0, 8.0):
        ratio = float(gammaincinv(k, 0.99) / gammaincinv(k, 0.5))
        assert q.gamma_shape(ratio) == pytest.approx(k, rel=1e-6)
    assert q.gamma_shape(10.0) == 1.0 and q.gamma_shape(1.01) == q.MAX_SHAPE
    x, mu = np.array([0.5, 3.0]), np.array([80.0, 80.0])
    k = np.array([8.0, 8.0])
    p99 = q.quantile_s(x, mu, 0.99)
    assert q.quantile_s(x, mu, 0.99, k) == pytest.approx(p99)  # the same p99 ...
    assert q.within_slo(x, mu, p99, k) == pytest.approx(0.99)
    assert np.all(q.quantile_s(x, mu, 0.5, k) > 2 * q.quantile_s(x, mu, 0.5))  # ... a median far nearer it
    assert q.within_slo(x, mu, 0.2, np.ones(2)) == pytest.approx(q.within_slo(x, mu, 0.2))
    # the points' own medians set the shape: p99/p50 = 2.09 is shape 8
    pts = [(lam, p99_ms, p99_ms / float(gammaincinv(8.0, 0.99) / gammaincinv(8.0, 0.5)))
           for lam, p99_ms, _ in BATCHER_POINTS]
    curve = q.ServiceCurve.from_poisson(pts, BATCHER_SATURATION, slo_p99_ms=150.0)
    assert curve.shape == pytest.approx(8.0, rel=1e-6) and curve.scaled(2.0).shape == curve.shape


def test_a_narrow_sojourn_law_puts_more_of_a_backlog_s_requests_in_the_tail():
    """Light load, 10 s near saturation, then half that (as when a second replica comes up):
    the same queue and the same stationary p99 either way, but with a batcher's narrow law a
    phase p99 counts the backlog's requests, which all wait long, not just its unlucky 1%."""
    wide = q.ServiceCurve.from_poisson(BATCHER_POINTS, BATCHER_SATURATION, slo_p99_ms=150.0)
    narrow = q.ServiceCurve(wide.x, wide.mu, wide.saturation_rps, shape=8.0)
    p99 = {}
    for name, curve in (("wide", wide), ("narrow", narrow)):
        c = _ready_cluster(record_sojourns=True, service_curves={"m": {"3g.40gb": curve}})
        for lam in [20.0] * 100 + [75.0] * 10 + [37.5] * 90:
            c.advance(np.array([lam]))
        p99[name] = [c.sojourn_quantile("m", t0, t1, 0.99) for t0, t1 in ((50, 100), (100, 200), (150, 200))]
    assert p99["narrow"][0] == pytest.approx(p99["wide"][0], rel=1e-3)  # stationary: the same p99
    assert p99["narrow"][2] == pytest.approx(p99["wide"][2], rel=1e-3)
    assert p99["narrow"][1] > 1.2 * p99["wide"][1]  # the phase holding the backlog


def test_requests_without_a_ready_replica_fail_and_count_as_misses_but_no_metric_sees_them():
    c, clock = _cluster()
    for _ in range(4):
        c.advance(np.array([50.0]))
    assert c._cum["ok"][-1][0] == 0.0
    assert np.allclose(c.per_step("fail")[:, 0], 50.0 * 5.0)
    assert np.allclose(c.per_step("lost")[:, 0], 50.0 * 5.0) and not c.per_step("drop").any()
    # no replica, no series: missing data (None), never a measured 0 or a failure rate
    models, _ = c.read(["m"], [], clock.now() + 15)
    assert models["m"] is None
    assert c._fast(clock.now()) == [None]
    # with a replica serving, Triton's counters (and the direct scrape) hold only what
    # reached it: the earlier requests are in neither
    assert c.apply([_create(rid="a")]) == []
    for _ in range(12):  # the window (15 s late, 30 s wide) straddles its 30 s start
        c.advance(np.array([50.0]))
    models, _ = c.read(["m"], [], clock.now())
    assert models["m"] is not None and models["m"].failure_rate == 0.0
    assert models["m"].request_rate < 40.0
    for _ in range(8):
        c.advance(np.array([50.0]))
    models, _ = c.read(["m"], [], clock.now())
    m = models["m"]
    assert m is not None and m.failure_rate == 0.0
    assert m.request_rate == pytest.approx(50.0, rel=0.05)
    assert m.fast is not None and m.fast.arrival_rps == pytest.approx(50.0, rel=0.05)


def _overload(shed: bool) -> tuple[SimCluster, VirtualClock]:
    c, clock = _cluster(start_delay_s=0, scrape_delay_s=0, metrics_window_s=20, shed_at_slo=shed)
    assert c.apply([_create(rid="a")]) == []
    c.advance(np.array([100.0]))
    for _ in range(8):  # 40 s at 600 req/s into one replica of mu = 300 + ln(100) / 0.05 = 392 req/s
        c.advance(np.array([600.0]))
    return c, clock


def test_a_replica_that_sheds_at_the_slo_drops_the_excess_and_triton_counts_it_as_demand():
    c, clock = _overload(shed=True)
    models, _ = c.read(["m"], [], clock.now())
    mu = 300.0 + math.log(100.0) / 0.05
    # Triton's success + failure: what arrived, though only mu was served
    assert models["m"].request_rate == pytest.approx(600.0, rel=0.01)
    assert models["m"].failure_rate == pytest.approx(600.0 - mu, rel=0.02)
    assert models["m"].fast.arrival_rps == pytest.approx(600.0, rel=0.01)
    # the same overload without shedding: the queue holds 30 s of work, nothing is dropped yet,
    # and Triton shows only what completed
    k, kclock = _overload(shed=False)
    kept, _ = k.read(["m"], [], kclock.now())
    assert kept["m"].failure_rate == 0.0 and kept["m"].request_rate == pytest.approx(mu, rel=0.01)
    # a bounded queue keeps some requests within the SLO; a growing one makes every one late
    within_shed = c.per_step("ok")[-4:, 0].sum() / c.per_step("arr")[-4:, 0].sum()
    within_kept = k.per_step("ok")[-4:, 0].sum() / k.per_step("arr")[-4:, 0].sum()
    assert within_shed > 0.3 and within_kept < 0.01


def test_create_on_missing_or_taken_instance_is_an_error():
    c, _ = _cluster()
    errs = c.apply([_create(start=2, profile="2g.20gb")])
    assert errs and "no capacity for profile '2g.20gb'" in errs[0]
    errs = c.apply([_create(start=2, profile="1g.10gb")])
    assert errs and "has no instance 1g.10gb@2" in errs[0]
    assert c.apply([_create(rid="a")]) == []
    errs = c.apply([_create(rid="b")])
    assert errs and "taken by a" in errs[0]


def test_wait_ready_blocks_the_drain_that_follows():
    c, _ = _cluster(start_delay_s=30, drain_s=5)
    c.apply([_create(rid="old")])
    for _ in range(7):
        c.advance(np.array([10.0]))
    c.apply([
        _create(start=4, rid="new"),
        Action(ActionKind.WAIT_READY, Reason.PROFILE_EFFICIENCY, gpu="n/0", model="m", start=4, replica="new"),
        Action(ActionKind.DRAIN, Reason.PROFILE_EFFICIENCY, replica="old"),
        Action(ActionKind.DELETE, Reason.PROFILE_EFFICIENCY, replica="old"),
    ])
    states = {r.id: r.state for r in c.snapshot().replicas}
    assert states == {"old": ReplicaState.READY, "new": ReplicaState.STARTING}
    for _ in range(7):  # 35 s: new is ready, old drains (5 s) and goes
        c.advance(np.array([10.0]))
    states = {r.id: r.state for r in c.snapshot().replicas}
    assert states == {"new": ReplicaState.READY}
    assert not c.converging()


def test_repartition_waits_for_drain_then_takes_the_configured_delay():
    c, clock = _cluster(start_delay_s=0, drain_s=5, repartition_delay_s=180)
    c.apply([_create(rid="a")])
    c.advance(np.array([0.0]))
    new_layout = (Placement(0, "7g.80gb"),)
    # nobody drains "a": repartitioning under it is refused
    errs = c.apply([Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="n/0", layout=new_layout)])
    assert errs and "still serves a" in errs[0]
    c.apply([
        Action(ActionKind.DRAIN, Reason.REPARTITION, replica="a"),
        Action(ActionKind.DELETE, Reason.REPARTITION, replica="a"),
        Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="n/0", layout=new_layout),
        _create(start=0, profile="7g.80gb", rid="big"),
    ])
    assert c.reconfigurations == 0  # still draining
    t_ready = None
    for _ in range(60):
        c.advance(np.array([0.0]))
        if t_ready is None and any(r.state == ReplicaState.READY for r in c.snapshot().replicas):
            t_ready = clock.now()
    assert c.reconfigurations == 1
    assert c.snapshot().gpus[0].layout == new_layout
    # drain 5 s (+ one step to notice), then 180 s of repartition, start delay 0
    assert 185 <= t_ready <= 195


def test_metrics_report_what_was_true_scrape_delay_ago():
    c, clock = _cluster(start_delay_s=0, scrape_delay_s=15, metrics_window_s=30)
    c.apply([_create(rid="a")])
    for _ in range(12):  # 60 s at 100 req/s
        c.advance(np.array([100.0]))
    for _ in range(2):  # 10 s at 250 req/s
        c.advance(np.array([250.0]))
    now = clock.now()
    models, reps = c.read(["m"], ["a"], now)
    assert models["m"].request_rate == pytest.approx(100.0, rel=0.02)  # the step is not visible yet
    for _ in range(9):
        c.advance(np.array([250.0]))
    models, reps = c.read(["m"], ["a"], clock.now())
    assert models["m"].request_rate == pytest.approx(250.0, rel=0.02)
    mu = q.service_rate(300.0, 50.0)
    assert reps["a"].busy_fraction == pytest.approx(250.0 / mu, rel=0.02)
    # queue:compute ratio of M/M/1 is the mean number in system, rho/(1-rho)
    rho = 250.0 / mu
    assert models["m"].queue_compute_ratio == pytest.approx(rho / (1 - rho), rel=0.03)


def test_the_mixture_quantile_matches_sampled_requests():
    rng = np.random.default_rng(7)
    values, weights = np.array([30.0, 300.0]), np.array([0.97, 0.03])
    a = -np.log1p(-0.99)
    draws = np.concatenate([rng.exponential(v / a, int(w * 400_000)) for v, w in zip(values, weights)])
    got = q.mixture_quantiles(0.99, np.array([values, [50.0, 0.0], [1.0, 2.0]]),
                              np.array([weights, [1.0, 0.0], [0.0, 0.0]]))
    assert got[0] == pytest.approx(np.quantile(draws, 0.99), rel=0.03)
    assert got[1] == pytest.approx(50.0)  # one distribution (the rest padding): its own quantile
    assert math.isnan(got[2])  # nothing served: no quantile, not 0
    # components given by their p99, asked for other levels (one per row)
    lv = q.mixture_quantiles(np.array([0.5, 0.95]), np.array([values, values]), np.array([weights, weights]), of=0.99)
    for level, got_l in zip((0.5, 0.95), lv):
        assert got_l == pytest.approx(np.quantile(draws, level), rel=0.03)


def test_the_mixture_quantile_holds_on_mixes_spanning_six_decades():
    """Newton's steps against a plain bisection of the same tail, on random mixes whose
    components' p99s span 0.1 ms to 100 s and whose weights span e^15."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 20))
        values = np.exp(rng.uniform(math.log(0.1), math.log(1e5), n))
        weights = np.exp(rng.uniform(-10, 5, n))
        level = float(rng.choice([0.5, 0.95, 0.99]))
        rate = q.LN100 / values
        lo, hi = 0.0, 2.0 * values.max()
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if (weights * np.exp(-rate * mid)).sum() > (1 - level) * weights.sum() else (lo, mid)
        got = q.mixture_quantiles(np.array([level]), values[None], weights[None], of=0.99)[0]
        assert got == pytest.approx(0.5 * (lo + hi), rel=1e-9)


@pytest.mark.parametrize("window", [60.0, None])
def test_the_latency_quantiles_cover_tritons_summary_minute(window):
    """Triton's summaries keep about a minute: a 10 s overload stays in the p99 after the
    30 s rate window has forgotten it, and leaves it when the minute has passed."""
    c, clock = _cluster(start_delay_s=0, scrape_delay_s=0, metrics_window_s=30, latency_window_s=window)
    c.apply([_create(rid="a")])
    mu = q.service_rate(300.0, 50.0)
    steady_ms = q.LN100 / (mu - 100.0) * 1000.0
    for rate, steps in ((100.0, 12), (380.0, 2), (100.0, 7)):
        for _ in range(steps):
            c.advance(np.array([rate]))
    got = c.read(["m"], ["a"], clock.now())[0]["m"]
    assert got.request_rate == pytest.approx(100.0, rel=0.02)  # the rates have forgotten it
    assert got.p50_ms < got.p95_ms < got.p99_ms
    if window is None:  # a histogram over the rate window: the steady minute's own
        assert got.latency_window_s is None
        assert got.p99_ms == pytest.approx(steady_ms, rel=0.05)
        return
    assert got.latency_window_s == window
    assert got.p99_ms > 3 * steady_ms  # the overload's requests hold the minute's tail
    for _ in range(12):
        c.advance(np.array([100.0]))
    assert c.read(["m"], ["a"], clock.now())[0]["m"].p99_ms == pytest.approx(steady_ms, rel=0.05)


def test_a_batching_replica_reports_its_batch_compute_per_request_as_triton_does():
    """Triton reports for each request the compute time of the whole batch it ran in, so
    with the dynamic batcher the queue:compute ratio falls by the mean batch; latency and
    throughput do not change (batching is inside the service rate)."""
    mu = q.service_rate(300.0, 50.0)  # 392 req/s
    seen = {}
    for mb in (1, 8):
        c, clock = _cluster(start_delay_s=0, scrape_delay_s=0, metrics_window_s=30, max_batch=mb)
        c.apply([_create(rid="a")])
        for _ in range(24):  # 120 s at 350 req/s: x = rho / (1 - rho) = 8.3, of which 7.4 wait
            c.advance(np.array([350.0]))
        models, _ = c.read(["m"], [], clock.now())
        seen[mb] = (models["m"], c.per_step("ok")[-6:, 0].sum())
    rho = 350.0 / mu
    x = rho / (1 - rho)
    waiting = x - rho
    alone, batched = seen[1][0], seen[8][0]
    assert alone.avg_compute_ms == pytest.approx(1000.0 / mu, rel=1e-6)
    assert batched.avg_compute_ms == pytest.approx(1000.0 * waiting / mu, rel=0.03)
    assert alone.queue_compute_ratio == pytest.approx(x, rel=0.03)
    assert batched.queue_compute_ratio == pytest.approx(x / waiting, rel=0.03)
    assert batched.avg_queue_ms == alone.avg_queue_ms and batched.p99_ms == alone.p99_ms
    assert seen[8][1] == seen[1][1]
    # the batch never passes max_batch_size, and a light load runs batches of one
    assert np.array_equal(q.mean_batch(np.array([0.3, 8.3, 500.0]), 8), [1.0, 8.3 - 8.3 / 9.3, 8.0])


def test_max_batch_must_be_a_positive_integer():
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="max_batch"):
            SimConfig(max_batch=bad)


def test_each_model_batches_as_its_own_triton_config_says():
    """``max_batch`` per model (its ``config.pbtxt``): the batched model reports its batch's
    compute per request, the other its own, side by side on one GPU."""
    clock = VirtualClock(0.0)
    gpu = GpuState("n/0", "n", "A100-SXM4-80GB", TWO_3G)
    reps = (Replica("r0", "m", "3g.40gb", "n/0", 0, ReplicaState.READY, 0.0),
            Replica("r1", "k", "3g.40gb", "n/0", 4, ReplicaState.READY, 0.0))
    specs = [SPEC, ModelSpec("k", dict(SPEC.capacity), SPEC.allowed_profiles)]
    c = SimCluster(specs, {"m": 50.0, "k": 50.0}, ClusterState((gpu,), reps), clock,
                   SimConfig(step_s=5.0, scrape_delay_s=0, metrics_window_s=30), max_batch={"k": 8})
    for _ in range(24):
        c.advance(np.array([350.0, 350.0]))
    models, _ = c.read(["m", "k"], [], clock.now())
    mu = q.service_rate(300.0, 50.0)
    rho = 350.0 / mu
    waiting = rho / (1 - rho) - rho
    assert models["m"].avg_compute_ms == pytest.approx(1000.0 / mu, rel=1e-6)
    assert models["k"].avg_compute_ms == pytest.approx(1000.0 * waiting / mu, rel=0.03)
    assert models["k"].p99_ms == models["m"].p99_ms  # latency is the service rate's, batch or not
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="max_batch"):
            SimCluster(specs, {"m": 50.0, "k": 50.0}, ClusterState((gpu,), ()), VirtualClock(0.0),
                       max_batch={"k": bad})


def test_spike_detection_and_recovery():
    d = np.ones((2, 400)) * 10.0
    d[1, 300:] = 40.0
    assert largest_spike(d, 5.0) == (1, 300)
    att = np.ones((2, 400))
    att[1, 300:310] = 0.5  # 50 s bad, then fine
    assert recovery_s(d, att, 5.0) == 50.0
    assert recovery_s(np.ones((1, 400)), np.ones((1, 400)), 5.0) == 0.0


# ------------------------------------------------------------------ whole runs


def _small(policy_over=None, n_models=3, gpus=2):
    fl = sc.fleet(n_models)
    mc = parse_models({"models": fl})
    cc = parse_cluster(sc.cluster(gpus, policy={"tick_s": 15, **(policy_over or {})}))
    means = {m["name"]: 2.0 * sc.best_slice_rps(m) for m in fl}
    return mc, cc, means


def test_same_seed_same_result():
    mc, cc, means = _small()
    trace = tr.generate("mixed", list(means), 1800, seed=5, mean_rps=means)
    a = simulate(mc, cc, trace, "hpa-util", warmup_s=300).to_json()
    b = simulate(mc, cc, trace, "hpa-util", warmup_s=300).to_json()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_oracle_is_a_lower_bound_on_every_policy():
    mc, cc, means = _small()
    trace = tr.generate("mixed", list(means), 3600, seed=2, mean_rps=means)
    res = {p: simulate(mc, cc, trace, p, warmup_s=600) for p in POLICIES}
    oracle = res["oracle"].gpu_hours
    assert oracle > 0
    for name, r in res.items():
        assert r.gpu_hours >= oracle - 1e-9, (name, r.gpu_hours, oracle)
    assert res["static-peak"].gpu_hours > res["migscale"].gpu_hours


def test_migscale_end_to_end_small_trace():
    mc, cc, means = _small()
    trace = tr.generate("diurnal", list(means), 3600, seed=1, mean_rps=means)
    r = simulate(mc, cc, trace, "migscale", warmup_s=600)
    assert r.ticks >= 3600 / 15
    assert r.errors == []
    assert r.slo_attainment > 0.99
    assert 0 < r.gpu_hours <= 2.0 * 1.0  # two GPUs for one hour at most
    assert set(r.per_model) == set(means)


def test_cli_simulate_json_and_plot(tmp_path):
    _, _, means = _small()
    import yaml

    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": sc.fleet(3)}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(2, policy={"tick_s": 15})))
    tr.write_csv(tr.generate("diurnal", list(means), 1200, seed=1, mean_rps=means), tmp_path / "t.csv")
    png = tmp_path / "out.png"
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"),
                                   str(tmp_path / "t.csv"), "--policy", "hpa-queue", "--json", "--plot", str(png),
                                   "--warmup-s", "300"])
    assert res.exit_code == 0, res.output
    import json

    out = json.loads(res.output.strip().splitlines()[-1])
    for key in ("slo_attainment", "per_model", "gpu_hours", "slice_hours", "reconfigurations", "recovery_s"):
        assert key in out
    assert png.stat().st_size > 10_000
    # the table names the model furthest from its SLO, with the JSON's figure
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"),
                                   str(tmp_path / "t.csv"), "--policy", "hpa-queue", "--warmup-s", "300"])
    assert res.exit_code == 0, res.output
    head, row = res.output.strip().splitlines()[-2:]
    assert head.split()[-2:] == ["worst", "model"] and row.split()[0] == "hpa-queue"
    name, pct = min(out["per_model"].items(), key=lambda kv: kv[1])
    assert row.split()[-2:] == [name, f"{pct * 100:.2f}%"]


def test_cli_simulate_bounds_the_step_and_warm_up(tmp_path):
    # a step of 0.0001 s ran for hours; one of 100,000 s gave figures from skipped starts
    import yaml

    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": sc.fleet(1)}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1)))
    name = sc.fleet(1)[0]["name"]
    (tmp_path / "t.csv").write_text(f"t_s,model,rps\n0,{name},5\n3540,{name},5\n")
    args = [str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"), str(tmp_path / "t.csv")]
    for extra, msg in ((["--step-s", "0.0001"], "--step-s: 8880 s of warm-up and trace in steps of 0.0001 s is over"),
                       (["--step-s", "100000"], "--step-s: must be > 0 and at most 60 s, got 100000.0"),
                       (["--warmup-s", "-1"], "--warmup-s: must be >= 0, got -1.0")):
        res = CliRunner().invoke(app, ["simulate", *args, *extra])
        assert res.exit_code == 2 and msg in res.output, res.output


def test_cli_simulate_bad_input_exits_2(tmp_path):
    import yaml

    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": sc.fleet(1)}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1)))
    (tmp_path / "t.csv").write_text("t_s,model,rps\n0,other,5\n")
    args = [str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"), str(tmp_path / "t.csv")]
    res = CliRunner().invoke(app, ["simulate", *args, "--policy", "nope"])
    assert res.exit_code == 2 and "--policy: must be one of" in res.output
    res = CliRunner().invoke(app, ["simulate", *args])
    assert res.exit_code == 2 and "not in the models config" in res.output and "Traceback" not in res.output


def test_backend_world_takes_away_exactly_what_kubernetes_lacks():
    from autoscaler.policy.types import RepartitionScope
    from autoscaler.sim.run import SimError, backend_world

    base = SimConfig(step_s=5.0, start_delay_s=30.0, repartition_delay_s=180.0)
    same, none = backend_world("sim", base)
    assert same == base and same.fast_window_s is not None and none == {}
    kube, over = backend_world("kubernetes", base)
    assert kube == base  # its pods are scraped each second: the fast signals stay
    assert over == {"repartition_scope": RepartitionScope.NODE}
    slow, over = backend_world("kubernetes-no-fast", base)
    assert slow.fast_window_s is None
    assert over == {"repartition_scope": RepartitionScope.NODE}
    # everything else about the world stays as asked
    assert (slow.step_s, slow.start_delay_s, slow.repartition_delay_s) == (5.0, 30.0, 180.0)
    with pytest.raises(SimError, match="backend: must be one of sim, kubernetes, kubernetes-no-fast, got 'slurm'"):
        backend_world("slurm", base)


def test_cli_simulate_backend_kubernetes_reaches_migscale_only(tmp_path, monkeypatch):
    import yaml

    import autoscaler.sim.run as run_mod
    from autoscaler.policy.types import RepartitionScope

    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": sc.fleet(1)}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1)))
    name = sc.fleet(1)[0]["name"]
    (tmp_path / "t.csv").write_text(f"t_s,model,rps\n0,{name},5\n600,{name},5\n")
    args = [str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"), str(tmp_path / "t.csv")]
    res = CliRunner().invoke(app, ["simulate", *args, "--backend", "slurm"])
    assert res.exit_code == 2 and "--backend: must be one of sim, kubernetes, kubernetes-no-fast, got 'slurm'" in res.output
    seen: dict[str, tuple] = {}
    real = run_mod.simulate

    def spy(models_cfg, cluster_cfg, trace, policy_name, step_s=5.0, **kw):
        seen[policy_name] = (kw["sim"].fast_window_s, kw.get("policy_overrides"))
        return real(models_cfg, cluster_cfg, trace, policy_name, step_s, **kw)

    monkeypatch.setattr(run_mod, "simulate", spy)
    res = CliRunner().invoke(app, ["simulate", *args, "--policy", "all", "--backend", "kubernetes-no-fast",
                                   "--warmup-s", "60"])
    assert res.exit_code == 0, res.output
    assert seen["migscale"] == (None, {"repartition_scope": RepartitionScope.NODE})
    assert all(v == (None, None) for k, v in seen.items() if k != "migscale") and len(seen) == len(POLICIES)
    seen.clear()
    res = CliRunner().invoke(app, ["simulate", *args, "--policy", "migscale", "--backend", "kubernetes",
                                   "--warmup-s", "60"])
    assert res.exit_code == 0, res.output
    assert seen["migscale"] == (SimConfig().fast_window_s, {"repartition_scope": RepartitionScope.NODE})
    seen.clear()
    res = CliRunner().invoke(app, ["simulate", *args, "--policy", "migscale", "--warmup-s", "60"])
    assert res.exit_code == 0, res.output
    assert seen["migscale"] == (SimConfig().fast_window_s, {})


def _profiled_models(tmp_path, throughput):
    """One model whose capacity_file carries `migscale profile` sweeps topping out at ``throughput``."""
    import yaml

    (m,) = sc.fleet(1)
    table = dict(m.pop("capacity"))
    sweeps = {p: {"capacity_rps": c, "points": [{"concurrency": 1, "throughput_rps": 0.5 * throughput, "errors": 0},
                                              {"concurrency": 8, "throughput_rps": throughput, "errors": 0},
                                              {"concurrency": 16, "throughput_rps": 3 * throughput, "errors": 7}]}
              for p, c in table.items()}
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump({"models": {m["name"]: table},
                                                       "measured": {m["name"]: sweeps}}))
    m["capacity_file"] = "cap.yaml"
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": [m]}))
    return m, table


def _simulate_near_the_table(tmp_path, m, table) -> tuple[list[str], dict]:
    """``migscale simulate --json`` of 15 min at 90% of the table's smallest capacity: the
    command line (to run again after the files change) and its result."""
    import json

    import yaml

    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1, policy={"tick_s": 15})))
    rps = 0.9 * min(table.values())
    t = np.arange(0.0, 900.0, 60.0)
    tr.write_csv(tr.Trace(t, (m["name"],), np.full((1, len(t)), rps), 900.0), tmp_path / "t.csv")
    args = [str(tmp_path / n) for n in ("models.yaml", "cluster.yaml", "t.csv")]
    run = ["simulate", *args, "--policy", "migscale", "--json", "--warmup-s", "600"]
    res = CliRunner().invoke(app, run)
    assert res.exit_code == 0, res.output
    return run, json.loads(res.output.strip().splitlines()[-1])


def test_profiled_sweeps_set_the_simulated_service_rate(tmp_path):
    import json

    import yaml

    from autoscaler.config import MeasuredReplica, load_models, measured_replicas

    m, table = _profiled_models(tmp_path, throughput=1.0)
    got = measured_replicas(load_models(tmp_path / "models.yaml"))
    assert got == {m["name"]: {p: MeasuredReplica(1.0) for p in table}}  # the errored point does not count
    # the model's own Triton config sets the world's batching
    (tmp_path / m["model_dir"]).mkdir(parents=True)
    (tmp_path / m["model_dir"] / "config.pbtxt").write_text("max_batch_size: 4\ndynamic_batching { }\n")
    # load near the table's capacity: at the table's own rate the SLO holds, at the measured one it cannot
    run, out = _simulate_near_the_table(tmp_path, m, table)
    assert out["measured_service_rates"] == [m["name"]] and out["max_batch"] == {m["name"]: 4}
    assert out["slo_attainment"] < 0.5
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump({"models": {m["name"]: table}}))  # no sweeps: the table
    out = json.loads(CliRunner().invoke(app, run).output.strip().splitlines()[-1])
    assert out["measured_service_rates"] == [] and out["slo_attainment"] > 0.98


def _poisson_profiled(tmp_path, m, table, capacity):
    """Rewrite the capacity file as ``migscale profile --arrivals poisson`` writes it."""
    import yaml

    doc = yaml.safe_load((tmp_path / "cap.yaml").read_text())
    for prof in table:
        doc["measured"][m["name"]][prof].update(arrivals="poisson", capacity_rps=capacity(prof),
                                                slo_p99_ms=m["slo"]["p99_ms"])
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc))


def test_a_poisson_capacity_sets_the_world_before_the_saturation_reading(tmp_path):
    """Profiled with Poisson arrivals, the world's replica is the M/M/1 whose p99 meets the SLO
    at the measured capacity -- the calibration a capacity table gets -- not the closed-loop
    saturation throughput beside it."""
    import json

    from autoscaler.config import MeasuredReplica, load_models, measured_replicas

    m, table = _profiled_models(tmp_path, throughput=1.0)  # the sweep alone: a world that cannot serve
    _poisson_profiled(tmp_path, m, table, lambda p: table[p])
    slo = float(m["slo"]["p99_ms"])
    got = measured_replicas(load_models(tmp_path / "models.yaml"))[m["name"]]
    assert got == {p: MeasuredReplica(1.0, float(c), slo) for p, c in table.items()}
    assert q.profiled_service_rate(1.0, table[next(iter(table))], slo) == q.service_rate(table[next(iter(table))], slo)
    assert q.profiled_service_rate(1.0) == 1.0 and q.profiled_service_rate(None) is None
    run, out = _simulate_near_the_table(tmp_path, m, table)
    # the measured capacity equals the table: the world serves as the policy believes
    assert out["measured_service_rates"] == [m["name"]] and out["slo_attainment"] > 0.98
    _poisson_profiled(tmp_path, m, table, lambda p: 0.3 * table[p])  # measured far below the table
    slow = json.loads(CliRunner().invoke(app, run).output.strip().splitlines()[-1])
    # a slower world: the policy's learned correction needs more slices, and still loses some requests
    assert slow["slice_hours"] > out["slice_hours"] and slow["slo_attainment"] < out["slo_attainment"]


def test_a_malformed_poisson_capacity_exits_2_naming_the_field(tmp_path):
    import yaml

    m, table = _profiled_models(tmp_path, throughput=100.0)
    _poisson_profiled(tmp_path, m, table, lambda p: -3)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1)))
    tr.write_csv(tr.Trace(np.array([0.0]), (m["name"],), np.array([[10.0]]), 600.0), tmp_path / "t.csv")
    args = [str(tmp_path / n) for n in ("models.yaml", "cluster.yaml", "t.csv")]
    res = CliRunner().invoke(app, ["simulate", *args])
    prof = next(iter(table))
    assert res.exit_code == 2, res.output
    assert f"measured.{m['name']}.{prof}.capacity_rps" in res.output and "-3" in res.output
    assert "Traceback" not in res.output
    _poisson_profiled(tmp_path, m, table, lambda p: 50.0)
    doc = yaml.safe_load((tmp_path / "cap.yaml").read_text())
    doc["measured"][m["name"]][prof]["slo_p99_ms"] = None
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["simulate", *args])
    assert res.exit_code == 2 and f"measured.{m['name']}.{prof}.slo_p99_ms" in res.output, res.output


def test_measured_poisson_points_let_a_batcher_serve_past_its_single_rate(tmp_path):
    """A batcher measured meeting its SLO well past the Poisson capacity's single-rate
    calibration: with the points, the world serves as they say; without, it is slower."""
    import json

    import yaml

    from autoscaler.config import load_models, measured_replicas

    m, table = _profiled_models(tmp_path, throughput=1.0)
    _poisson_profiled(tmp_path, m, table, lambda p: 0.3 * table[p])
    slo = float(m["slo"]["p99_ms"])
    run, single = _simulate_near_the_table(tmp_path, m, table)
    doc = yaml.safe_load((tmp_path / "cap.yaml").read_text())
    for prof, c in table.items():  # flat p99 up to the table's rate, p50 at half the p99
        doc["measured"][m["name"]][prof]["poisson_points"] = [
            {"offered_rps": f * c, "p99_ms": (0.7 + 0.2 * f) * slo, "p50_ms": (0.35 + 0.1 * f) * slo, "errors": 0}
            for f in (0.3, 0.6, 1.0)] + [{"offered_rps": 1.2 * c, "p99_ms": None, "p50_ms": None, "errors": 3}]
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc))
    got = measured_replicas(load_models(tmp_path / "models.yaml"))[m["name"]]
    prof = next(iter(table))
    assert got[prof].poisson_points == tuple(
        (f * table[prof], (0.7 + 0.2 * f) * slo, (0.35 + 0.1 * f) * slo) for f in (0.3, 0.6, 1.0))
    curve = json.loads(CliRunner().invoke(app, run).output.strip().splitlines()[-1])
    assert single["measured_service_curves"] == [] and curve["measured_service_curves"] == [m["name"]]
    assert curve["slo_attainment"] > 0.98 and curve["slo_attainment"] > single["slo_attainment"]
    assert curve["slice_hours"] < single["slice_hours"]
    # a malformed median: exit 2, naming the point and the field
    doc["measured"][m["name"]][prof]["poisson_points"][1]["p50_ms"] = "soon"
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, run)
    assert res.exit_code == 2 and f"measured.{m['name']}.{prof}.poisson_points[1].p50_ms" in res.output
    assert "'soon'" in res.output and "Traceback" not in res.output


def test_a_malformed_sweep_exits_2_naming_the_point(tmp_path):
    import yaml

    m, table = _profiled_models(tmp_path, throughput=100.0)
    doc = yaml.safe_load((tmp_path / "cap.yaml").read_text())
    prof = next(iter(table))
    doc["measured"][m["name"]][prof]["points"][1]["throughput_rps"] = "fast"
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(sc.cluster(1)))
    tr.write_csv(tr.Trace(np.array([0.0]), (m["name"],), np.array([[10.0]]), 600.0), tmp_path / "t.csv")
    res = CliRunner().invoke(app, ["simulate", *(str(tmp_path / n) for n in ("models.yaml", "cluster.yaml", "t.csv"))])
    assert res.exit_code == 2, res.output
    assert f"measured.{m['name']}.{prof}.points[1].throughput_rps" in res.output and "'fast'" in res.output
    assert "Traceback" not in res.output


def _two_gpu_cluster(**cfg) -> tuple[SimCluster, VirtualClock]:
    clock = VirtualClock(0.0)
    gpus = (GpuState("n/0", "n", "A100-SXM4-80GB", TWO_3G), GpuState("n/1", "n", "A100-SXM4-80GB", TWO_3G))
    c = SimCluster([SPEC, ModelSpec("k", dict(SPEC.capacity), SPEC.allowed_profiles)], {"m": 50.0, "k": 50.0},
                   ClusterState(gpus, ()), clock, SimConfig(**cfg))
    return c, clock


def test_independent_chains_do_not_wait_for_each_other_and_in_flight_names_them():
    c, _ = _two_gpu_cluster(start_delay_s=0, repartition_delay_s=180)
    seven = (Placement(0, "7g.80gb"),)
    # one plan: model m repartitions n/0 and waits for its replica there (180 s);
    # model k's scale-up on n/1 has nothing to do with it
    errs = c.apply([
        Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="n/0", layout=seven),
        Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", profile="7g.80gb", start=0,
               replica="big"),
        Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", start=0, replica="big"),
        Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", profile="7g.80gb", start=0,
               replica="dup"),  # queued behind the barrier: the snapshot cannot show it yet
        Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu="n/1", model="k", profile="3g.40gb", start=0,
               replica="k1"),
    ])
    assert errs == []
    c.advance(np.array([0.0, 0.0]))
    states = {r.id: r.state for r in c.snapshot().replicas}
    assert states["k1"] == ReplicaState.READY  # not held up by m's 180 s repartition
    assert states["big"] == ReplicaState.STARTING
    gpus, models = c.in_flight()
    assert gpus == {"n/0"} and models == {"m"}  # k's chain is done; n/1 is free to plan on
    for _ in range(40):
        c.advance(np.array([0.0, 0.0]))
    # the barrier released the queued create, which then found its instance taken
    assert any("taken by big" in e for e in c.late_errors)
    assert c.in_flight() == (frozenset(), frozenset())


def test_a_replica_only_starting_is_not_in_flight():
    c, _ = _cluster(start_delay_s=30)
    c.apply([_create(rid="a"),
             Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", start=0, replica="a")])
    # capacity on its way, shown in the snapshot and counted by the policy: not a reason to hold
    assert c.converging()
    assert c.in_flight() == (frozenset(), frozenset())


def test_wait_ready_times_out_behind_a_repartition_longer_than_the_bound():
    c, _ = _two_gpu_cluster(start_delay_s=30, repartition_delay_s=300, wait_ready_timeout_s=120)
    c.apply([_create(rid="old")])  # m serves from 3g@0 on n/0
    for _ in range(7):
        c.advance(np.array([0.0, 0.0]))
    seven = (Placement(0, "7g.80gb"),)
    errs = c.apply([
        Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu="n/1", layout=seven),
        Action(ActionKind.CREATE, Reason.PROFILE_EFFICIENCY, gpu="n/1", model="m", profile="7g.80gb", start=0,
               replica="new"),
        Action(ActionKind.WAIT_READY, Reason.PROFILE_EFFICIENCY, gpu="n/1", model="m", start=0, replica="new"),
        Action(ActionKind.DRAIN, Reason.PROFILE_EFFICIENCY, replica="old"),
        Action(ActionKind.DELETE, Reason.PROFILE_EFFICIENCY, replica="old"),
    ])
    assert errs == []
    for _ in range(30):  # 150 s: the repartition (300 s) outlasts the 120 s bound
        c.advance(np.array([0.0, 0.0]))
    late = c.take_errors()
    assert any("wait_ready new: not ready after 120s" in e for e in late)
    assert sum("skipped" in e and "old" in e for e in late) == 2
    assert {r.id: r.state for r in c.snapshot().replicas}["old"] == ReplicaState.READY  # never break before make
    assert c.take_errors() == []  # each reported once


def test_a_failed_start_fails_the_wait_and_is_not_in_flight():
    c, _ = _cluster(start_delay_s=10)
    c.fail_starts.add("m")
    errs = c.apply([_create(rid="a"),
                    Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND, gpu="n/0", model="m", start=0, replica="a")])
    assert errs == []
    for _ in range(3):
        c.advance(np.zeros(1))
    assert any("failed to start" in e for e in c.take_errors())
    assert c.snapshot().replicas[0].state == ReplicaState.FAILED
    assert c.in_flight() == (frozenset(), frozenset())  # nothing here restarts it: the planner's to replace


def test_rounds_a_gap_apart_show_the_rates_between_the_last_two_as_old_as_the_last():
    """A large fleet's direct scrape (``fast_gap_s`` 20 s): a read sees the rates between the
    last two rounds, taken every 20 s from the start, not the step that just ended; the burst
    layer drops them once the last round is older than its staleness limit, as it would a
    real scrape's."""
    from autoscaler.policy.burst import fresh

    slow, clock = _cluster(start_delay_s=0, fast_gap_s=20.0)
    every, _ = _cluster(start_delay_s=0)
    for c in (slow, every):
        assert c.apply([_create(rid="a")]) == []
    for lam in [50.0] * 8 + [150.0] * 2:  # 40 s at 50 req/s, then a step to 150
        for c in (slow, every):
            c.advance(np.array([lam]))
    assert clock.now() == 50.0
    (now_every,) = every._fast(50.0)
    assert now_every.arrival_rps == pytest.approx(150.0) and now_every.t_s == 50.0
    (seen,) = slow._fast(50.0)
    assert seen.t_s == 40.0 and seen.window_s == 20.0  # the round at 40 s, over the 20 s since the one before
    assert seen.arrival_rps == pytest.approx(50.0)  # the step came after it
    assert fresh(seen, 50.0) is seen  # 10 s old: still used
    (late,) = slow._fast(55.0)
    assert late.t_s == 40.0 and fresh(late, 55.0) is None  # 15 s old: the burst layer goes without
    for c in (slow, every):
        c.advance(np.array([150.0]))
        c.advance(np.array([150.0]))
    (next_round,) = slow._fast(60.0)
    assert next_round.t_s == 60.0 and next_round.arrival_rps == pytest.approx(150.0, rel=1e-3)  # 40-60 s


def test_cli_simulate_leaves_out_multinode_models_and_says_so(tmp_path):
    # the examples' models.yaml holds an llm group on the RDMA pool; a trace generated from
    # it names llm too. The simulator models MIG replicas only: the llm rows are left out, named.
    import json

    root = Path(__file__).resolve().parents[2] / "examples"
    means = {"resnet": 100.0, "bert": 50.0, "rnn": 60.0, "llm": 2.0}
    tr.write_csv(tr.generate("diurnal", list(means), 1200, seed=1, mean_rps=means), tmp_path / "t.csv")
    args = [str(root / "models.yaml"), str(root / "cluster.yaml"), str(tmp_path / "t.csv"), "--warmup-s", "300"]
    res = CliRunner().invoke(app, ["simulate", *args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["not_simulated"] == ["llm"]
    assert set(out["per_model"]) == {"resnet", "bert", "rnn"}
    assert "not simulated: llm (multinode backend" in res.stderr
    both = json.loads(CliRunner().invoke(app, ["simulate", *args, "--json", "--policy", "all"]).stdout)
    assert both["not_simulated"] == ["llm"] and set(both["policies"]) == set(POLICIES)
    only = {"llm": 2.0}
    tr.write_csv(tr.generate("diurnal", list(only), 1200, seed=1, mean_rps=only), tmp_path / "llm.csv")
    res = CliRunner().invoke(app, ["simulate", *args[:2], str(tmp_path / "llm.csv")])
    assert res.exit_code == 2 and "every model in it (llm) runs on the multinode backend" in res.output
    assert "Traceback" not in res.output


def test_simulate_names_a_multinode_model_in_the_trace_as_such():
    from autoscaler.config import initial_cluster_state, load_cluster, load_models, model_specs
    from autoscaler.sim.run import SimError, simulate_specs

    root = Path(__file__).resolve().parents[2] / "examples"
    mc, cc = load_models(root / "models.yaml"), load_cluster(root / "cluster.yaml")
    trace = tr.generate("diurnal", ["resnet", "llm", "nosuch"], 1200, seed=1, mean_rps=5.0)
    with pytest.raises(SimError) as err:
        simulate_specs(model_specs(mc, cc), {}, initial_cluster_state(cc), None, trace, "migscale")
    msg = str(err.value)
    assert "models ['nosuch'] are not in the models config" in msg
    assert "models ['llm'] run on the multinode backend, which the simulator does not model" in msg
