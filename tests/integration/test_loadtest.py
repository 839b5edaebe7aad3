"""Headless locust runs against one real local Triton replica (loopback, free ports).

What locust counted must be what Triton served: the CSV request count equals
the increase of ``nv_inference_request_success``, up to the requests still in
flight when locust stopped (at most one per user, as each user sends one at a time).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from autoscaler.act.local.triton import TritonProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
LOCUST = str(VENV_BIN / "locust")
MIGSCALE = str(VENV_BIN / "migscale")


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    work = tmp_path_factory.mktemp("triton")
    # No emulation env: resnet runs at CPU speed (~1 ms), so 10 s of load is cheap.
    proc = TritonProcess(REPO / "triton_models", ["resnet", "bert"], work / "replica")
    try:
        proc.start()
        proc.wait_ready(60)
        yield proc
    finally:
        proc.stop()


def success_count(proc: TritonProcess, model: str = "resnet") -> float:
    with urllib.request.urlopen(proc.url_metrics, timeout=5) as r:
        text = r.read().decode()
    pattern = rf'^nv_inference_request_success{{model="{model}",version="1"}} (\S+)$'
    m = re.search(pattern, text, re.MULTILINE)
    assert m, f"{model}'s success counter missing from /metrics"
    return float(m.group(1))


def csv_counts(prefix: Path, name: str = "resnet") -> tuple[int, int, int]:
    """(requests, failures, users) from locust's CSV files."""
    with open(f"{prefix}_stats.csv") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    with open(f"{prefix}_stats_history.csv") as f:
        users = max(int(row["User Count"]) for row in csv.DictReader(f))
    row = rows[name]
    return int(row["Request Count"]), int(row["Failure Count"]), users


def write_models(path: Path, p99_ms: float) -> Path:
    path.write_text(
        "models:\n"
        f"  - name: resnet\n    model_dir: {REPO / 'triton_models' / 'resnet'}\n"
        f"    slo: {{p99_ms: {p99_ms}}}\n"
        f"  - name: bert\n    model_dir: {REPO / 'triton_models' / 'bert'}\n"
        f"    slo: {{p99_ms: {p99_ms}}}\n"
    )
    return path


def run(cmd: list[str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, timeout=timeout)


def test_http_run_counts_match_triton_and_generous_slo_passes(replica, tmp_path):
    models = write_models(tmp_path / "models.yaml", p99_ms=10_000)
    results = tmp_path / "results"
    before = {m: success_count(replica, m) for m in ("resnet", "bert")}
    p = run([MIGSCALE, "loadtest", str(models), "--shape", "constant", "--base-rps", "100",
             "--models", "resnet:3,bert:1", "--duration", "10s", "--host", f"http://{replica.url_http}",
             "--results", str(results)])
    after = {m: success_count(replica, m) for m in ("resnet", "bert")}
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "locust -f" in p.stderr and "--headless" in p.stderr  # the documented line is printed
    counted = {}
    for m in ("resnet", "bert"):
        n, failures, users = csv_counts(results / "locust", m)
        assert failures == 0
        served = after[m] - before[m]
        # every request locust counted was served; Triton may also have served the last
        # in-flight ones (one per user at most) that locust stopped waiting for
        assert n <= served <= n + users, (m, n, served, users)
        counted[m] = n
    total = sum(counted.values())
    assert total >= 100, f"only {total} requests in 10 s at a 100 req/s target"
    # weights 3:1 -> resnet's share 0.75; binomial sd at n>=100 is <= 0.044
    assert 0.6 <= counted["resnet"] / total <= 0.9, counted
    doc = json.loads((results / "slo.json").read_text())
    assert doc["passed"] is True
    assert doc["models"]["resnet"]["requests"] == counted["resnet"]
    assert (results / "report.html").stat().st_size > 1000


def test_an_interrupted_run_is_judged_on_what_ran_marked_so_and_leaves_no_locust(replica, tmp_path):
    import signal
    import time

    import psutil

    models = write_models(tmp_path / "models.yaml", p99_ms=10_000)
    results = tmp_path / "results"
    results.mkdir()
    (results / ".migscale-loadtest").write_text("")  # an earlier run's folder ...
    (results / "slo.json").write_text('{"passed": true}\n')  # ... and its verdict
    p = subprocess.Popen([MIGSCALE, "loadtest", str(models), "--base-rps", "20", "--duration", "60s",
                          "--host", f"http://{replica.url_http}", "--results", str(results)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        locust = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the load has run a few seconds: locust's history has rows
            hist = results / "locust_stats_history.csv"
            if hist.exists() and len(hist.read_text().splitlines()) > 3:
                locust = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
                break
            time.sleep(0.2)
        assert locust, "the load never started"
        p.send_signal(signal.SIGINT)  # to migscale alone, as a terminal's Ctrl-C now reaches it
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, out[-3000:]
    assert "interrupted" in out and "SLO verdict: FAIL" in out
    doc = json.loads((results / "slo.json").read_text())
    assert doc["interrupted"] is True and doc["passed"] is False and doc["planned_s"] == 60.0
    assert 0 < doc["ran_s"] < 60 and doc["models"]["resnet"]["requests"] > 0
    assert [(c["metric"], c["note"]) for c in doc["checks"] if not c["ok"]] == [("run_s", "interrupted")]
    assert not [pid for pid in locust if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_impossible_slo_exits_non_zero(replica, tmp_path):
    models = write_models(tmp_path / "models.yaml", p99_ms=0.001)
    results = tmp_path / "results"
    p = run([LOCUST, "-f", "loadtests/locustfile.py", "--headless", "--host", f"http://{replica.url_http}",
             "--run-time", "3s", "--csv", str(results / "locust"), "--models-yaml", str(models),
             "--slo-models", "resnet", "--shape", "constant", "--base-rps", "30", "--results-dir", str(results)])
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "SLO verdict: FAIL" in p.stdout + p.stderr
    doc = json.loads((results / "slo.json").read_text())
    assert doc["passed"] is False
    # traffic to both (models.yaml, weight 1 each), but only resnet is judged (--slo-models)
    assert [(c["model"], c["metric"]) for c in doc["checks"] if not c["ok"]] == [("resnet", "p99_ms")]
    assert set(doc["models"]) == {"resnet", "bert"}


def test_grpc_run_counts_match_triton(replica, tmp_path):
    results = tmp_path / "results"
    before = success_count(replica)
    p = run([LOCUST, "-f", "loadtests/locustfile.py", "--headless", "--host", replica.url_grpc,
             "--protocol", "grpc", "--run-time", "6s", "--stop-timeout", "10s",
             "--csv", str(results / "locust"), "--models", "resnet",
             "--shape", "ramp", "--base-rps", "20", "--peak-rps", "120", "--slo", "resnet:p99_ms=10000",
             "--results-dir", str(results)])
    after = success_count(replica)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    n, failures, users = csv_counts(results / "locust")
    assert failures == 0 and n >= 60
    assert n <= after - before <= n + users
    stats = (results / "locust_stats.csv").read_text()
    assert "infer-grpc,resnet," in stats


def test_bad_shape_is_a_usage_error(replica, tmp_path):
    p = run([LOCUST, "-f", "loadtests/locustfile.py", "--headless", "--host", replica.url_http,
             "--run-time", "2s", "--models", "resnet", "--shape", "sawtooth"], timeout=60)
    assert p.returncode == 2
    assert "shape: must be one of" in p.stderr and "'sawtooth'" in p.stderr
    assert "Traceback" not in p.stderr


def test_trace_replay_sends_each_model_its_own_rate(replica, tmp_path):
    trace = tmp_path / "trace.csv"
    # resnet alone at 40 req/s for 3 s, then bert alone at 10 req/s for 3 s
    trace.write_text("t_s,model,rps\n0,resnet,40\n0,bert,0\n3,resnet,0\n3,bert,10\n")
    results = tmp_path / "results"
    before = {m: success_count(replica, m) for m in ("resnet", "bert")}
    p = run([LOCUST, "-f", "loadtests/locustfile.py", "--headless", "--host", f"http://{replica.url_http}",
             "--run-time", "6s", "--csv", str(results / "locust"), "--models", "resnet,bert",
             "--shape", "trace", "--shape-args", f"path={trace}", "--results-dir", str(results)])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # expected 120 and 30; splitting the total evenly instead would give 75 and 75
    for m, lo, hi in (("resnet", 90, 150), ("bert", 15, 45)):
        n, failures, users = csv_counts(results / "locust", m)
        assert lo <= n <= hi and failures == 0, (m, n)
        assert n <= success_count(replica, m) - before[m] <= n + users
