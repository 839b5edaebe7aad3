"""Shared by benchmarks/faults.py and benchmarks/soak.py: a real `migscale up` stack under locust.

``Stack`` runs ``migscale up`` as its own process (so it can be killed like a
user's), on the example models and cluster with fixed free ports (the front
door keeps its port across a controller restart, so locust keeps its host),
and reads what the controller publishes: ``status.json``, ``pids.json``,
``decisions.jsonl``. ``Locust`` runs one headless locust process with a
constant or trace shape and reads its per-second history back as per-model
cumulative counts. ``left_behind`` counts what survived ``migscale down``.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from autoscaler.act.local.pids import started_from
from autoscaler.act.local.triton import free_ports
from autoscaler.runtime.loadtest import build_command

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def write_configs(workdir: Path, run_dir: Path, *, policy: dict | None = None) -> tuple[Path, Path]:
    """The example models and cluster with absolute model dirs, fixed free ports and ``run_dir``."""
    models = yaml.safe_load((EXAMPLES / "models.yaml").read_text())
    for m in models["models"]:
        m["model_dir"] = str((EXAMPLES / m["model_dir"]).resolve())
    cluster = yaml.safe_load((EXAMPLES / "cluster.yaml").read_text())
    frontdoor_port, api_port = free_ports(2)  # in one call: two calls may return one port twice
    cluster["local"].update(frontdoor_port=frontdoor_port, api_port=api_port, run_dir=str(run_dir))
    if policy:
        cluster["policy"].update(policy)
    workdir.mkdir(parents=True, exist_ok=True)
    mp, cp = workdir / "models.yaml", workdir / "cluster.yaml"
    mp.write_text(yaml.safe_dump(models, sort_keys=False))
    cp.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return mp, cp


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoscaler", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


class Stack:
    def __init__(self, models: Path, cluster: Path, run_dir: Path, log: Path) -> None:
        self.models, self.cluster, self.run_dir, self.log_path = models, cluster, run_dir, log
        self.proc: subprocess.Popen | None = None
        doc = yaml.safe_load(cluster.read_text())
        self.frontdoor = f"http://127.0.0.1:{doc['local']['frontdoor_port']}"

    def up(self) -> subprocess.Popen:
        log = open(self.log_path, "a")  # noqa: SIM115 - the child keeps it; closed on exit
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", str(self.models), str(self.cluster),
             "--run-dir", str(self.run_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        return self.proc

    def down(self) -> subprocess.CompletedProcess:
        r = cli("down", "--run-dir", str(self.run_dir))
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        return r

    def status(self) -> dict | None:
        try:
            return json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def controller_pid(self) -> int | None:
        try:
            return int(json.loads((self.run_dir / "controller.json").read_text())["process"]["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def all_ready(self, at_least: int = 1, controller: int | None = None) -> dict | None:
        s = self.status()
        if not s or (controller is not None and s.get("controller_pid") != controller):
            return None
        reps = s.get("replicas", [])
        ok = len(reps) >= at_least and all(r["state"] == "ready" for r in reps)
        return s if ok else None

    def wait_ready(self, at_least: int, timeout_s: float, controller: int | None = None) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.all_ready(at_least, controller):
                return time.time()
            time.sleep(0.25)
        raise TimeoutError(f"not every replica ready within {timeout_s:.0f}s: {self.status()}")

    def recorded(self, kind: str) -> list[int]:
        try:
            doc = json.loads((self.run_dir / "pids.json").read_text())
        except (OSError, ValueError):
            return []
        return [c["pid"] for c in doc.get("children", []) if c.get("kind") == kind]

    def scale_downs(self, t0: float, t1: float) -> list[dict]:
        """Replicas the loop removed for lower demand between t0 and t1 (wall clock): one
        DELETE each (its DRAIN is the same scale-down)."""
        out = []
        try:
            lines = (self.run_dir / "decisions.jsonl").read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not (t0 <= float(rec.get("t_s", 0)) <= t1):
                continue
            out += [a for a in rec.get("actions", []) if a.get("kind") == "delete"
                    and a.get("reason") == "scale_down_demand"]
        return out


def left_behind(run_dir: Path) -> dict:
    """Processes started from ``run_dir`` still alive, and its bytes without Prometheus' TSDB."""
    procs = started_from(run_dir, [])
    total = prom = 0
    for f in run_dir.rglob("*"):
        if f.is_file() and not f.is_symlink():
            n = f.stat().st_size
            total += n
            if "prometheus/data" in str(f.relative_to(run_dir)):
                prom += n
    return {"processes": len(procs), "run_dir_bytes": total - prom, "prometheus_data_bytes": prom}


class Locust:
    """One headless locust process; ``counts`` reads its per-second history (per model, cumulative)."""

    def __init__(self, host: str, models_yaml: Path, out: Path, weights: dict[str, float], *,
                 shape: str = "constant", shape_args: str = "", duration_s: float = 3600) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        total = sum(weights.values())
        self.cmd = build_command(
            models_yaml=str(models_yaml), host=host, results=out, duration_s=duration_s, shape=shape,
            shape_args=shape_args, base_rps=total, peak_rps=None, protocol="http",
            models=",".join(f"{m}:{w:g}" for m, w in weights.items()), users_max=200, user_rps=5.0,
            slo="", slo_models="", warmup_s=0.0, slo_ignore="",
        ) + ["--csv-full-history"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.out / "locust.log", "a")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # locust writes its CSVs on the way out
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def counts(self) -> dict[str, list[tuple[float, int, int]]]:
        """Per model: (timestamp, total requests, total failures), one row a second."""
        out: dict[str, list[tuple[float, int, int]]] = {}
        path = self.out / "locust_stats_history.csv"
        if not path.exists():
            return out
        with path.open() as f:
            for row in csv.DictReader(f):
                name = row.get("Name", "")
                if not name or name == "Aggregated":
                    continue
                try:
                    out.setdefault(name, []).append(
                        (float(row["Timestamp"]), int(row["Total Request Count"]), int(row["Total Failure Count"])))
                except (KeyError, ValueError):
                    continue
        return out


def window(counts: dict[str, list[tuple[float, int, int]]], t0: float, t1: float) -> dict[str, dict[str, int]]:
    """Requests sent and failed per model between t0 and t1 (from the cumulative rows around them)."""
    out = {}
    for model, rows in counts.items():
        before = [r for r in rows if r[0] <= t0]
        upto = [r for r in rows if r[0] <= t1 + 1]
        if not upto:
            continue
        a = before[-1] if before else (t0, 0, 0)
        b = upto[-1]
        out[model] = {"sent": b[1] - a[1], "failed": b[2] - a[2]}
    return out


def emit(doc: dict, out: Path | None) -> None:
    """Print ``doc`` as JSON and, given ``out``, write it there too."""
    text = json.dumps(doc, indent=1)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
