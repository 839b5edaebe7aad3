"""``migscale profile`` against real tritonserver replicas on emulated MIG slices.

The emulated slices pad each batch to ``batch1_ms + (batch-1) * per_item_ms``
(``emulation.json``), so a saturated replica serves ``b * 1000 / batch_ms(b)``
req/s at average batch ``b``. Profiling on two profiles must reproduce the
ratio of those two numbers, each taken at the average batch Triton reported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoscaler.act.local.emulation import expected_batch_ms
from autoscaler.config import load_capacity_file

pytestmark = [pytest.mark.integration, pytest.mark.alone]

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "triton_models" / "resnet"
MIGSCALE = str(Path(sys.executable).parent / "migscale")


def write_configs(tmp: Path, p99_ms: float) -> tuple[Path, Path]:
    models = tmp / "models.yaml"
    models.write_text(f"models:\n  - name: resnet\n    model_dir: {RESNET}\n    slo: {{p99_ms: {p99_ms}}}\n")
    cluster = tmp / "cluster.yaml"
    cluster.write_text("gpus:\n  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: true}\n")
    return models, cluster


def test_capacity_ratio_matches_emulated_speed_curve(tmp_path):
    # A generous SLO: both profiles reach saturation (16 in flight fill batches of 8), where the curve is steepest.
    models, cluster = write_configs(tmp_path, p99_ms=2000)
    out = tmp_path / "capacity.yaml"
    p = subprocess.run([MIGSCALE, "profile", str(models), str(cluster), "--profiles", "1g.10gb,3g.40gb",
                        "--out", str(out), "--point-s", "2", "--min-requests", "100", "--max-concurrency", "16"],
                       capture_output=True, text=True, check=False, timeout=280, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # what the planner reads
    table = load_capacity_file(out)["resnet"]
    assert set(table) == {"1g.10gb", "3g.40gb"}
    measured = yaml.safe_load(out.read_text())["measured"]["resnet"]

    def expected_rps(profile: str, kind: str) -> float:
        b = measured[profile]["avg_batch_at_capacity"]
        assert b is not None and b >= 1
        return b * 1000.0 / expected_batch_ms(RESNET, kind, b)

    want = expected_rps("3g.40gb", "3g") / expected_rps("1g.10gb", "1g")
    got = table["3g.40gb"] / table["1g.10gb"]
    assert got == pytest.approx(want, rel=0.15), (got, want, measured)
    # every point carries Triton's own batch figure and client-side percentiles
    for prof in ("1g.10gb", "3g.40gb"):
        pts = measured[prof]["points"]
        assert pts[0]["concurrency"] == 1 and all(pt["p99_ms"] >= pt["p50_ms"] for pt in pts)
        assert all(pt["requests"] >= 100 or pt["unstable"] for pt in pts)
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_poisson_arrivals_find_a_lower_capacity_that_meets_the_slo(tmp_path):
    # Independent users' requests bunch: at the closed-loop capacity (4 in flight, batches
    # of 4) Poisson arrivals wait longer than the closed loop's requests did, and here they
    # miss a 150 ms p99 (257 ms at 64.6 req/s), so the search lands below it, on a rate
    # whose own p99 met the SLO.
    models, cluster = write_configs(tmp_path, p99_ms=150)
    out = tmp_path / "capacity.yaml"
    p = subprocess.run([MIGSCALE, "profile", str(models), str(cluster), "--profiles", "1g.10gb",
                        "--out", str(out), "--point-s", "2", "--min-requests", "100", "--max-concurrency", "16",
                        "--arrivals", "poisson", "--open-requests", "300", "--refine", "2"],
                       capture_output=True, text=True, check=False, timeout=280, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = yaml.safe_load(out.read_text())
    m = doc["measured"]["resnet"]["1g.10gb"]
    assert m["arrivals"] == "poisson" and doc["run"]["arrivals"] == "poisson"
    closed, cap = m["closed_loop_capacity_rps"], m["capacity_rps"]
    pts = m["poisson_points"]
    assert closed is not None and cap is not None, m
    assert pts[0]["offered_rps"] == pytest.approx(closed, abs=0.01)  # the closed-loop capacity is tried first
    at_closed = [pt for pt in m["points"] if pt["throughput_rps"] == pytest.approx(closed, abs=0.01)]
    assert at_closed and pts[0]["p99_ms"] > at_closed[0]["p99_ms"], m  # the bunching's cost
    if pts[0]["p99_ms"] > 150:  # and it missed the SLO there: the search bisects below
        assert cap < closed and len(pts) == 3, m
    else:  # the miss is a measurement, so a slow machine can put it just inside the SLO
        assert cap == pytest.approx(closed, abs=0.01) and len(pts) == 1, m
    at = [pt for pt in pts if pt["offered_rps"] == cap]
    assert at and at[0]["p99_ms"] <= 150 and at[0]["errors"] == 0
    assert all(pt["requests"] + pt["errors"] >= 300 or pt["unstable"] for pt in pts)
    # What the planner reads: the capacity rounded down to 0.1 req/s, never above what was
    # measured. ``cap`` is the same capacity rounded to 0.01, so it may lie up to 0.005 either
    # side of the value that was floored (32.496 -> 32.4 in the table, 32.5 in ``measured``).
    table = load_capacity_file(out)["resnet"]["1g.10gb"]
    assert cap - 0.105 < table <= cap + 0.005, (table, cap)
    assert round(table * 10) == pytest.approx(table * 10, abs=1e-9), table  # whole tenths
    # then points spread toward saturation, for the simulator's queue: measured with their
    # medians, and never moving the capacity above
    sat = max(pt["throughput_rps"] for pt in m["points"] if not pt["errors"])
    spread = m["poisson_curve_points"]
    assert spread and all(any(pt["offered_rps"] == pytest.approx(f * sat, abs=0.01) for f in (0.6, 0.75, 0.9))
                          for pt in spread), spread
    assert all(pt["p50_ms"] <= pt["p99_ms"] for pt in spread if pt["p99_ms"] is not None)


def test_slo_no_profile_can_meet_exits_3(tmp_path):
    # 1g pads a batch of one to 31.4 ms: a 5 ms p99 is out of reach at any concurrency.
    models, cluster = write_configs(tmp_path, p99_ms=5)
    out = tmp_path / "capacity.yaml"
    p = subprocess.run([MIGSCALE, "profile", str(models), str(cluster), "--profiles", "1g.10gb",
                        "--out", str(out), "--point-s", "1", "--min-requests", "20"],
                       capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path)
    assert p.returncode == 3, p.stdout[-2000:] + p.stderr[-2000:]
    assert "resnet: no profile meets its SLO p99 <= 5 ms" in p.stderr
    assert "Traceback" not in p.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["models"] == {}
    pts = doc["measured"]["resnet"]["1g.10gb"]["points"]
    # stopped at the first point: p99 > 2x SLO
    assert len(pts) == 1 and pts[0]["p99_ms"] > 10
    assert doc["measured"]["resnet"]["1g.10gb"]["stop"] == "p99 above 2x SLO"


def test_profile_not_allowed_is_a_usage_error(tmp_path):
    models, cluster = write_configs(tmp_path, p99_ms=100)
    p = subprocess.run([MIGSCALE, "profile", str(models), str(cluster), "--profiles", "9g.99gb"],
                       capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path)
    assert p.returncode == 2
    assert "--profiles: '9g.99gb' is not allowed for resnet" in p.stderr


def test_profile_never_writes_over_its_own_inputs(tmp_path):
    models, cluster = write_configs(tmp_path, p99_ms=100)
    before = models.read_text(), cluster.read_text()
    for args, msg in ((["--out", str(models)], f"--out: {models} is MODELS"),
                      (["--out", str(tmp_path / "cap.yaml"), "--plot", str(cluster)], f"--plot: {cluster} is CLUSTER")):
        p = subprocess.run([MIGSCALE, "profile", str(models), str(cluster), *args],
                           capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
    assert (models.read_text(), cluster.read_text()) == before
