"""The demo report's pure pieces: reaction windows, slice-hours, status accounting, locust history."""

import csv

import pytest

from autoscaler.runtime.demo import DemoScript
from autoscaler.runtime.demo_report import (
    Sample,
    locust_p99_history,
    reaction_windows,
    slice_hours,
    slices_in_use,
    summarize,
    summary_markdown,
)


def test_reaction_windows_follow_rises_only_and_merge():
    offered = [(0, {"a": 10}), (5, {"a": 10}), (10, {"a": 50}), (15, {"a": 50}), (20, {"a": 80}),
               (60, {"a": 10}), (100, {"a": 30})]
    # the start is the baseline; 10 s and 20 s rises merge; the fall at 60 s is no window; 100 s rises 3x
    assert reaction_windows(offered, 30) == [(10, 50), (100, 130)]


def test_small_rises_are_not_reactions():
    assert reaction_windows([(0, {"a": 100}), (5, {"a": 110})], 30) == []  # +10% < 20%
    assert reaction_windows([(0, {"a": 0.5}), (5, {"a": 1.2})], 30) == []  # under 1 req/s absolute


def test_slice_hours_integrates_and_compares_with_the_peak():
    s = [Sample(0, slices_in_use=2), Sample(1800, slices_in_use=6), Sample(3600, slices_in_use=6)]
    used, static = slice_hours(s)
    assert used == pytest.approx(0.5 * 2 + 0.5 * 6)
    assert static == pytest.approx(6.0)
    assert slice_hours([Sample(0, slices_in_use=3)]) == (0.0, 0.0)


def test_slices_in_use_counts_replica_profiles_and_whole_gpus():
    status = {
        "gpus": [{"id": "g0", "product": "A100-SXM4-80GB"}, {"id": "r0", "product": "H100-SXM5-80GB"}],
        "replicas": [
            {"gpu": "g0", "profile": "3g.40gb", "state": "ready"},
            {"gpu": "g0", "profile": "1g.10gb", "state": "starting"},
            {"gpu": "g0", "profile": "2g.20gb", "state": "failed"},  # not holding capacity
            {"gpu": "r0", "profile": "whole", "state": "ready", "gpus": ["r0", "r1"]},  # a group of 2
        ],
    }
    status["gpus"].append({"id": "r1", "product": "H100-SXM5-80GB"})
    assert slices_in_use(status) == (3, 3 + 1 + 7 + 7)


def test_locust_history_is_per_model_and_relative(tmp_path):
    p = tmp_path / "h.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Timestamp", "Name", "99%"])
        w.writerows([[100, "resnet", "N/A"], [101, "resnet", 40], [101, "Aggregated", 50], [103, "bert", 70]])
    assert locust_p99_history(p) == {"resnet": [(0, 40.0)], "bert": [(2, 70.0)]}
    assert locust_p99_history(tmp_path / "missing.csv") == {}


def test_summary_reports_verdict_and_savings():
    samples = [Sample(0, replicas={"m": {"1g.10gb": 1}}, slices_in_use=1),
               Sample(10, replicas={"m": {"1g.10gb": 3}}, slices_in_use=3),
               Sample(20, replicas={"m": {"1g.10gb": 1}}, slices_in_use=1)]
    verdict = {"passed": False, "checks": [{"model": "m", "metric": "p99_ms", "target": 100, "actual": 180,
                                            "ok": False}]}
    s = summarize(samples, verdict, [(0, 10)], decisions=4, scale_events=["t=1 create"])
    assert s["slo_met_outside_reaction_windows"] is False
    assert s["peak_replicas_by_profile"] == {"m": {"1g.10gb": 3}}
    assert s["slice_hours_saved_ratio"] == pytest.approx(1 - (10 + 30) / 60, abs=1e-3)  # rounded to 3 places
    md = summary_markdown(s)
    assert "MISSED" in md and "| m | p99_ms | 100 | 180 | NO |" in md


def test_demo_script_rises_and_falls():
    d = DemoScript(hot="a", base_rps=10, peak_rps=40, steady={"b": 5}, rise_at_s=20, fall_at_s=60, duration_s=80)
    assert d.rates(0) == {"a": 10, "b": 5} and d.rates(30)["a"] == 40 and d.rates(70)["a"] == 10
    rows = d.rows()
    assert rows[0] == (0.0, "a", 10) and max(t for t, _, _ in rows) == 75.0


def test_first_ready_after_rise_counts_ready_replicas_beyond_those_at_the_rise():
    from autoscaler.runtime.demo_report import first_ready_after_rise

    s = [Sample(t, replicas={"a": {"1g.10gb": 1, "3g.40gb": 1}}) for t in range(28)]
    s += [Sample(t, replicas={"a": {"1g.10gb": 2, "3g.40gb": 1}}) for t in range(28, 40)]
    assert first_ready_after_rise(s, "a", 20.0) == 8.0
    assert first_ready_after_rise(s[:28], "a", 20.0) is None  # nothing new became ready
    assert first_ready_after_rise(s, "a", -1.0) is None  # no sample before the rise


def test_p99_over_slo_reads_the_p99_checks_only():
    from autoscaler.runtime.demo_report import p99_over_slo

    checks = [{"model": "a", "metric": "p99_ms", "target": 150, "actual": 96},
              {"model": "a", "metric": "error_rate", "target": 0.0, "actual": 0.0},
              {"model": "b", "metric": "p99_ms", "target": 200, "actual": None},
              {"model": "c", "metric": "requests", "target": None, "actual": None}]
    assert p99_over_slo(checks) == {"a": 0.64}
