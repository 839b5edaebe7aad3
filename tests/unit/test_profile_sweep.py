"""The profiler's sweep rules, driven by a recording fake measurement (no server)."""

from __future__ import annotations

import pytest

from autoscaler.runtime.profile import (
    ProfileResult,
    StopReason,
    SweepPoint,
    avg_batch,
    capacity_at_slo,
    capacity_document,
    concurrency_levels,
    sweep,
    triton_counters,
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
