"""Benchmark: the HPA's custom-metrics call against 1,000 Deployments, vs the bare /healthz.

What it measures: the request an HPA makes every sync period --
``GET .../namespaces/default/pods/*/migscale_replica_ratio?labelSelector=migscale.io/deployment=<d>``
-- for a Deployment picked at random per request, while the API serves 1,000
Deployments x 5 pods (5,000 pods). In the same run, with the same server and
the same load settings, it measures ``/healthz`` as the baseline: the cost of
the HTTP stack with no metrics work at all.

How: the app runs in this process under uvicorn (httptools + uvloop when
installed) on 127.0.0.1; the load generator is ``wrk`` (C, a separate
process, keep-alive connections) with a Lua script that picks the Deployment.
Without wrk it falls back to a Python load generator in a separate process
(slower: it then shares the 2 CPUs with the server in a less efficient way;
the JSON says which generator ran). Both the server and the generator run
on the same machine, so the figures include the generator's CPU use.

The phases run in interleaved rounds (list, route, cached, baseline, list,
...), so other load on a shared machine hits all of them alike; rps is total
requests over total time, p50/p99 the median round's (the worst round's p99
is reported too).

Prints one JSON object: rps, p50_ms, p99_ms (the list call, uncached: the
answer is computed from the snapshot's index for every request), cached_*
(the same call served from the per-tick response cache), fastapi_route_*
(the uncached call forced through FastAPI's router instead of the fast
path), baseline_rps, baseline_p99_ms (/healthz), plus ratios and settings.

    .venv/bin/python benchmarks/metrics_api.py [--duration 10] [--connections 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from autoscaler.api import ApiState, create_app, serve_in_thread
from autoscaler.api.server import LOOP
from autoscaler.api.synthetic import large_tick
from autoscaler.api.tls import HTTP_IMPL

LIST_PATH = (
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/migscale_replica_ratio"
    "?labelSelector=migscale.io/deployment%3D{name}"
)

WRK_LUA = r"""
math.randomseed(12345)
local n = __N__
local fmt = "__FMT__"
local random_path = __RANDOM__
request = function()
  if random_path then
    local i = math.random(0, n - 1)
    return wrk.format("GET", string.format(fmt, i))
  end
  return wrk.format("GET", fmt)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"errors":%d,"non2xx":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def run_wrk(url: str, path_fmt: str, random_path: bool, n: int, duration_s: float, connections: int,
            threads: int) -> dict:
    if random_path:  # a Lua format string: the query's %3D must be %%3D
        path_fmt = path_fmt.replace("%3D", "%%3D")
    lua = (WRK_LUA.replace("__N__", str(n)).replace("__FMT__", path_fmt)
           .replace("__RANDOM__", "true" if random_path else "false"))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
        script = f.name
    try:
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, int(duration_s))}s", "--timeout", "5s",
             "-s", script, url],
            capture_output=True, text=True, timeout=duration_s + 60, check=True,
        ).stdout
    finally:
        os.unlink(script)
    line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
    r = json.loads(line)
    return {
        "rps": r["requests"] / (r["duration_us"] / 1e6),
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "requests": r["requests"],
        "errors": r["errors"] + r["non2xx"],
    }


_PY_GEN = r"""
import http.client, json, random, sys, threading, time
host, port, fmt, rnd, n, dur, conns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
lat, errors = [], [0]
stop = time.perf_counter() + dur
def worker(seed):
    rng = random.Random(seed)
    c = http.client.HTTPConnection(host, port)
    mine = []
    while time.perf_counter() < stop:
        path = fmt.replace("{i:04d}", f"{rng.randrange(n):04d}") if rnd else fmt
        t0 = time.perf_counter()
        c.request("GET", path)
        r = c.getresponse(); r.read()
        mine.append(time.perf_counter() - t0)
        if r.status != 200: errors[0] += 1
    lat.extend(mine)
ts = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
t0 = time.perf_counter()
[t.start() for t in ts]; [t.join() for t in ts]
el = time.perf_counter() - t0
lat.sort()
print(json.dumps({"rps": len(lat) / el, "p50_ms": lat[len(lat)//2]*1000, "p99_ms": lat[int(len(lat)*0.99)]*1000, "requests": len(lat), "errors": errors[0]}))
"""


def run_python(url: str, path_fmt: str, random_path: bool, n: int, duration_s: float, connections: int) -> dict:
    host, port = url.split("//")[1].split(":")
    fmt = path_fmt.replace("%04d", "{i:04d}")  # the Python generator substitutes itself
    out = subprocess.run(
        [sys.executable, "-c", _PY_GEN, host, port, fmt, "1" if random_path else "0", str(n), str(duration_s),
         str(connections)],
        capture_output=True, text=True, timeout=duration_s + 60, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _merge(runs: list[dict]) -> dict:
    """Rounds of one phase: total requests over total time; the median round's p50 and p99."""
    n = sum(r["requests"] for r in runs)
    secs = sum(r["requests"] / r["rps"] for r in runs if r["rps"] > 0)

    def median(key: str) -> float:
        xs = sorted(r[key] for r in runs)
        return xs[len(xs) // 2]

    return {"rps": n / secs if secs else 0.0, "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
            "p99_ms_worst_round": max(r["p99_ms"] for r in runs), "requests": n,
            "errors": sum(r["errors"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployments", type=int, default=1000)
    ap.add_argument("--pods-per", type=int, default=5)
    ap.add_argument("--duration", type=float, default=12.0, help="seconds per measured phase, over all rounds")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds per phase")
    ap.add_argument("--connections", type=int, default=4,
                    help="concurrent keep-alive connections (an HPA controller uses a handful)")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    ap.add_argument("--generator", choices=["auto", "wrk", "python"], default="auto")
    ap.add_argument("--no-route-phase", dest="route_phase", action="store_false",
                    help="skip measuring the same call through FastAPI's router")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "metrics_api.json"),
                    help="also write the JSON here ('' to skip)")
    args = ap.parse_args()

    state = ApiState()
    t_build = time.perf_counter()
    obs, plan, cluster, models = large_tick(time.time(), args.deployments, args.pods_per)
    state.update(obs, plan, cluster, models)
    update_s = time.perf_counter() - t_build
    app = create_app(state)
    handle = serve_in_thread(app, "127.0.0.1", 0, log_level="error")
    gen = args.generator
    if gen == "auto":
        gen = "wrk" if shutil.which("wrk") else "python"
    try:
        # correctness first: the call returns the Deployment's 5 pods
        probe = httpx.get(handle.url + LIST_PATH.format(name="m0007-1g-10gb"), timeout=5).json()
        assert len(probe["items"]) == args.pods_per, probe
        list_fmt = LIST_PATH.format(name="m%04d-1g-10gb")

        def load(fmt: str, rnd: bool, dur: float) -> dict:
            if gen == "wrk":
                return run_wrk(handle.url, fmt, rnd, args.deployments, dur, args.connections, args.threads)
            return run_python(handle.url, fmt, rnd, args.deployments, dur, args.connections)

        snap = state.snapshot

        def uncached(fmt: str, dur: float) -> dict:
            # every request parses the selector, walks the index and encodes the
            # answer -- what an HPA gets right after a tick (the cache is per tick,
            # and 1,000 HPAs each asking once per 15 s mostly arrive after a new tick)
            snap.cache_enabled = False
            snap.cache.clear()
            return load(fmt, True, dur)

        def cached_(dur: float) -> dict:
            snap.cache_enabled = True
            return load(list_fmt, True, dur)

        phases: dict[str, tuple] = {
            "list": (lambda d: uncached(list_fmt, d)),
            # the same call forced through FastAPI's router (an unknown query parameter
            # makes the fast path step aside): what the fast path buys
            "route": (lambda d: uncached(list_fmt + "&via=route", d)),
            "cached": cached_,  # repeat queries within one tick
            "baseline": (lambda d: load("/healthz", False, d)),  # bare /healthz, same server and load
        }
        if not args.route_phase:
            del phases["route"]
        for run in phases.values():  # warm-up: sockets, allocators, the cache for "cached"
            run(1)
        # Interleaved rounds, so the other load on a shared machine hits every phase alike.
        per_round = max(1.0, args.duration / args.rounds)
        rounds: dict[str, list[dict]] = {k: [] for k in phases}
        for _ in range(args.rounds):
            for name, run in phases.items():
                rounds[name].append(run(per_round))
        lst, cached, base = (_merge(rounds[k]) for k in ("list", "cached", "baseline"))
        route = _merge(rounds["route"]) if "route" in rounds else None
    finally:
        handle.stop()
    result = {
        "rps": round(lst["rps"], 1),
        "p50_ms": round(lst["p50_ms"], 3),
        "p99_ms": round(lst["p99_ms"], 3),
        "p99_ms_worst_round": round(lst["p99_ms_worst_round"], 3),
        "baseline_rps": round(base["rps"], 1),
        "baseline_p99_ms": round(base["p99_ms"], 3),
        "baseline_p50_ms": round(base["p50_ms"], 3),
        "baseline_p99_ms_worst_round": round(base["p99_ms_worst_round"], 3),
        "rps_ratio_vs_baseline": round(lst["rps"] / base["rps"], 3),
        "fastapi_route_rps": round(route["rps"], 1) if route else None,
        "fastapi_route_p99_ms": round(route["p99_ms"], 3) if route else None,
        "cached_rps": round(cached["rps"], 1),
        "cached_p50_ms": round(cached["p50_ms"], 3),
        "cached_p99_ms": round(cached["p99_ms"], 3),
        "errors": lst["errors"] + cached["errors"] + base["errors"] + (route["errors"] if route else 0),
        "requests": lst["requests"],
        "baseline_requests": base["requests"],
        "deployments": args.deployments,
        "pods": args.deployments * args.pods_per,
        "snapshot_update_s": round(update_s, 3),
        "generator": gen,
        "connections": args.connections,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "http": HTTP_IMPL,
        "loop": LOOP,
        "cpus": os.cpu_count(),
        "targets": {"rps": ">= 2000", "p99_ms": "< 10"},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
