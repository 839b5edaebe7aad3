"""``benchmarks/generalization.py``'s per-family comparison at equal attainment: a baseline's
cost to reach migscale's attainment is read off its own frontier, never extrapolated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _pt(knob: float, att: float, gh: float) -> dict:
    return {"target": knob, "attainment": att, "gpu_hours": gh}


def test_two_settings_that_bracket_the_attainment_are_mixed_in_proportion():
    import generalization as g

    got = g.equal_attainment({"attainment": 0.97, "gpu_hours": 90.0}, [_pt(0.7, 0.95, 80.0), _pt(0.5, 0.99, 120.0)],
                             "target")
    assert got["gpu_hours_to_reach"] == pytest.approx(100.0)
    assert got["migscale_vs_that"] == pytest.approx(0.9)
    assert got["dominated"] == []


def test_the_cheapest_way_to_reach_wins_and_costlier_weaker_settings_are_dominated():
    import generalization as g

    pts = [_pt(0.85, 0.95, 80.0), _pt(0.5, 0.99, 120.0), _pt(0.7, 0.98, 90.0), _pt(0.6, 0.96, 130.0)]
    got = g.equal_attainment({"attainment": 0.97, "gpu_hours": 85.0}, pts, "target")
    # 0.95 @ 80 mixed with 0.98 @ 90: two thirds of the way, 86.67; cheaper than any one setting
    assert got["gpu_hours_to_reach"] == pytest.approx(86.67, abs=0.01)
    assert got["dominated"] == [0.6]


def test_an_attainment_no_setting_reaches_is_not_guessed():
    import generalization as g

    got = g.equal_attainment({"attainment": 0.99, "gpu_hours": 100.0},
                             [_pt(0.5, 0.95, 120.0), _pt(0.7, 0.93, 90.0)], "target")
    assert got["gpu_hours_to_reach"] is None and got["migscale_vs_that"] is None
    assert got["best"] == {"target": 0.5, "attainment": 0.95, "gpu_hours": 120.0}
    assert got["dominated"] == [0.5]


def test_the_benchmark_reports_each_family_frontier_and_comparison(tmp_path, capsys):
    import generalization as g

    out, png = tmp_path / "g.json", tmp_path / "g.png"
    # no --plot: the PNG goes beside --out, never over another run's plot in benchmarks/results
    assert g.main(["--families", "steps", "--seeds", "6", "--hours", "0.25", "--workers", "1",
                   "--policies", "migscale,hpa-util", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == d
    front = d["frontier_by_family"]["heldout"]["steps"]
    assert [p["target"] for p in front["hpa-util"]] == list(g.KNOBS["hpa-util"][1])
    cmp = d["equal_attainment"]["heldout"]["steps"]
    assert set(cmp) == {"hpa-util"}  # migscale is the point compared, not a baseline
    m = d["heldout"]["steps"]["migscale"]
    assert cmp["hpa-util"]["migscale"] == {"attainment": m["attainment"], "gpu_hours": m["gpu_hours"]}
    assert png.exists() and (tmp_path / "g-families.png").exists()


def _run(seed: int, att: float) -> dict:
    return {"seed": seed, "attainment": att}


def test_the_attainment_interval_is_taken_over_seed_means_not_over_families():
    import generalization as g

    # per seed, two families: seed means 0.99, 0.98, 1.00
    rs = [_run(1, 0.98), _run(1, 1.0), _run(2, 0.97), _run(2, 0.99), _run(3, 1.0), _run(3, 1.0)]
    got = g.seed_interval(rs)
    se = 0.01 / 3 ** 0.5
    assert got["mean"] == pytest.approx(0.99) and got["se"] == pytest.approx(se, abs=1e-6)
    # Student t with 2 degrees of freedom: 4.303 standard errors either side
    assert got["hi"] - got["mean"] == pytest.approx(4.303 * se, abs=1e-5)
    assert got["mean"] - got["lo"] == pytest.approx(got["hi"] - got["mean"], abs=1e-6)
    # families far apart but every seed alike: no seed noise, no width
    flat = g.seed_interval([_run(s, a) for s in (1, 2, 3) for a in (0.9, 1.0)])
    assert flat["lo"] == flat["hi"] == pytest.approx(0.95)
    assert g.seed_interval([_run(1, 0.9), _run(1, 1.0)]) is None


def test_a_paired_difference_takes_out_what_the_worlds_share():
    import generalization as g

    # the worlds differ a lot (0.90 .. 0.99), migscale is 0.01 above in each: a clear, narrow difference
    base = {(f, s): 0.90 + 0.03 * s + 0.01 * (f == "b") for f in "ab" for s in (1, 2, 3)}
    other = [{"family": f, "seed": s, "attainment": a, "gpu_hours": 10.0 * s} for (f, s), a in base.items()]
    ours = [{"family": f, "seed": s, "attainment": a + 0.01, "gpu_hours": 10.0 * s - 1.0} for (f, s), a in base.items()]
    ours.append({"family": "c", "seed": 1, "attainment": 0.5, "gpu_hours": 1.0})  # no partner: left out
    got = g.paired_interval(ours, other)
    assert got["attainment"]["mean"] == pytest.approx(0.01) and got["attainment"]["lo"] == pytest.approx(0.01)
    assert got["gpu_hours"]["hi"] == pytest.approx(-1.0)
    # unpaired, the same runs' means carry the worlds' spread
    assert g.seed_interval(ours[:-1])["hi"] - g.seed_interval(ours[:-1])["lo"] > 0.1
    assert g.paired_interval(ours, []) is None


def test_misses_are_split_by_how_long_the_model_had_been_short():
    import generalization as g
    import numpy as np

    from autoscaler.sim.run import Timeline

    n = 20
    demand = np.array([[100.0] * n, [0.0] * n])
    cap = np.array([[50.0] * 12 + [200.0] * 8, [10.0] * n])
    att = np.array([[0.5] * 12 + [0.9] + [1.0] * 7, [np.nan] * n])
    tl = Timeline(t_s=np.arange(n) * 5.0, models=("a", "idle"), demand_rps=demand, capacity_rps=cap,
                  p99_ms=np.zeros((2, n)), slo_ms=np.array([100.0, 100.0]), attainment=att,
                  gpus_in_use=np.ones(n), slices_in_use=np.ones(n))
    got = g.missed_by_cause(tl)
    # short for 60 s: the first 45 s (9 steps) are the reaction lag, the last 3 steps past it;
    # the step after, capacity covers the arrivals and the backlog drains
    assert got == pytest.approx({"within_lag": 9 * 50 / 2000, "past_lag": 3 * 50 / 2000,
                                 "capacity_met": 10 / 2000})
    served = np.nansum(demand * np.nan_to_num(att, nan=1.0)) / demand.sum()
    assert sum(got.values()) == pytest.approx(1 - served)


def _result(seeds: list[int], att: dict[int, float], code: str) -> dict:
    """A result file's shape, as far as pooling reads it: two policies on two families."""
    runs = []
    for s in seeds:
        for fam, shift in (("steps", 0.0), ("mixed", -0.01)):
            runs.append({"family": fam, "seed": s, "policy": "oracle", "knob": None, "attainment": 1.0,
                         "gpu_hours": 40.0, "hours": 8.0, "wall_s": 1.0})
            runs.append({"family": fam, "seed": s, "policy": "migscale", "knob": 0.9, "attainment": att[s] + shift,
                         "gpu_hours": 80.0, "hours": 8.0, "wall_s": 2.0, "vs_bound": 1.5})
            runs.append({"family": fam, "seed": s, "policy": "hpa-util", "knob": 0.7, "attainment": att[s] + shift - 0.04,
                         "gpu_hours": 90.0, "hours": 8.0, "wall_s": 1.0, "vs_bound": 2.0})
    overall = {"migscale": {"knob": 0.9}, "hpa-util": {"knob": 0.7}, "oracle": {}}
    return {"setup": {"families": ["steps", "mixed"], "hours": 8.0, "heldout_seeds": seeds, "code": code,
                      "backend": "sim", "shed_at_slo": False},
            "heldout": {"overall": overall}, "runs": runs}


def test_held_out_files_of_disjoint_seeds_pool_into_one_set_of_seeds(tmp_path):
    import generalization as g

    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(_result([6, 7], {6: 0.995, 7: 0.985}, "aaa")))
    b.write_text(json.dumps(_result([11, 12], {11: 0.975, 12: 0.985}, "bbb")))
    out = tmp_path / "pooled.json"
    assert g.main(["--pool", f"{a},{b}", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    ours = got["heldout"]["overall"]["migscale"]
    # four seeds, each the mean of its two families (x - 0.005): 0.990, 0.980, 0.970, 0.980
    assert ours["attainment_interval"]["seeds"] == 4
    assert ours["attainment"] == pytest.approx(0.98)
    assert got["targets"]["mean_attainment>=0.99"]["met"] is False
    assert got["heldout"]["overall"]["hpa-util"]["migscale_minus_this"]["attainment"]["mean"] == pytest.approx(0.04)
    assert [s["code"] for s in got["setup"]["sources"]] == ["aaa", "bbb"]
    # the same seeds twice are not more seeds, nor are two worlds one
    assert g.main(["--pool", f"{a},{a}", "--out", str(out)]) == 2
    other = _result([13], {13: 0.99}, "ccc")
    other["setup"]["backend"] = "kubernetes"
    c = tmp_path / "c.json"
    c.write_text(json.dumps(other))
    assert g.main(["--pool", f"{a},{c}", "--out", str(out)]) == 2
