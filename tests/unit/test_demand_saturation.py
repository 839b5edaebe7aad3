"""Saturation pressure (closed-loop clients hide demand) and the correction factor's relaxation."""

import math

import pytest

from autoscaler.policy import demand as dm
from autoscaler.policy.types import ModelSignals


def sig(rate=100.0, q=None, c=None, qcr=None, pending=None):
    return ModelSignals("m", 0.0, request_rate=rate, avg_queue_ms=q, avg_compute_ms=c,
                        queue_compute_ratio=qcr, pending=pending)


@pytest.mark.parametrize(
    "q,c,expected",
    [
        (0.5, 30.0, 1.0),  # batching wait only
        (30.0, 30.0, 1.0),  # ratio exactly 1: still ordinary
        (90.0, 30.0, 2.0),  # ratio 3 -> (1+3)/2
        (150.0, 30.0, 3.0),  # ratio 5 -> 3x
        (270.0, 30.0, 4.0),  # ratio 9 -> 5x, capped at MAX_SATURATION_PRESSURE
        (30000.0, 20.0, 4.0),  # a 30 s queue behind 20 ms compute: still 4x, not 750x
    ],
)
def test_pressure_from_queue_and_compute(q, c, expected):
    assert dm.saturation_pressure(sig(q=q, c=c)) == pytest.approx(expected)


def test_pressure_falls_back_to_the_ratio_series_and_ignores_missing():
    assert dm.saturation_pressure(sig(qcr=3.0)) == pytest.approx(2.0)
    assert dm.saturation_pressure(sig()) == 1.0
    assert dm.saturation_pressure(None) == 1.0
    assert dm.saturation_pressure(sig(q=float("nan"), c=10.0)) == 1.0


def test_observed_demand_scales_the_saturated_rate_or_adds_backlog_never_both():
    # 100 req/s served, waiting 3x compute -> 200 req/s wanted; 50 queued / 10 s
    # would add 5, but the queue is what makes the wait long: the larger counts
    assert dm.observed_demand(sig(q=90.0, c=30.0, pending=50.0), 10.0) == pytest.approx(200.0)
    # a backlog bigger than the pressure says: 100 + 2000 / 10
    assert dm.observed_demand(sig(q=90.0, c=30.0, pending=2000.0), 10.0) == pytest.approx(300.0)
    assert dm.observed_demand(sig(rate=None, q=90.0, c=30.0), 10.0) is None


def test_pressure_only_applies_when_the_rate_is_near_capacity():
    busy = sig(rate=100.0, q=120.0, c=30.0, pending=0.0)  # ratio 4 -> 2.5x
    # 100 req/s on 250 req/s of capacity (40%): the rate is the demand, the wait is ordinary queueing
    assert dm.observed_demand(busy, 10.0, capacity_rps=250.0) == pytest.approx(100.0)
    # at 95% of capacity it is saturated: pressure applies
    assert dm.observed_demand(busy, 10.0, capacity_rps=105.0) == pytest.approx(250.0)
    # capacity unknown (nothing runs): as before
    assert dm.observed_demand(busy, 10.0, capacity_rps=None) == pytest.approx(250.0)
    # below capacity a backlog still counts
    assert dm.observed_demand(sig(rate=100.0, pending=200.0), 10.0, capacity_rps=250.0) == pytest.approx(120.0)


def test_correction_relaxes_toward_one_when_healthy_and_never_below():
    f = 2.0
    for _ in range(200):
        f, learned = dm.update_correction(f, 40.0, 150.0, 0.3, False)
        assert learned
    assert 1.0 <= f < 1.05
    # at 1.0 and healthy: nothing to relax
    assert dm.update_correction(1.0, 40.0, 150.0, 0.3, False) == (1.0, False)


def test_correction_still_rises_on_a_miss_within_capacity():
    f, learned = dm.update_correction(1.0, 300.0, 150.0, 0.8, False)
    assert learned and f == pytest.approx(math.exp(0.2 * math.log(2.0)))


def test_a_saturation_guess_is_a_demand_above_the_served_rate_near_capacity():
    # at capacity, the backlog or the pressure add to the served rate: a guess
    assert dm.is_saturation_guess(sig(rate=100.0, pending=200.0), 10.0, capacity_rps=100.0)
    assert dm.is_saturation_guess(sig(rate=100.0, q=90.0, c=30.0), 10.0, capacity_rps=105.0)
    assert dm.is_saturation_guess(sig(rate=100.0, q=90.0, c=30.0), 10.0, capacity_rps=None)
    # well below capacity the rate (plus backlog) is measured; nothing added is measured too
    assert not dm.is_saturation_guess(sig(rate=100.0, pending=200.0), 10.0, capacity_rps=250.0)
    assert not dm.is_saturation_guess(sig(rate=100.0), 10.0, capacity_rps=100.0)
    assert not dm.is_saturation_guess(sig(rate=None, pending=5.0), 10.0, capacity_rps=100.0)
    assert not dm.is_saturation_guess(None, 10.0, capacity_rps=100.0)


def test_a_miss_relaxes_an_optimistic_correction_toward_one_at_any_load():
    # Overloaded on the saturation guess (utilization 3.2): the miss cannot raise the
    # factor past 1 (that needs utilization <= 1), but a factor below 1 -- replicas
    # serving more than their table -- is refuted by any miss and moves toward 1.
    f, learned = dm.update_correction(0.5, 600.0, 100.0, 3.2, False)
    assert learned and f == pytest.approx(0.5 ** 0.8)
    for _ in range(100):
        f, _ = dm.update_correction(f, 600.0, 100.0, 3.2, False)
    assert 0.99 < f <= 1.0
    # at 1 the overload teaches nothing, as before
    assert dm.update_correction(1.0, 600.0, 100.0, 3.2, False) == (1.0, False)
    # within the SLO an optimistic factor stays: only a miss refutes it
    assert dm.update_correction(0.5, 90.0, 100.0, 3.2, False) == (0.5, False)


def test_relax_optimism_never_passes_one_and_needs_a_real_miss():
    assert dm.relax_optimism(0.5, 150.0, 100.0) == (pytest.approx(0.5 ** 0.8), True)
    assert dm.relax_optimism(0.99, 1e6, 100.0)[0] <= 1.0
    for p99, slo in ((100.0, 100.0), (None, 100.0), (150.0, None), (float("nan"), 100.0), (150.0, 0.0)):
        assert dm.relax_optimism(0.5, p99, slo) == (0.5, False)
    assert dm.relax_optimism(1.3, 500.0, 100.0) == (1.3, False)  # above 1 is update_correction's business
