"""Demand windows, Knative-style panic mode, required capacity and the correction factor."""

from __future__ import annotations

import math

import pytest

from autoscaler.policy import demand as dm
from autoscaler.policy.types import ModelSignals


def hist(*pairs):
    return tuple(dm.DemandSample(t, r) for t, r in pairs)


def test_observed_demand_adds_backlog_and_none_when_rate_missing():
    assert dm.observed_demand(ModelSignals("m", 0, request_rate=100, pending=200), 10) == 120
    assert dm.observed_demand(ModelSignals("m", 0, request_rate=100), 10) == 100
    assert dm.observed_demand(ModelSignals("m", 0, request_rate=None, pending=5), 10) is None
    assert dm.observed_demand(None, 10) is None


def test_window_average_and_record_prune():
    h = hist((0, 10), (5, 20), (10, 30), (15, 40))
    assert dm.window_average(h, 15, 10) == 35  # samples at 10 and 15
    assert dm.window_average(h, 15, 60) == 25
    assert dm.window_average(h, 100, 10) is None
    h2 = dm.record_demand(h, dm.DemandSample(70, 1), 60)
    assert [s.t_s for s in h2] == [15, 70]


def test_panic_enters_at_threshold_and_leaves_after_stable_window():
    p = dm.PanicState()
    # capacity 50, threshold 2: 99 is not a panic, 100 is
    assert not dm.update_panic(p, 99, 50, 2.0, 60, 0).panicking
    p = dm.update_panic(p, 100, 50, 2.0, 60, 0)
    assert p.panicking and p.since_s == 0 and p.last_trigger_s == 0
    p = dm.update_panic(p, 150, 50, 2.0, 60, 20)  # extends
    assert p.since_s == 0 and p.last_trigger_s == 20
    p = dm.update_panic(p, 10, 50, 2.0, 60, 70)  # 50 s since last trigger: still panicking
    assert p.panicking
    p = dm.update_panic(p, None, 50, 2.0, 60, 200)  # unknown demand changes nothing
    assert p.panicking
    p = dm.update_panic(p, 10, 50, 2.0, 60, 80)  # 60 s after the last trigger: stable again
    assert not p.panicking


def test_panic_from_zero_capacity():
    assert dm.update_panic(dm.PanicState(), 1.0, 0.0, 2.0, 60, 0).panicking
    assert not dm.update_panic(dm.PanicState(), 0.0, 0.0, 2.0, 60, 0).panicking


def test_estimate_uses_long_window_when_stable_and_max_when_panicking():
    h = hist((0, 10), (10, 10), (50, 10), (55, 200), (60, 200))
    stable = dm.estimate(h, dm.PanicState(), 60, 10, 60)
    assert stable.short_rps == 200
    assert stable.long_rps == pytest.approx((10 + 10 + 200 + 200) / 4)  # t=0 is outside (0, 60]
    assert stable.used_rps == stable.long_rps
    panic = dm.estimate(h, dm.PanicState(panicking=True), 60, 10, 60)
    assert panic.used_rps == 200


def test_required_capacity_worked_example():
    assert dm.required_capacity(100, 1.1, 0.2) == pytest.approx(132)
    assert dm.required_capacity(-5, 1.0, 0.2) == 0


@pytest.mark.parametrize(
    "p99,util,avg,expect_change",
    [
        (80, 0.9, False, "up"),  # over the SLO
        (80, 0.1, True, "up"),  # average above SLO also proves violation
        (80, 1.5, False, None),  # overloaded: slow because under-provisioned, not a table error
        (80, None, False, None),  # nothing runs: nothing to learn
        (40, 0.9, False, None),  # inside the dead band
        (10, 0.9, False, "down"),  # busy and far inside the SLO
        (10, 0.2, False, None),  # idle: says nothing
        (10, 0.9, True, None),  # an average cannot prove the p99 is low
        (None, 0.9, False, None),
        (float("nan"), 0.9, False, None),
    ],
)
def test_correction_direction(p99, util, avg, expect_change):
    k, learned = dm.update_correction(1.0, p99, 50.0, util, avg)
    if expect_change is None:
        assert (k, learned) == (1.0, False)
    elif expect_change == "up":
        assert learned and k > 1.0
    else:
        assert learned and k < 1.0


def test_correction_worked_number_and_bounds():
    k, _ = dm.update_correction(1.0, 80, 50, 0.9, False)
    assert k == pytest.approx(1.6**0.2)
    k = 1.0
    for _ in range(200):
        k, _ = dm.update_correction(k, 500, 50, 0.9, False)
    assert k == 2.0
    for _ in range(200):
        k, _ = dm.update_correction(k, 1, 50, 0.95, False)
    assert k == 0.5
    assert math.isfinite(k)


def test_span_utilization_highest_counts_guesses_lowest_only_measured_rates():
    hist = (dm.DemandSample(0.0, 400.0, guess=True), dm.DemandSample(30.0, 70.0), dm.DemandSample(40.0, 80.0))
    # no span of its own: this window's demand for both
    assert dm.span_utilization(hist, 80.0, 40.0, None, 1.0, 100.0) == (0.8, 0.8)
    hi, lo = dm.span_utilization(hist, 80.0, 40.0, 60.0, 1.0, 100.0)
    assert (hi, lo) == (pytest.approx(4.0), pytest.approx(0.7))  # the guess excuses a miss, never makes "busy"
    hi, lo = dm.span_utilization(hist, 80.0, 40.0, 60.0, 0.5, 100.0)
    assert (hi, lo) == (pytest.approx(2.0), pytest.approx(0.35))  # against the corrected table
    # older than the span: gone from both
    assert dm.span_utilization(hist, 80.0, 70.0, 60.0, 1.0, 100.0) == (pytest.approx(0.8), pytest.approx(0.7))
    # only guesses in the span: nothing measured shows it busy
    assert dm.span_utilization(hist[:1], 400.0, 0.0, 60.0, 1.0, 100.0) == (pytest.approx(4.0), None)
    assert dm.span_utilization(hist, 80.0, 40.0, 60.0, 1.0, 0.0) == (None, None)


def test_a_fast_p99_lowers_the_factor_only_when_the_lowest_utilization_is_busy():
    assert dm.update_correction(1.0, 10.0, 50.0, 1.5, False, lowest_utilization=0.7) == (1.0, False)
    f, learned = dm.update_correction(1.0, 10.0, 50.0, 1.5, False, lowest_utilization=0.95)
    assert learned and f < 1.0
    assert dm.update_correction(1.0, 10.0, 50.0, 1.5, False, lowest_utilization=None) == (1.0, False)
    # a miss is still judged by the highest: overloaded somewhere in the span, no lesson
    assert dm.update_correction(1.0, 80.0, 50.0, 1.5, False, lowest_utilization=0.3) == (1.0, False)
