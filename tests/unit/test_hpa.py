"""HPA stages against the examples in the Kubernetes HPA documentation."""

from __future__ import annotations

import pytest

from autoscaler.policy import hpa
from autoscaler.policy.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    PolicyType,
    Recommendation,
    ScaleEvent,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
)
from autoscaler.policy.types import Reason

PCT, PODS = PolicyType.PERCENT, PolicyType.PODS


# --------------------------------------------------------------- replica_ratio
@pytest.mark.parametrize(
    "current,value,target,expected,reason",
    [
        (1, 200, 100, 2, Reason.SCALE_UP_DEMAND),  # docs: 200m vs 100m doubles
        (4, 50, 100, 2, Reason.SCALE_DOWN_DEMAND),  # docs: 50m vs 100m halves
        (3, 105, 100, 3, Reason.HOLD_WITHIN_TOLERANCE),  # 1.05 within 0.1
        (3, 91, 100, 3, Reason.HOLD_WITHIN_TOLERANCE),
        (3, 89, 100, 3, Reason.KEEP),  # ceil(3 * 0.89) = 3: outside tolerance, same count
        (10, 111, 100, 12, Reason.SCALE_UP_DEMAND),  # ceil(11.1)
        (5, 0, 100, 0, Reason.SCALE_DOWN_DEMAND),
    ],
)
def test_replica_ratio(current, value, target, expected, reason):
    assert hpa.replica_ratio(current, value, target, 0.1) == (expected, reason)


def test_within_tolerance_boundaries():
    assert hpa.within_tolerance(1.09, 0.1)  # (1.1 itself is float-fragile, as in Kubernetes)
    assert hpa.within_tolerance(0.91, 0.1)
    assert not hpa.within_tolerance(1.11, 0.1)
    assert not hpa.within_tolerance(1.05, 0.0)


# --------------------------------------------------------------- missing pods
@pytest.mark.parametrize(
    "current,values,expected,reason",
    [
        # all report: plain ratio over reporting pods
        (4, [150, 150, 150, 150], 6, Reason.SCALE_UP_DEMAND),
        # scale-up: the missing pod counts as 0% -> 450/400 = 1.125 -> ceil(4.5) = 5
        (4, [150, 150, 150, None], 5, Reason.SCALE_UP_DEMAND),
        # scale-down: the missing pod counts as 100% -> 250/400 = 0.625 -> ceil(2.5) = 3
        (4, [50, 50, 50, None], 3, Reason.SCALE_DOWN_DEMAND),
        # scale-up flips to scale-down once missing pods are 0%: 120/300 -> hold
        (3, [120, None, None], 3, Reason.HOLD_MISSING_METRICS),
        # scale-down lands in tolerance once missing pods are 100%: (85+100+100)/300 = 0.95
        (3, [85, None, None], 3, Reason.HOLD_MISSING_METRICS),
        # nothing reports: hold
        (3, [None, None, None], 3, Reason.HOLD_MISSING_METRICS),
        # within tolerance with all pods
        (2, [105, 95], 2, Reason.HOLD_WITHIN_TOLERANCE),
    ],
)
def test_pods_metric_missing_pod_rules(current, values, expected, reason):
    assert hpa.pods_metric_replicas(current, values, 100, 0.1) == (expected, reason)


# --------------------------------------------------------------- several metrics
@pytest.mark.parametrize(
    "current,proposals,expected,reason",
    [
        (4, [(6, Reason.SCALE_UP_DEMAND), (3, Reason.SCALE_DOWN_DEMAND)], 6, Reason.SCALE_UP_DEMAND),  # max
        (4, [(2, Reason.SCALE_DOWN_DEMAND), (3, Reason.SCALE_DOWN_DEMAND)], 3, Reason.SCALE_DOWN_DEMAND),
        (4, [(2, Reason.SCALE_DOWN_DEMAND), None], 4, Reason.HOLD_MISSING_METRICS),  # failed + down: hold
        (4, [(7, Reason.SCALE_UP_DEMAND), None], 7, Reason.SCALE_UP_DEMAND),  # failed + up: scale up
        (4, [None, None], 4, Reason.HOLD_MISSING_METRICS),
    ],
)
def test_combine_metrics(current, proposals, expected, reason):
    assert hpa.combine_metrics(current, proposals) == (expected, reason)


# --------------------------------------------------------------- stabilization
def test_stabilization_300s_keeps_highest_recommendation():
    # docs: scale-down uses the highest recommendation of the last 300 s
    hist = [Recommendation(0, 10), Recommendation(100, 8), Recommendation(200, 6)]
    assert hpa.stabilize(10, 5, hist, 250, 0, 300) == (10, Reason.HOLD_STABILIZATION)
    # at t=320 the 10 (t=0) has aged out, 8 is the max
    assert hpa.stabilize(10, 5, hist, 320, 0, 300) == (8, Reason.HOLD_STABILIZATION)
    # all aged out: the new recommendation passes
    assert hpa.stabilize(10, 5, hist, 600, 0, 300) == (5, Reason.SCALE_DOWN_DEMAND)


def test_stabilization_scale_up_window_takes_minimum():
    hist = [Recommendation(0, 3), Recommendation(30, 6)]
    # up window 60 s: min(3, 6, 8) = 3 -> stays at current 3
    assert hpa.stabilize(3, 8, hist, 50, 60, 0) == (3, Reason.HOLD_STABILIZATION)
    # once the 3 is out of the window: min(6, 8) = 6
    assert hpa.stabilize(3, 8, hist, 61, 60, 0) == (6, Reason.HOLD_STABILIZATION)
    # default up window 0: immediate
    assert hpa.stabilize(3, 8, hist, 50, 0, 300) == (8, Reason.SCALE_UP_DEMAND)


def test_record_recommendation_prunes_old():
    hist = hpa.record_recommendation(
        [Recommendation(0, 1), Recommendation(200, 2)], Recommendation(400, 3), 300
    )
    assert hist == (Recommendation(200, 2), Recommendation(400, 3))


# --------------------------------------------------------------- behavior
def rules(select, *policies, window=0.0):
    return ScalingRules(window, select, tuple(ScalingPolicy(t, v, p) for t, v, p in policies))


@pytest.mark.parametrize(
    "current,desired,up,expected,reason",
    [
        # default scale-up: max(100% per 15 s, 4 pods per 15 s)
        (1, 20, DEFAULT_SCALE_UP, 5, Reason.RATE_LIMITED),  # max(2, 5)
        (10, 50, DEFAULT_SCALE_UP, 20, Reason.RATE_LIMITED),  # max(20, 14)
        (10, 15, DEFAULT_SCALE_UP, 15, Reason.SCALE_UP_DEMAND),
        # selectPolicy Min picks the smaller change: min(20, 14)
        (10, 50, rules(SelectPolicy.MIN, (PCT, 100, 15), (PODS, 4, 15)), 14, Reason.RATE_LIMITED),
        # Disabled: no scale-up at all
        (10, 50, rules(SelectPolicy.DISABLED, (PCT, 100, 15)), 10, Reason.RATE_LIMITED),
        # maxReplicas (30) beats a higher limit
        (20, 50, DEFAULT_SCALE_UP, 30, Reason.MAX_REPLICAS),
    ],
)
def test_scale_up_behavior(current, desired, up, expected, reason):
    assert hpa.apply_behavior(current, desired, 1, 30, [], up, DEFAULT_SCALE_DOWN, 100.0) == (
        expected,
        reason,
    )


@pytest.mark.parametrize(
    "current,desired,down,expected,reason",
    [
        # docs: Percent 10 / 60 s -> 80 may drop to 72
        (80, 10, rules(SelectPolicy.MAX, (PCT, 10, 60)), 72, Reason.RATE_LIMITED),
        # docs: Pods 4 / 60 s and Percent 10 / 60 s, Max change: 80 -> 72 (10% = 8 > 4)
        (80, 10, rules(SelectPolicy.MAX, (PODS, 4, 60), (PCT, 10, 60)), 72, Reason.RATE_LIMITED),
        # selectPolicy Min: the smaller change, 4 pods -> 76
        (80, 10, rules(SelectPolicy.MIN, (PODS, 4, 60), (PCT, 10, 60)), 76, Reason.RATE_LIMITED),
        # below 40 replicas the Pods policy allows more (10% of 30 = 3 < 4): 30 -> 26
        (30, 10, rules(SelectPolicy.MAX, (PODS, 4, 60), (PCT, 10, 60)), 26, Reason.RATE_LIMITED),
        # Disabled scale-down
        (30, 10, rules(SelectPolicy.DISABLED, (PCT, 100, 15)), 30, Reason.RATE_LIMITED),
        # default 100% / 15 s: straight to desired, but never below minReplicas (2)
        (30, 1, DEFAULT_SCALE_DOWN, 2, Reason.MIN_REPLICAS),
        (30, 5, DEFAULT_SCALE_DOWN, 5, Reason.SCALE_DOWN_DEMAND),
    ],
)
def test_scale_down_behavior(current, desired, down, expected, reason):
    assert hpa.apply_behavior(current, desired, 2, 100, [], DEFAULT_SCALE_UP, down, 100.0) == (
        expected,
        reason,
    )


def test_percent_policy_counts_from_period_start():
    # docs: 80 -> 72 in the first minute; next minute 10% of 72 = 7.2, rounded up to 8 -> 64
    down = rules(SelectPolicy.MAX, (PCT, 10, 60))
    events = hpa.record_scale_event([], 0.0, 80, 72, 60)
    # 30 s later the 8 removed count against the period: start = 72 + 8 = 80 -> limit 72
    assert hpa.apply_behavior(72, 10, 1, 100, events, DEFAULT_SCALE_UP, down, 30.0) == (
        72,
        Reason.RATE_LIMITED,
    )
    # after the period: from 72 -> int(64.8) = 64
    assert hpa.apply_behavior(72, 10, 1, 100, events, DEFAULT_SCALE_UP, down, 61.0) == (
        64,
        Reason.RATE_LIMITED,
    )


def test_pods_policy_4_per_60s_with_history():
    up = rules(SelectPolicy.MAX, (PODS, 4, 60))
    events = (ScaleEvent(10.0, 3),)  # 3 added 10 s in: period start was 2
    # at t=40 with 5 replicas: 2 + 4 = 6
    assert hpa.apply_behavior(5, 20, 1, 100, events, up, DEFAULT_SCALE_DOWN, 40.0) == (6, Reason.RATE_LIMITED)
    # a scale-down inside the period raises the period start: 5 now, 3 added, 1 removed -> start 3 -> 7
    events2 = events + (ScaleEvent(20.0, -1),)
    assert hpa.apply_behavior(5, 20, 1, 100, events2, up, DEFAULT_SCALE_DOWN, 40.0) == (
        7,
        Reason.RATE_LIMITED,
    )


def test_scale_up_limit_never_below_current():
    up = rules(SelectPolicy.MAX, (PODS, 1, 60))
    events = (ScaleEvent(0.0, 5),)  # added 5 in the period, policy allows 1: limit < current
    assert hpa.apply_behavior(6, 9, 1, 100, events, up, DEFAULT_SCALE_DOWN, 10.0) == (6, Reason.RATE_LIMITED)


def test_clamp_and_events():
    assert hpa.clamp(0, 1, 5) == (1, Reason.MIN_REPLICAS)
    assert hpa.clamp(9, 1, 5) == (5, Reason.MAX_REPLICAS)
    assert hpa.clamp(3, 1, 5) == (3, Reason.KEEP)
    ev = hpa.record_scale_event([ScaleEvent(0, 1)], 100.0, 3, 3, 60)
    assert ev == ()  # old one pruned, no change recorded
    ev = hpa.record_scale_event(ev, 101.0, 3, 1, 60)
    assert ev == (ScaleEvent(101.0, -2),)
    assert hpa.longest_period_s(DEFAULT_SCALE_UP, rules(SelectPolicy.MAX, (PCT, 10, 60))) == 60


def test_default_behavior_converges_over_periods():
    """Default scale-up from 1 to 40: 5 at t=0, then doubling each 15 s period: 10, 20, 40."""
    cur, events, t, seen = 1, (), 0.0, []
    while cur < 40 and t < 200:
        new, _ = hpa.apply_behavior(cur, 40, 1, 100, events, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN, t)
        events = hpa.record_scale_event(events, t, cur, new, 15)
        if new != cur:
            seen.append((t, new))
        cur = new
        t += 5.0
    assert seen == [(0.0, 5), (15.0, 10), (30.0, 20), (45.0, 40)]
