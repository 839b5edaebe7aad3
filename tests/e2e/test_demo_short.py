"""`migscale demo` end to end on a tiny cluster and a 35 s script: every part of the report
is written, the controller decided, the SLO verdict reached the exit code, nothing is left running."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from autoscaler.act.local.pids import load_records
from autoscaler.config import load_cluster, load_models
from autoscaler.runtime.demo import DemoScript, run_demo

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "triton_models"


def _write(tmp: Path, p99_ms: float) -> tuple[Path, Path]:
    models = tmp / "models.yaml"
    models.write_text(
        f"""models:
  - name: resnet
    model_dir: {REPO / "resnet"}
    slo: {{p99_ms: {p99_ms}}}
    profiles: [1g.10gb, 2g.20gb]
    min_replicas: 1
    max_replicas: 3
    capacity: {{1g.10gb: 58, 2g.20gb: 113}}
"""
    )
    cluster = tmp / "cluster.yaml"
    cluster.write_text(
        """gpus:
  - {node: n0, product: A100-SXM4-80GB, count: 1, emulated: true, layout: ["2g.20gb@0", "2g.20gb@2"]}
policy:
  tick_s: 3
  short_window_s: 6
  long_window_s: 12
  scale_down: {stabilization_window_s: 10, select_policy: Max,
               policies: [{type: Percent, value: 100, period_s: 15}]}
local: {frontdoor_port: 0, api_port: 0, prometheus: "off"}
"""
    )
    return models, cluster


# The failing verdict needs only a few judged seconds, so its script is shorter
@pytest.mark.parametrize("p99_ms,expected_rc,script", [
    (2000.0, 0, DemoScript(hot="resnet", base_rps=10, peak_rps=60, steady={}, rise_at_s=8, fall_at_s=24,
                           duration_s=35)),
    (1.0, 1, DemoScript(hot="resnet", base_rps=10, peak_rps=60, steady={}, rise_at_s=4, fall_at_s=10,
                        duration_s=20)),
], ids=["met", "missed"])
def test_short_demo_writes_the_report_and_stops_everything(tmp_path, p99_ms, expected_rc, script):
    models, cluster = _write(tmp_path, p99_ms)
    results = tmp_path / "results"
    rc = run_demo(models, load_models(models), load_cluster(cluster), results, live=False, script=script,
                  reaction_s=10, console=Console(file=io.StringIO()))
    assert rc == expected_rc  # the verdict (a 1 ms p99 cannot be met) reaches the exit code
    for f in ("timeline.png", "summary.md", "summary.json", "decisions.jsonl", "timeline.jsonl",
              "demo-trace.csv", "locust/report.html", "locust/locust_stats.csv", "locust/slo.json"):
        assert (results / f).is_file(), f
    summary = json.loads((results / "summary.json").read_text())
    assert summary["decisions"] >= 3
    assert summary["slo_met_outside_reaction_windows"] is (expected_rc == 0)
    assert summary["reaction_windows_s"][0] == [0.0, 10.0]
    assert summary["slice_hours_used"] > 0
    lines = (results / "decisions.jsonl").read_text().splitlines()
    assert all("reasons" in json.loads(x) for x in lines)
    # every process the demo started is gone: replicas run in a folder under the run
    # dir and nginx names it on its command line, so look for anything still there
    assert not _processes_under(results), "processes left behind"
    assert not [r for r in load_records(results / "run") if r.matches()]


def _processes_under(folder: Path) -> list[int]:
    root = str(folder.resolve())
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{d}/cwd")
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(root) or root in cmd:
            found.append(int(d))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_demo_stopped_mid_run_leaves_nothing_running(tmp_path, sig):
    # SIGTERM unwinds as Ctrl-C does (exit 143, everything stopped); SIGKILL runs no code of
    # ours, and every child, the load generator included, dies with the process
    models, cluster = _write(tmp_path, 2000.0)
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "autoscaler", "demo", str(models), str(cluster),
                             "--results", str(results), "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any("locust" in _cmdline(p) for p in _processes_under(results)):
            assert proc.poll() is None and time.monotonic() < deadline, "the load never started"
            time.sleep(0.5)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == (143 if sig == signal.SIGTERM else -signal.SIGKILL), out[-2000:]
        if sig == signal.SIGTERM:
            assert "stopped everything the demo started" in out
        deadline = time.monotonic() + 20  # SIGTERM from the kernel, then the children's own stop
        while _processes_under(results) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _processes_under(results), [_cmdline(p) for p in _processes_under(results)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([sys.executable, "-m", "autoscaler", "down", "--run-dir", str(results / "run")],
                       capture_output=True, timeout=120, check=False)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
