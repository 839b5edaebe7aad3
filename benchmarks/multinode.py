"""Multinode group costs, measured in one run and printed as JSON.

* group cold start: ``ProcessGroup.start()`` -> every member joined and the
  leader's ``/v2/health/ready`` answers 200 (s), median of N, for a group of 2
  and, side by side, for one process (world size 1, no collective);
* throughput of the 2-process tensor-parallel group vs 1 process on the same
  request: the same ``X`` (``--batch`` rows of 256 floats), the same number of
  closed-loop client threads, the same duration, measured in alternating
  rounds in this one run (group, single, group, single, ...) so drift on a
  shared machine hits both alike. Reported as req/s each and the ratio
  group / single. Each rank (and the single process) gets one torch thread:
  one process per GPU, as deployed. ``single_2threads`` repeats the single
  process with 2 threads to tell the collective's cost from the cores' count.

Usage: python benchmarks/multinode.py [--rounds 2] [--round-s 5] [--batch 8] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as th

from autoscaler.act.local.multinode import ProcessGroup

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "triton_models"
sys.path.insert(0, str(REPO / "llm"))
from tp_mlp import D_MODEL, reference


def cold_starts(size: int, n: int, workdir: Path) -> list[float]:
    out = []
    for i in range(n):
        g = ProcessGroup(REPO, "llm", size, workdir / f"cold{size}-{i}")
        g.start()
        try:
            out.append(g.wait_ready(180))
        finally:
            g.stop()
    return out


def load(url: str, x: np.ndarray, clients: int, seconds: float) -> dict:
    """Closed-loop: ``clients`` threads each send ``x`` back to back for ``seconds``."""
    lat: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run() -> None:
        nonlocal errors
        c = th.InferenceServerClient(url, network_timeout=60)
        inp = th.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        mine = []
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                c.infer("llm", [inp]).as_numpy("Y")
                mine.append(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - counted and reported, never hidden
                with lock:
                    errors += 1
        c.close()
        with lock:
            lat.extend(mine)

    t0 = time.monotonic()
    ts = [threading.Thread(target=run) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    return {"requests": len(lat), "errors": errors, "wall_s": wall, "lat": lat}


def summarize(parts: list[dict], batch: int) -> dict:
    n = sum(p["requests"] for p in parts)
    wall = sum(p["wall_s"] for p in parts)
    lat = sorted(x for p in parts for x in p["lat"])
    return {
        "requests": n,
        "errors": sum(p["errors"] for p in parts),
        "req_s": round(n / wall, 2),
        "rows_s": round(n * batch / wall, 1),
        "p50_ms": round(1000 * lat[len(lat) // 2], 2) if lat else None,
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold-starts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--round-s", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--no-2threads", action="store_true", help="skip the 2-thread single process")
    args = ap.parse_args()

    x = np.random.default_rng(0).standard_normal((args.batch, D_MODEL)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="migscale-bench-mn-") as td:
        work = Path(td)
        cold2 = cold_starts(2, args.cold_starts, work)
        cold1 = cold_starts(1, args.cold_starts, work)

        servers = {
            "group2": ProcessGroup(REPO, "llm", 2, work / "g2"),
            "single": ProcessGroup(REPO, "llm", 1, work / "s1"),
        }
        if not args.no_2threads:
            servers["single_2threads"] = ProcessGroup(
                REPO, "llm", 1, work / "s1t2", env={"MIGSCALE_TORCH_THREADS": "2"}
            )
        try:
            for g in servers.values():
                g.start()
            for g in servers.values():
                g.wait_ready(180)
            # Same answer from each (the group is the reference, sharded).
            want = reference(x)
            for name, g in servers.items():
                c = th.InferenceServerClient(g.url_http)
                inp = th.InferInput("X", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                err = float(np.abs(c.infer("llm", [inp]).as_numpy("Y") - want).max())
                if err > 1e-3:
                    raise SystemExit(f"{name}: result differs from the reference by {err}")
            for g in servers.values():  # warm-up: first batches pay lazy init
                load(g.url_http, x, args.clients, 1.0)
            parts: dict[str, list[dict]] = {k: [] for k in servers}
            for _ in range(args.rounds):
                for name, g in servers.items():
                    parts[name].append(load(g.url_http, x, args.clients, args.round_s))
        finally:
            for g in servers.values():
                g.stop()

    res = {k: summarize(v, args.batch) for k, v in parts.items()}
    out = {
        "cpus": len(os.sched_getaffinity(0)),
        "request": {
            "batch": args.batch,
            "d_model": D_MODEL,
            "clients": args.clients,
            "rounds": args.rounds,
            "round_s": args.round_s,
        },
        "cold_start_s": {
            "group2_median": round(statistics.median(cold2), 3),
            "group2_all": [round(v, 3) for v in cold2],
            "single_median": round(statistics.median(cold1), 3),
            "single_all": [round(v, 3) for v in cold1],
            "ratio_group2_vs_single": round(statistics.median(cold2) / statistics.median(cold1), 3),
        },
        "throughput": res,
        "ratio_group2_vs_single_req_s": round(res["group2"]["req_s"] / res["single"]["req_s"], 3),
    }
    if "single_2threads" in res:
        out["ratio_group2_vs_single_2threads_req_s"] = round(
            res["group2"]["req_s"] / res["single_2threads"]["req_s"], 3
        )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
