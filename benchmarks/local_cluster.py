"""Local backend costs, measured in one run and printed as JSON.

* resident memory per replica: tritonserver + its Python stub (VmRSS, MB), per model;
* replica cold start: process start -> ``/v2/health/ready`` answers 200 (s), median of N;
* latency nginx adds: the same model, the same number of sequential requests,
  alternating one direct call to the replica and one through the front door,
  reported side by side and as a ratio (door / direct). Once with the
  accelerator emulation off (real work only, ~1 ms: the worst case for the
  ratio) and once on an emulated 7g slice.

Usage: python benchmarks/local_cluster.py [--requests 400] [--cold-starts 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as th

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.emulation import emulation_env
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.act.local.triton import TritonProcess
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, Reason

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "triton_models"
GPU = "bench/0"
R = Reason.MIN_REPLICAS


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def cold_starts(n: int, work: Path) -> list[float]:
    out = []
    env = emulation_env("A100-SXM4-80GB", "1g.10gb", GPU, 6, model="resnet")
    for i in range(n):
        p = TritonProcess(REPO, ["resnet"], work / f"cold-{i}", env=env)
        p.start()
        try:
            out.append(p.wait_ready(120))
        finally:
            p.stop()
    return out


def latency(cluster: LocalCluster, model: str, n: int) -> dict:
    (rep,) = [r for r in cluster.replicas() if r.model == model]
    direct = th.InferenceServerClient(rep.process.url_http)
    door = th.InferenceServerClient(cluster.frontdoor_url.removeprefix("http://"))
    x = th.InferInput("SEQUENCE", [1, 20, 8], "FP32")
    x.set_data_from_numpy(np.random.default_rng(0).random((1, 20, 8), dtype=np.float32))
    for _ in range(20):  # warm both paths (connections, first-batch costs)
        direct.infer(model, [x])
        door.infer(model, [x])
    d_ms, f_ms = [], []
    for i in range(n):
        # alternate which goes first so drift (other load on the box) hits both equally
        order = ((direct, d_ms), (door, f_ms)) if i % 2 == 0 else ((door, f_ms), (direct, d_ms))
        for client, acc in order:
            t = time.perf_counter()
            client.infer(model, [x])
            acc.append((time.perf_counter() - t) * 1000)
    md, mf = statistics.median(d_ms), statistics.median(f_ms)
    return {
        "requests_each": n,
        "direct_ms": {
            "p50": round(md, 3),
            "p99": round(pct(d_ms, 0.99), 3),
            "mean": round(statistics.fmean(d_ms), 3),
        },
        "frontdoor_ms": {
            "p50": round(mf, 3),
            "p99": round(pct(f_ms, 0.99), 3),
            "mean": round(statistics.fmean(f_ms), 3),
        },
        "added_ms_p50": round(mf - md, 3),
        "ratio_p50": round(mf / md, 3),
        "ratio_mean": round(statistics.fmean(f_ms) / statistics.fmean(d_ms), 3),
    }


LAYOUTS = {"1g.10gb": (Placement(4, "1g.10gb"), Placement(5, "1g.10gb"), Placement(6, "1g.10gb")),
           "7g.80gb": (Placement(0, "7g.80gb"),)}


def run_cluster(work: Path, emulate: bool, profile: str, models: tuple[str, ...]) -> LocalCluster:
    c = LocalCluster(
        work,
        {m: ModelRuntime(m, REPO, m) for m in models},
        # the instances the replicas use, carved up front (a CREATE needs its instance)
        [GpuState(GPU, "bench", "A100-SXM4-80GB", layout=LAYOUTS[profile])],
        prometheus="off",
        emulate=emulate,
    )
    c.start()
    starts = {"1g.10gb": [6, 5, 4], "7g.80gb": [0]}[profile]
    acts = [
        Action(ActionKind.CREATE, R, gpu=GPU, model=m, profile=profile, start=s)
        for m, s in zip(models, starts)
    ]
    errs = c.apply_and_wait(acts + [Action(ActionKind.WAIT_READY, R)])
    if errs:
        c.stop()
        raise SystemExit(f"could not start replicas: {errs}")
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="sequential requests per path (no emulation)")
    ap.add_argument("--cold-starts", type=int, default=5)
    args = ap.parse_args()
    result: dict = {"machine": {"cpus": os.cpu_count()}}
    with tempfile.TemporaryDirectory(prefix="migscale-bench-") as tmp:
        work = Path(tmp)
        cs = cold_starts(args.cold_starts, work / "cold")
        result["cold_start_s"] = {
            "median": round(statistics.median(cs), 3),
            "min": round(min(cs), 3),
            "max": round(max(cs), 3),
            "n": len(cs),
        }

        c = run_cluster(work / "a", emulate=False, profile="1g.10gb", models=("resnet", "bert", "rnn"))
        try:
            time.sleep(1.0)  # let the stubs settle after loading
            mem = {}
            for r in c.replicas():
                server = rss_mb(r.process.pid)
                stubs = sum(rss_mb(p) for p in children(r.process.pid))
                mem[r.model] = {
                    "tritonserver_mb": round(server, 1),
                    "stub_mb": round(stubs, 1),
                    "total_mb": round(server + stubs, 1),
                }
            result["rss_per_replica"] = mem
            result["nginx_latency_no_emulation"] = latency(c, "rnn", args.requests)
        finally:
            c.stop()

        c = run_cluster(work / "b", emulate=True, profile="7g.80gb", models=("rnn",))
        try:
            result["nginx_latency_emulated_7g"] = latency(c, "rnn", max(50, args.requests // 4))
        finally:
            c.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
