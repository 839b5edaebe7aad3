"""How many requests/s one locust process can drive at a trivial Triton model on this machine.

Load tests must know their own ceiling: a target above it measures the load
generator, not the autoscaler. One run, side by side: for HTTP and for gRPC,
locust is asked for far more than it can send (closed loop, ``--users-max``
users each unpaced), and the rate locust counted is printed next to the rate
Triton served (``nv_inference_request_success`` delta) for the same window.
A bare locust user (no pacing, no model choice) is the baseline for what our
``TritonUser`` bookkeeping costs.

    .venv/bin/python benchmarks/locust_ceiling.py [--seconds 10] [--users 32] [--rounds 2]

Prints one JSON object (also written to benchmarks/results/locust_ceiling.json).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autoscaler.act.local.triton import TritonProcess

CONFIG = """name: "ident"
backend: "python"
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 200 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


# The baseline: the least a locust user can do per request (no pacing, no model choice,
# inputs built once), so the ratio shows what TritonUser's pacing and bookkeeping cost.
BASELINE_LOCUSTFILE = """
import time
import numpy as np
import tritonclient.http as httpclient
from locust import User, task


class Bare(User):
    def on_start(self):
        self.c = httpclient.InferenceServerClient(self.host.removeprefix("http://"), concurrency=1)
        self.i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        self.i.set_data_from_numpy(np.ones((1, 4), np.float32), binary_data=True)
        self.o = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]

    @task
    def infer(self):
        t0 = time.perf_counter()
        exc = None
        try:
            self.c.infer("ident", [self.i], outputs=self.o)
        except Exception as e:
            exc = e
        self.environment.events.request.fire(request_type="bare-http", name="ident",
            response_time=(time.perf_counter() - t0) * 1000, response_length=0, exception=exc, context={})
"""


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        m = re.search(rf'^{name}{{model="ident",version="1"}} (\S+)$', text, re.MULTILINE)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def run_locust(proc: TritonProcess, protocol: str, seconds: int, users: int, results: Path) -> dict:
    host = f"http://{proc.url_http}" if protocol != "grpc" else proc.url_grpc
    locust = str(Path(sys.executable).parent / "locust")
    common = ["--headless", "--host", host, "--run-time", f"{seconds}s", "--stop-timeout", "5s",
              "--csv", str(results / protocol), "--loglevel", "ERROR"]
    if protocol == "baseline":
        bare = results / "bare_locustfile.py"
        bare.write_text(BASELINE_LOCUSTFILE)
        cmd = [locust, "-f", str(bare), *common, "-u", str(users), "-r", str(users * 10)]
    else:
        cmd = [locust, "-f", str(REPO / "loadtests" / "locustfile.py"), *common, "--protocol", protocol,
               "--models", "ident", "--shape", "constant", "--base-rps", "1000000",
               "--user-rps", str(1_000_000 / users), "--users-max", str(users),
               "--ramp-users-per-s", str(users * 10)]
    before = counters(proc.url_metrics)
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=seconds + 60, check=False)
    after = counters(proc.url_metrics)
    with open(results / f"{protocol}_stats.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "ident")
    n = int(row["Request Count"])
    served = after["nv_inference_request_success"] - before["nv_inference_request_success"]
    d_exec = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
    return {
        "locust_exit": p.returncode,
        "locust_requests": n,
        "locust_failures": int(row["Failure Count"]),
        "locust_rps": round(n / seconds, 1),
        "triton_served": int(served),
        "triton_rps": round(served / seconds, 1),
        "counted_over_served": round(n / served, 4) if served else None,
        "p50_ms": float(row["50%"]),
        "p99_ms": float(row["99%"]),
        "avg_batch": round((after["nv_inference_count"] - before["nv_inference_count"]) / d_exec, 2)
        if d_exec else None,
    }


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="each round runs all three, in rotated order")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "locust_ceiling.json"),
                    help="also write the JSON here ('' to skip)")
    args = ap.parse_args()
    order = ["http", "grpc", "baseline"]
    runs: dict[str, list[dict]] = {k: [] for k in order}
    with tempfile.TemporaryDirectory(prefix="migscale-ceiling-") as tmp:
        repo = Path(tmp) / "models"
        (repo / "ident" / "1").mkdir(parents=True)
        (repo / "ident" / "config.pbtxt").write_text(CONFIG)
        (repo / "ident" / "1" / "model.py").write_text(MODEL)
        proc = TritonProcess(repo, ["ident"], Path(tmp) / "replica")
        try:
            proc.start()
            proc.wait_ready(60)
            for r in range(args.rounds):
                # rotate the order: on a shared 2-core machine, background load drifts during a run
                for proto in order[r % 3:] + order[: r % 3]:
                    try:
                        runs[proto].append(run_locust(proc, proto, args.seconds, args.users, Path(tmp)))
                    except OSError as e:
                        sys.exit(f"locust_ceiling: {proto} round {r}: {e}; tritonserver alive={proc.alive()}, "
                                 f"log tail:\n{proc.tail_log(30)}")
        finally:
            proc.stop()
    med = {k: _median([x["locust_rps"] for x in v]) for k, v in runs.items()}
    doc = json.dumps({
        "benchmark": "locust_ceiling",
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "seconds": args.seconds,
        "users": args.users,
        "rounds": args.rounds,
        "model": "ident (Python backend, FP32[4], dynamic batching)",
        "median_locust_rps": med,
        "http_over_baseline_rps": round(med["http"] / med["baseline"], 3) if med["baseline"] else None,
        "grpc_over_http_rps": round(med["grpc"] / med["http"], 3) if med["http"] else None,
        "runs": runs,
    }, indent=2)
    print(doc)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(doc + "\n")


if __name__ == "__main__":
    main()
