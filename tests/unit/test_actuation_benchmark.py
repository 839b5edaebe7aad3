"""``benchmarks/actuation.py`` end to end on a tiny matrix: every world and policy is reported,
the priced rule never beats the hindsight bound, and the frontier carries the asked quantiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_actuation_reports_every_world_and_the_priced_rule_never_beats_hindsight(tmp_path, capsys):
    import actuation

    from autoscaler.policy.forecast import HeadroomConfig

    out = tmp_path / "a.json"
    assert actuation.main(["--families", "steps", "--seeds", "1", "--hours", "0.5", "--workers", "1",
                           "--worlds", "benchmark,exact-metrics", "--quantiles", "0.8", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == d
    summ = d["summary"]
    assert set(summ) == {*actuation.PRICED, "benchmark", "exact-metrics"}
    for world in ("benchmark", "exact-metrics"):
        assert set(summ[world]) == {"migscale", "windowed-max"}
        for row in summ[world].values():
            assert row["steps"]["runs"] == 1 and row["overall"]["gpu_hours"] > 0
            # whole GPUs cost at least the slices they hold, priced 7 to a GPU
            assert row["overall"]["gpu_hours"] >= row["overall"]["slice_gpu_hours"] > 0
    priced = summ["priced-like-the-bound"]["windowed-max"]["overall"]
    assert priced["bound_runs"] == 1 and priced["vs_reactive_bound"] >= 1.0 - 1e-9
    # whole replicas cost at least the fractional slices; queues change attainment, not GPU-hours
    whole = summ["priced-whole-replicas"]["windowed-max"]["overall"]
    queued = summ["priced-whole-queued"]["windowed-max"]["overall"]
    assert whole["gpu_hours"] >= priced["gpu_hours"] and queued["gpu_hours"] == whole["gpu_hours"]
    assert set(summ["priced-whole-queued-fast"]["windowed-max"]) == {"steps", "overall"}
    # the asked quantile, and the default one (the world's summary run)
    assert [p["quantile"] for p in d["frontier"]["windowed-max"]] == sorted({0.8, HeadroomConfig.quantile})
    # the quantile-0.8 run is in the frontier only, not in the world's summary
    assert summ["benchmark"]["windowed-max"]["overall"]["runs"] == 1
