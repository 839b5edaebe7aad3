"""Fault benchmark of the local cluster: inject faults under a steady locust load, print JSON.

Each fault gets its own `migscale up` (the example models and cluster: resnet,
bert, rnn on emulated A100 MIG slices, the llm group of two processes on the
RDMA pool, real nginx and Prometheus) under a steady locust load on every
model, then:

    replica      kill -9 of a resnet replica's tritonserver
    group        kill -9 of rank 1 of the llm group
    prometheus   kill -9 of Prometheus, and again whenever it comes back, for 60 s
    nginx        kill -9 of the nginx master
    controller   kill -9 of the `migscale up` process, then `migscale up` again
    sigterm      SIGTERM to `migscale up`, then `migscale up` again
    disk_full    run dir on a 256 MB tmpfs, filled to the last byte for 30 s

and reports, per fault: the seconds until every replica is ready again
(``status.json``, written every second); requests sent and failed per model
from the fault until 20 s after recovery (locust's per-second history), and for
the replica kill the killed model's failures in the 20 s after the kill; the
loop's scale-down actions (DRAIN/DELETE for lower demand) from the fault to
30 s after recovery; and after `migscale down`: processes started from the run
dir still alive, and its bytes without Prometheus' TSDB.

Targets (issue): replica ready again <= 10 s with <= 1% of its model's
requests failing in the 20 s after; front door back <= 5 s; 0 scale-downs
while Prometheus is gone; controller kill -9 then up: same replicas, no
duplicate tritonserver, no orphan; after every fault 0 processes and <= 50 MB.

Heavy (about 15 minutes, every core): run it alone,
    flock /tmp/migscale-heavy.lock nice -n 10 .venv/bin/python benchmarks/faults.py
Options: --only replica,nginx  --rate 120  --out benchmarks/results/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import ROOT, Locust, Stack, emit, left_behind, window, write_configs

from autoscaler.act.local.pids import proc_alive, proc_command, started_from

FAULTS = ("replica", "group", "prometheus", "nginx", "controller", "sigterm", "disk_full")
# Offered req/s per model: above the starting replicas of resnet (so the loop has scaled up and
# has something it could wrongly scale down while blind), well inside every model's SLO.
WEIGHTS = {"resnet": 180.0, "bert": 25.0, "rnn": 25.0, "llm": 1.5}
WARM_S = 30  # load before the fault: the loop scales to it
POST_S = 20  # judged after recovery
PROM_OUTAGE_S = 60


def _kill(pid: int | None, sig: int = signal.SIGKILL) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _door_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


def _until(pred, timeout_s: float, every_s: float = 0.1):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(every_s)
    return None


def _replica(status: dict, model: str) -> dict:
    return next(r for r in status["replicas"] if r["model"] == model and r["state"] == "ready")


def _steady(st: Stack, at_least: int, hold_s: float = 10.0, timeout_s: float = 240.0) -> dict:
    """The status once every replica has been ready, with the same replicas, for ``hold_s``."""
    t0 = time.time()
    since, ids = None, None
    while time.time() - t0 < timeout_s:
        s = st.all_ready(at_least)
        cur = sorted(r["id"] for r in s["replicas"]) if s else None
        if cur is None or cur != ids:
            since, ids = time.time(), cur
        elif time.time() - since >= hold_s:
            return s
        time.sleep(0.25)
    raise TimeoutError(f"the stack did not settle within {timeout_s:.0f}s: {st.status()}")


def inject(name: str, st: Stack, base: dict) -> dict:
    """Inject one fault; returns {t_fault, t_recovered, ...details} (wall-clock times)."""
    n0 = len(base["replicas"])
    out: dict = {}
    if name == "replica":
        r = _replica(base, "resnet")
        out.update(model="resnet", killed=r["id"])
        t = time.time()
        _kill(r["pid"])
        # ready again: that replica back (same id, new pid) and every replica ready
        done = _until(lambda: (s := st.all_ready(n0)) and any(
            x["id"] == r["id"] and x["pid"] != r["pid"] for x in s["replicas"]), 120, 0.1)
    elif name == "group":
        g = _replica(base, "llm")
        worker = next(m["pid"] for m in g["members"] if m["rank"] == 1)
        out.update(model="llm", killed=f"{g['id']} rank 1")
        t = time.time()
        _kill(worker)
        done = _until(lambda: (s := st.all_ready(n0)) and _replica(s, "llm")["pid"] != g["pid"], 180, 0.1)
    elif name == "prometheus":
        t = time.time()
        kills = 0
        while time.time() - t < PROM_OUTAGE_S:
            for pid in st.recorded("prometheus"):
                if proc_alive(pid) and "prometheus" in proc_command(pid):
                    _kill(pid)
                    kills += 1
            time.sleep(0.2)
        out.update(kills=kills, outage_s=PROM_OUTAGE_S)
        done = _until(lambda: (s := st.status()) and s.get("metrics_mode") == "prometheus"
                      and s["infrastructure"]["prometheus"]["state"] == "up" and st.all_ready(n0), 400, 0.2)
        out["restarts"] = (st.status() or {}).get("infrastructure", {}).get("prometheus", {}).get("restarts")
    elif name == "nginx":
        master = st.recorded("nginx")[0]
        workers = [p for p in started_from(st.run_dir, []) if "nginx: worker" in proc_command(p)]
        t = time.time()
        _kill(master)
        door = _until(lambda: _door_ready(st.frontdoor) and st.recorded("nginx") and st.recorded("nginx")[0] != master,
                      60, 0.05)
        out["frontdoor_back_s"] = round(time.time() - t, 2) if door else None
        out["old_workers_alive"] = sum(proc_alive(w) for w in workers)
        done = _until(lambda: st.all_ready(n0), 60, 0.1)
    elif name == "controller":
        old = st.controller_pid()
        before = set(started_from(st.run_dir, []))
        t = time.time()
        _kill(old)
        st.proc.wait(10)
        st.up()
        new = _until(lambda: (p := st.controller_pid()) and p != old and p, 60, 0.1)
        done = _until(lambda: st.all_ready(n0, controller=new), 240, 0.25)
        now = started_from(st.run_dir, [])
        tritons = [p for p in now if proc_command(p).split(" ")[0].endswith("tritonserver")]
        s = st.status() or {}
        out.update(replicas_before=n0, replicas_after=len(s.get("replicas", [])),
                   tritonservers=len(tritons), old_processes_alive=len(before & set(now)))
    elif name == "sigterm":
        old = st.controller_pid()
        t = time.time()
        _kill(old, signal.SIGTERM)
        st.proc.wait(120)
        out["stop_s"] = round(time.time() - t, 2)
        out["processes_after_stop"] = len(started_from(st.run_dir, []))
        st.up()
        new = _until(lambda: (p := st.controller_pid()) and p != old and p, 60, 0.1)
        done = _until(lambda: st.all_ready(n0, controller=new), 240, 0.25)
    elif name == "disk_full":
        filler = st.run_dir / "filler"
        t = time.time()
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 4096, 1):  # down to the last byte
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)
        time.sleep(30)
        out["controller_alive_when_full"] = bool(st.proc and st.proc.poll() is None)
        s = st.status() or {}
        out["ready_when_full"] = sum(r["state"] == "ready" for r in s.get("replicas", []))
        filler.unlink()
        t_freed = time.time()
        done = _until(lambda: (s := st.all_ready(n0)) and s.get("t_s", 0) > t_freed, 120, 0.25)
        out["fresh_status_after_freeing_s"] = round(time.time() - t_freed, 2) if done else None
    else:  # pragma: no cover
        raise ValueError(name)
    out["t_fault"], out["t_recovered"] = t, (time.time() if done else None)
    out["ready_again_s"] = round(out["t_recovered"] - t, 2) if done else None
    return out


def run_fault(name: str, workdir: Path, rate_scale: float) -> dict:
    wd = workdir / name
    run_dir = wd / "run"
    run_dir.mkdir(parents=True)
    mounted = False
    if name == "disk_full":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(run_dir)], check=True)
        mounted = True
    models, cluster = write_configs(wd, run_dir)
    st = Stack(models, cluster, run_dir, wd / "up.log")
    weights = {m: w * rate_scale for m, w in WEIGHTS.items()}
    loc = Locust(st.frontdoor, models, wd / "locust", weights)
    res: dict = {"fault": name}
    t_end = None
    try:
        st.up()
        st.wait_ready(5, 240)
        loc.start()
        time.sleep(WARM_S)
        base = _steady(st, 5)
        res["replicas_at_fault"] = len(base["replicas"])
        res["t_fault"] = time.time()
        try:
            res.update(inject(name, st, base))
        except Exception as e:  # noqa: BLE001 - a benchmark fault that went wrong is a result too
            res["error"] = f"{type(e).__name__}: {e}"
            res.setdefault("t_recovered", None)
        time.sleep(POST_S)
        t_end = (res["t_recovered"] or time.time()) + POST_S
        res["scale_downs"] = len(st.scale_downs(res["t_fault"], (res["t_recovered"] or time.time()) + 30))
    finally:
        loc.stop()
        down = st.down()
        res["down_rc"] = down.returncode
        time.sleep(1)
        res.update(left_behind(run_dir))
        if mounted:
            for f in ("decisions.jsonl", "controller.log"):  # kept for --keep: the tmpfs goes
                if (run_dir / f).exists():
                    shutil.copy(run_dir / f, wd / f)
            subprocess.run(["umount", "-l", str(run_dir)], check=False)
    counts = loc.counts()
    t_end = t_end or time.time()
    res["requests"] = window(counts, res.get("t_fault", t_end), t_end)
    if name == "replica" and "model" in res:
        res["model_failed_20s_after"] = window(counts, res["t_fault"], res["t_fault"] + 20).get(res["model"])
    for k in ("t_fault", "t_recovered"):
        res.pop(k, None)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(FAULTS), help="comma-separated faults")
    ap.add_argument("--rate", type=float, default=1.0, help="scale the offered load")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "faults.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    bad = [n for n in names if n not in FAULTS]
    if bad:
        print(f"--only: unknown fault(s) {bad}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="migscale-faults-"))
    results = []
    try:
        for n in names:
            print(f"fault {n} ...", file=sys.stderr, flush=True)
            results.append(run_fault(n, workdir, args.rate))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory: {workdir}", file=sys.stderr)
    doc = {"offered_rps": {m: w * args.rate for m, w in WEIGHTS.items()}, "faults": results}
    emit(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
