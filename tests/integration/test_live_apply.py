"""``migscale apply`` on a running ``migscale up``: real tritonserver replicas, nginx, Prometheus.

Add a model, change an SLO, remove a model, and an invalid file, all without
a restart. Deadlines bound the polling; assertions are about outcomes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from _support import live_status, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2] / "triton_models"


def entry(name: str, p99: float = 150) -> str:
    return (f"  - {{name: {name}, model_dir: {REPO / name}, slo: {{p99_ms: {p99}}}, profiles: [1g.10gb],"
            f" min_replicas: 1, max_replicas: 2, capacity: {{1g.10gb: 58}}}}\n")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoscaler", *args], capture_output=True, text=True, check=False,
                          timeout=timeout)


def status(run_dir: Path) -> dict | None:
    return live_status(run_dir)


def ready_models(run_dir: Path) -> set[str]:
    doc = status(run_dir) or {}
    return {r["model"] for r in doc.get("replicas", []) if r["state"] == "ready"}


def all_models(run_dir: Path) -> set[str]:
    return {r["model"] for r in (status(run_dir) or {}).get("replicas", [])}


def slo_served(run_dir: Path, model: str) -> float | None:
    doc = status(run_dir) or {}
    try:
        with urllib.request.urlopen(doc["metrics_api"] + "/v1/plan", timeout=5) as resp:
            models = json.loads(resp.read())["models"]
    except (OSError, KeyError, ValueError):
        return None
    return next((m["slo_p99_ms"] for m in models if m["name"] == model), None)


def test_apply_adds_changes_removes_and_refuses_an_invalid_file_without_restart(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "cluster.yaml").write_text(
        "gpus:\n  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: true}\n"
        "policy: {tick_s: 2}\nlocal: {frontdoor_port: 0, api_port: 0}\n")
    (tmp_path / "models.yaml").write_text("models:\n" + entry("resnet"))
    up = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "up", str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"),
         "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: ready_models(run_dir) == {"resnet"}, 90, "resnet ready", interval_s=0.5)
        assert status(run_dir)["config"]["generation"] == 1

        # an invalid file: exit 2 naming field and value; the running cluster keeps its config
        bad = tmp_path / "bad.yaml"
        bad.write_text("models:\n" + entry("resnet", -5))
        r = cli("apply", str(bad), "--run-dir", str(run_dir))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "models[0].slo.p99_ms" in r.stderr and "-5" in r.stderr and "Traceback" not in r.stderr
        assert status(run_dir)["config"]["generation"] == 1

        # add rnn, tighten resnet's SLO
        both = tmp_path / "both.yaml"
        both.write_text("models:\n" + entry("resnet", 80) + entry("rnn"))
        r = cli("apply", str(both), "--run-dir", str(run_dir))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "in force" in r.stdout and "+rnn" in r.stdout and "~resnet" in r.stdout
        wait_until(lambda: ready_models(run_dir) == {"resnet", "rnn"}, 90, "rnn started", interval_s=0.5)
        wait_until(lambda: slo_served(run_dir, "resnet") == 80.0, 30, "the new SLO in the published plan")

        # remove resnet: its replica drains and goes; rnn is untouched
        rnn_only = tmp_path / "rnn.yaml"
        rnn_only.write_text("models:\n" + entry("rnn"))
        rnn_port = next(x["port"] for x in status(run_dir)["replicas"] if x["model"] == "rnn")
        r = cli("apply", str(rnn_only), "--run-dir", str(run_dir))
        assert r.returncode == 0 and "-resnet" in r.stdout, r.stdout + r.stderr
        wait_until(lambda: all_models(run_dir) == {"rnn"}, 60, "resnet drained", interval_s=0.5)
        assert next(x["port"] for x in status(run_dir)["replicas"] if x["model"] == "rnn") == rnn_port
        table = cli("status", "--run-dir", str(run_dir))
        assert "config:      generation 3 (rnn)" in table.stdout, table.stdout
        assert up.poll() is None  # never restarted

        d = cli("down", "--run-dir", str(run_dir))
        assert d.returncode == 0, d.stdout + d.stderr
        out, _ = up.communicate(timeout=60)
        assert "config generation 2: +rnn, ~resnet" in out and "config generation 3: -resnet" in out, out
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
        cli("down", "--run-dir", str(run_dir))
