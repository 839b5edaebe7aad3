"""The profiler's sweep rules, driven by a recording fake measurement (no server)."""

from __future__ import annotations

import pytest

from autoscaler.runtime.profile import avg_batch, triton_counters
from autoscaler.runtime.profile_sweep import (
    Arrivals,
    ProfileResult,
    StopReason,
    SweepPoint,
    capacity_at_slo,
    capacity_document,
    concurrency_levels,
    curve_search,
    open_capacity_at_slo,
    rate_search,
    sweep,
)


def pt(c, rps, p99, errors=0, batch=1.0):
    return SweepPoint(concurrency=c, requests=200, errors=errors, duration_s=3.0, throughput_rps=rps,
                      p50_ms=p99 / 2, p95_ms=p99 * 0.9, p99_ms=p99, avg_batch=batch)


class FakeReplica:
    """Answers measure(c) from a table and records which concurrencies were asked for."""

    def __init__(self, table):
        self.table = table
        self.calls: list[int] = []

    def measure(self, c):
        self.calls.append(c)
        return self.table[c]


def test_levels():
    assert concurrency_levels(64) == [1, 2, 4, 8, 16, 32, 64]
    assert concurrency_levels(10) == [1, 2, 4, 8, 10]
    assert concurrency_levels(1) == [1]


def test_stops_when_p99_passes_twice_the_slo_and_keeps_best_within_slo():
    r = FakeReplica({1: pt(1, 30, 35), 2: pt(2, 55, 45), 4: pt(4, 90, 70), 8: pt(8, 120, 110), 16: pt(16, 125, 210)})
    points, why = sweep(r.measure, 100, concurrency_levels(64))
    assert why is StopReason.LATENCY
    assert r.calls == [1, 2, 4, 8, 16]
    # 8 is over the SLO (110 > 100): capacity is the point at 4
    assert capacity_at_slo(points, 100) == 90


def test_stops_when_saturated():
    r = FakeReplica({1: pt(1, 30, 35), 2: pt(2, 60, 40), 4: pt(4, 80, 50), 8: pt(8, 81, 100), 16: pt(16, 82, 200),
                     32: pt(32, 82, 400)})
    points, why = sweep(r.measure, 1000, concurrency_levels(64))
    assert why is StopReason.SATURATED
    assert r.calls == [1, 2, 4, 8, 16]
    assert capacity_at_slo(points, 1000) == 82


def test_stops_on_errors_and_error_points_do_not_count():
    r = FakeReplica({1: pt(1, 30, 35), 2: pt(2, 60, 40, errors=10)})
    points, why = sweep(r.measure, 100, concurrency_levels(8))
    assert why is StopReason.ERRORS
    assert capacity_at_slo(points, 100) == 30


def test_runs_to_the_limit():
    r = FakeReplica({c: pt(c, 10 * c, 10) for c in (1, 2, 4)})
    _, why = sweep(r.measure, 100, concurrency_levels(4))
    assert why is StopReason.MAX_CONCURRENCY


def test_no_point_within_slo_has_no_capacity():
    assert capacity_at_slo([pt(1, 30, 35)], 5) is None
    res = ProfileResult("m", "1g.10gb", 5, [pt(1, 30, 35)], StopReason.LATENCY)
    doc = capacity_document([res, ProfileResult("m", "3g.40gb", 50, [pt(1, 90.37, 20, batch=2.5)])])
    # the planner gets only what meets the SLO, rounded down; the details keep both
    assert doc["models"] == {"m": {"3g.40gb": 90.3}}
    assert set(doc["measured"]["m"]) == {"1g.10gb", "3g.40gb"}
    assert doc["measured"]["m"]["3g.40gb"]["avg_batch_at_capacity"] == 2.5
    assert doc["measured"]["m"]["1g.10gb"]["capacity_rps"] is None


def test_triton_counters_and_avg_batch():
    text = (
        '# TYPE nv_inference_count counter\n'
        'nv_inference_count{model="resnet",version="1"} 800\n'
        'nv_inference_exec_count{model="resnet",version="1"} 100\n'
        'nv_inference_count{model="bert",version="1"} 5\n'
    )
    before = triton_counters(text, "resnet")
    after = {"nv_inference_count": 1600.0, "nv_inference_exec_count": 200.0}
    assert before == {"nv_inference_count": 800.0, "nv_inference_exec_count": 100.0}
    assert avg_batch(before, after) == pytest.approx(8.0)
    # missing counters or no executions: unknown, never 0
    assert avg_batch({}, after) is None
    assert avg_batch(before, before) is None


def opt(rate, p99, errors=0):
    return SweepPoint(concurrency=0, requests=1000, errors=errors, duration_s=1000 / rate, throughput_rps=rate,
                      p50_ms=p99 / 2, p95_ms=p99 * 0.9, p99_ms=p99, avg_batch=1.0, offered_rps=rate)


class PoissonReplica:
    """p99 as a function of the offered rate; records the rates asked for."""

    def __init__(self, p99_at, errors_above=None):
        self.p99_at = p99_at
        self.errors_above = errors_above
        self.calls: list[float] = []

    def measure_rate(self, rate):
        self.calls.append(rate)
        errs = 5 if self.errors_above is not None and rate > self.errors_above else 0
        return opt(rate, self.p99_at(rate), errs)


def test_rate_search_keeps_the_closed_loop_capacity_when_poisson_meets_it():
    r = PoissonReplica(lambda x: 90.0)
    points = rate_search(r.measure_rate, 100, 64.0)
    assert r.calls == [64.0]
    assert open_capacity_at_slo(points, 100) == 64.0


def test_rate_search_bisects_below_a_missed_closed_loop_capacity():
    # p99 crosses the 150 ms SLO at 40 req/s (the emulated 1g resnet's shape, measured)
    r = PoissonReplica(lambda x: 150.0 * x / 40.0)
    points = rate_search(r.measure_rate, 150, 64.0, refine=4)
    assert r.calls == [64.0, 32.0, 48.0, 40.0, 44.0]
    cap = open_capacity_at_slo(points, 150)
    assert cap == 40.0  # p99 exactly at the SLO meets it
    assert 40.0 - 64.0 / 16 <= cap <= 40.0


def test_rate_search_counts_errors_as_a_miss_and_none_when_nothing_meets():
    r = PoissonReplica(lambda x: 10.0, errors_above=20.0)
    points = rate_search(r.measure_rate, 100, 64.0, refine=3)
    assert r.calls == [64.0, 32.0, 16.0, 24.0]
    assert open_capacity_at_slo(points, 100) == 16.0
    never = PoissonReplica(lambda x: 500.0)
    assert open_capacity_at_slo(rate_search(never.measure_rate, 100, 64.0, refine=2), 100) is None
    assert never.calls == [64.0, 32.0, 16.0]


def test_curve_search_spreads_points_up_to_saturation_and_stops_where_it_only_queues():
    r = PoissonReplica(lambda x: 150.0 * x / 40.0)
    have = rate_search(r.measure_rate, 150, 64.0, refine=4)  # 64, 32, 48, 40, 44
    r.calls.clear()
    more = curve_search(r.measure_rate, 150, 80.0, have)
    assert r.calls == [60.0, 72.0]  # 0.6 x 80 = 48 was measured already
    assert [p.offered_rps for p in more] == [60.0, 72.0]
    steep = PoissonReplica(lambda x: 10.0 * x)
    assert [p.offered_rps for p in curve_search(steep.measure_rate, 100, 80.0)] == [48.0]  # 480 ms: over 2x
    failing = PoissonReplica(lambda x: 10.0, errors_above=50.0)
    assert [p.offered_rps for p in curve_search(failing.measure_rate, 100, 80.0)] == [48.0, 60.0]
    assert curve_search(r.measure_rate, 150, 0.0) == []


def test_poisson_result_reports_the_open_loop_capacity_and_keeps_both_curves():
    closed = [pt(1, 30, 35), pt(2, 55, 45), pt(4, 64.5, 64), pt(8, 65, 183)]
    res = ProfileResult("resnet", "1g.10gb", 150, closed, StopReason.LATENCY, arrivals=Arrivals.POISSON,
                        open_points=[opt(64.5, 257), opt(32.25, 129), opt(48.4, 176), opt(40.3, 147.5)])
    assert res.closed_capacity_rps == 64.5
    assert res.capacity_rps == 40.3
    doc = capacity_document([res])
    assert doc["models"] == {"resnet": {"1g.10gb": 40.3}}
    d = doc["measured"]["resnet"]["1g.10gb"]
    assert d["arrivals"] == "poisson" and d["closed_loop_capacity_rps"] == 64.5
    assert d["at_concurrency"] is None and len(d["poisson_points"]) == 4
    # the points spread toward saturation are kept, but never set the capacity
    res.curve_points = [opt(52.0, 140.0), opt(58.5, 190.0)]
    assert res.capacity_rps == 40.3
    d = capacity_document([res])["measured"]["resnet"]["1g.10gb"]
    assert [p["offered_rps"] for p in d["poisson_curve_points"]] == [52.0, 58.5]
    # the plot's Poisson curve is both sets, in rate order
    assert [p.offered_rps for p in res.poisson_curve] == [32.25, 40.3, 48.4, 52.0, 58.5, 64.5]
    # closed arrivals (the default) are unchanged: the concurrency sweep's capacity
    assert ProfileResult("resnet", "1g.10gb", 150, closed).capacity_rps == 64.5
