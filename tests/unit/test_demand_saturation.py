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
