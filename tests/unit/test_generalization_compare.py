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
    assert g.main(["--families", "steps", "--seeds", "6", "--hours", "0.25", "--workers", "1",
                   "--policies", "migscale,hpa-util", "--out", str(out), "--plot", str(png)]) == 0
    d = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == d
    front = d["frontier_by_family"]["heldout"]["steps"]
    assert [p["target"] for p in front["hpa-util"]] == list(g.KNOBS["hpa-util"][1])
    cmp = d["equal_attainment"]["heldout"]["steps"]
    assert set(cmp) == {"hpa-util"}  # migscale is the point compared, not a baseline
    m = d["heldout"]["steps"]["migscale"]
    assert cmp["hpa-util"]["migscale"] == {"attainment": m["attainment"], "gpu_hours": m["gpu_hours"]}
    assert png.exists() and (tmp_path / "g-families.png").exists()
