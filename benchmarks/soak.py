"""20-minute soak of the local cluster: the demo's load shape over and over, printed as JSON.

`migscale up` on the example models and cluster (real tritonserver replicas,
the llm group, nginx, Prometheus), then locust replays the demo's trace
(``runtime/demo.py``'s ``default_script``: resnet rises from 35% to 150% of its
starting capacity, holds, falls back; the others steady) back to back for
``--minutes``, so the loop scales up and down every 190 s. Reported:

* failed requests per model outside the reaction windows (the demo's rule:
  the first 10 s and the 35 s after each rise of a model's rate by > 20%),
  and inside them, from locust's per-second history;
* the controller's resident memory (VmRSS) and open file descriptors, sampled
  every 10 s: at the start (after the first full cycle, once caches and the
  Prometheus client are warm), at the end, the max, and end/start -- the
  target is flat within 10%;
* scale actions issued, and after `migscale down` what was left behind.

Heavy (--minutes + ~1 min, every core): run it alone,
    flock /tmp/migscale-heavy.lock nice -n 10 .venv/bin/python benchmarks/soak.py
Options: --minutes 20  --out benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import ROOT, Locust, Stack, emit, left_behind, write_configs

from autoscaler.config import load_models
from autoscaler.runtime.demo import default_script
from autoscaler.runtime.demo_report import reaction_windows

SAMPLE_EVERY_S = 10.0
REACTION_S = 35.0


def _proc_numbers(pid: int | None) -> tuple[int | None, int | None]:
    """(VmRSS in kB, open descriptors) of ``pid``; None when it is gone."""
    if not pid:
        return None, None
    try:
        rss = next(int(ln.split()[1]) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if ln.startswith("VmRSS:"))
        fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except (OSError, StopIteration, ValueError):
        return None, None
    return rss, fds


def _in(t: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in windows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="migscale-soak-"))
    run_dir = workdir / "run"
    models, cluster = write_configs(workdir, run_dir)
    st = Stack(models, cluster, run_dir, workdir / "up.log")
    res: dict = {"minutes": args.minutes}
    loc = None
    try:
        st.up()
        st.wait_ready(5, 240)
        script = default_script(load_models(models), st.status())
        cycles = max(1, math.ceil(args.minutes * 60 / script.duration_s))
        rows = [(k * script.duration_s + t, m, r) for k in range(cycles) for t, m, r in script.rows()]
        trace = workdir / "soak-trace.csv"
        trace.write_text("t_s,model,rps\n" + "".join(f"{t:g},{m},{r:g}\n" for t, m, r in rows))
        offered = [(k * script.duration_s + t, script.rates(t)) for k in range(cycles)
                   for t in [x * script.step_s for x in range(int(script.duration_s / script.step_s))]]
        windows = [(0.0, 10.0), *reaction_windows(offered, REACTION_S)]
        duration = cycles * script.duration_s
        res.update(cycles=cycles, cycle_s=script.duration_s, hot=script.hot, base_rps=script.base_rps,
                   peak_rps=script.peak_rps, steady_rps=script.steady, reaction_windows=len(windows))
        loc = Locust(st.frontdoor, models, workdir / "locust", {m: 1.0 for m in [script.hot, *script.steady]},
                     shape="trace", shape_args=f"path={trace}", duration_s=duration)
        loc.cmd[loc.cmd.index("--base-rps") + 1] = "1"  # the trace carries the rates
        t_start = time.time()
        loc.start()
        samples = []
        while loc.proc.poll() is None and time.time() - t_start < duration + 60:
            rss, fds = _proc_numbers(st.controller_pid())
            s = st.status() or {}
            samples.append({"t_s": round(time.time() - t_start, 1), "rss_kb": rss, "fds": fds,
                            "replicas": len(s.get("replicas", []))})
            time.sleep(SAMPLE_EVERY_S)
        t_end = time.time()
        warm = [x for x in samples if x["t_s"] >= script.duration_s and x["rss_kb"]]
        first, last = (warm[0], warm[-1]) if warm else (samples[0], samples[-1])
        res["controller"] = {
            "rss_mb_start": round(first["rss_kb"] / 1024, 1), "rss_mb_end": round(last["rss_kb"] / 1024, 1),
            "rss_mb_max": round(max(x["rss_kb"] for x in warm or samples) / 1024, 1),
            "rss_end_over_start": round(last["rss_kb"] / first["rss_kb"], 3),
            "fds_start": first["fds"], "fds_end": last["fds"], "fds_max": max(x["fds"] for x in warm or samples),
            "fds_end_over_start": round(last["fds"] / first["fds"], 3),
            "start_at_s": first["t_s"], "end_at_s": last["t_s"],
        }
        res["replicas_min_max"] = [min(x["replicas"] for x in samples), max(x["replicas"] for x in samples)]
        acts: dict[str, int] = {}
        for line in (run_dir / "decisions.jsonl").read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if t_start <= rec.get("t_s", 0) <= t_end:
                for a in rec.get("actions", []):
                    k = f"{a['kind']}:{a['reason']}"
                    acts[k] = acts.get(k, 0) + 1
        res["actions"] = acts
        res["samples"] = samples
    finally:
        if loc is not None:
            loc.stop()
        res["down_rc"] = st.down().returncode
        time.sleep(1)
        res["after_down"] = left_behind(run_dir)
    counts = loc.counts() if loc is not None else {}
    t0 = min((rows[0][0] for rows in counts.values() if rows), default=t_start)
    judged: dict[str, dict[str, int]] = {}
    for model, rows_ in counts.items():
        out = {"sent": 0, "failed": 0, "sent_in_windows": 0, "failed_in_windows": 0}
        prev = (t0, 0, 0)
        for row in rows_:
            d_sent, d_fail = row[1] - prev[1], row[2] - prev[2]
            key = "_in_windows" if _in(row[0] - t0, windows) else ""
            out["sent" + key] += d_sent
            out["failed" + key] += d_fail
            prev = row
        judged[model] = out
    res["requests_outside_reaction_windows"] = {m: {"sent": v["sent"], "failed": v["failed"]}
                                                 for m, v in judged.items()}
    res["requests_in_reaction_windows"] = {m: {"sent": v["sent_in_windows"], "failed": v["failed_in_windows"]}
                                           for m, v in judged.items()}
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"work directory: {workdir}", file=sys.stderr)
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
