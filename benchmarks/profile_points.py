"""How many requests ``migscale profile`` should measure at each Poisson rate.

``migscale profile --arrivals poisson`` bisects for the highest offered rate whose p99
meets the SLO (``runtime.profile_sweep.rate_search``), measuring ``--open-requests``
requests at each rate it tries. A p99 over a few hundred requests rests on its few slowest
ones, and a bisection keeps whichever rate read fast: so the length of a point may move
the capacity the search reports, and with it what the planner promises.

One real replica of the emulated ``resnet`` on a 1g.10gb slice of an A100-80GB, SLO p99
150 ms. A closed-loop sweep first gives the search's upper bound (the closed-loop capacity
at the SLO). It is held fixed for every search, so every bisection walks the same grid of
rates and only the points' noise differs. Then ``rate_search`` runs ``--repeats`` times
at each of ``--lengths`` (requests per rate), the lengths taken in turn so that any drift
of the machine falls on all of them alike. Last, a reference point of
``--reference-requests`` at every rate a search reported: its p99 says whether that
capacity meets the SLO when measured long.

Prints ONE JSON object: per length, the capacities the searches reported, their mean and
spread, the seconds one search took, and how many of those capacities the reference puts
over the SLO; and the reference points.

Run: ``.venv/bin/python benchmarks/profile_points.py [--lengths 500,2000 --repeats 3]``
(about 20 minutes on 2 cores; everything on 127.0.0.1; the replica is stopped at the end).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "triton_models"
PRODUCT, PROFILE, MODEL = "A100-SXM4-80GB", "1g.10gb", "resnet"
SLO_MS = 150.0


def _point(p: Any) -> dict[str, Any]:
    return {"offered_rps": round(p.offered_rps, 2), "requests": p.requests, "errors": p.errors,
            "p50_ms": None if p.p50_ms is None else round(p.p50_ms, 1),
            "p99_ms": None if p.p99_ms is None else round(p.p99_ms, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="500,2000", help="requests per rate, comma list")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--refine", type=int, default=4, help="bisection steps (migscale profile's default)")
    ap.add_argument("--reference-requests", type=int, default=4000)
    ap.add_argument("--profile", default=PROFILE, help="MIG profile of the replica (A100-80GB)")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]

    from autoscaler.act.local.emulation import emulation_env
    from autoscaler.act.local.triton import TritonProcess
    from autoscaler.mig import get_product
    from autoscaler.runtime.profile import TritonMeasurer
    from autoscaler.runtime.profile_sweep import (
        PointRule,
        capacity_at_slo,
        concurrency_levels,
        open_capacity_at_slo,
        rate_search,
        sweep,
    )

    start = get_product(PRODUCT).profile(args.profile).starts[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="migscale-points-") as tmp:
        proc = TritonProcess(REPO, [MODEL], Path(tmp) / "replica",
                             env=emulation_env(PRODUCT, args.profile, "node-a/0", start, MODEL))
        try:
            proc.start()
            proc.wait_ready(120)

            def measurer(n: int) -> TritonMeasurer:
                return TritonMeasurer(proc.url_http, proc.url_metrics, MODEL, PointRule(open_requests=n))

            closed, _stop = sweep(measurer(1000).measure, SLO_MS, concurrency_levels(16))
            upper = capacity_at_slo(closed, SLO_MS)
            if not upper:
                print(json.dumps({"error": "no closed-loop point within the SLO"}))
                return 1
            searches: dict[int, list[dict[str, Any]]] = {n: [] for n in lengths}
            for _ in range(args.repeats):
                for n in lengths:
                    ts = time.perf_counter()
                    pts = rate_search(measurer(n).measure_rate, SLO_MS, upper, args.refine)
                    searches[n].append({"capacity_rps": open_capacity_at_slo(pts, SLO_MS),
                                        "s": round(time.perf_counter() - ts, 1),
                                        "points": [_point(p) for p in pts]})
                    print(f"{n} requests a rate: capacity {searches[n][-1]['capacity_rps']}", file=sys.stderr)
            rates = sorted({s["capacity_rps"] for ss in searches.values() for s in ss if s["capacity_rps"]})
            ref = {}
            for r in rates:
                p = measurer(args.reference_requests).measure_rate(r)
                ref[r] = _point(p)
                print(f"reference {r:.2f} req/s: p99 {ref[r]['p99_ms']} ms", file=sys.stderr)
        finally:
            proc.stop()

    def over(cap: float | None) -> bool:
        got = ref.get(cap) if cap else None
        return bool(got and (got["errors"] or got["p99_ms"] is None or got["p99_ms"] > SLO_MS))

    out: dict[str, Any] = {
        "setup": {"model": MODEL, "profile": args.profile, "product": PRODUCT, "slo_p99_ms": SLO_MS,
                  "upper_rps": round(upper, 2), "refine": args.refine, "repeats": args.repeats,
                  "reference_requests": args.reference_requests},
        "closed_loop": [{"concurrency": p.concurrency, "throughput_rps": round(p.throughput_rps, 1),
                         "p99_ms": None if p.p99_ms is None else round(p.p99_ms, 1)} for p in closed],
        "by_length": {},
        "reference": [ref[r] for r in rates],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    for n, ss in searches.items():
        caps = [s["capacity_rps"] for s in ss if s["capacity_rps"] is not None]
        out["by_length"][str(n)] = {
            "capacities_rps": [None if s["capacity_rps"] is None else round(s["capacity_rps"], 2) for s in ss],
            "mean_rps": round(statistics.mean(caps), 2) if caps else None,
            "spread_rps": round(max(caps) - min(caps), 2) if caps else None,
            "over_slo_by_reference": sum(over(s["capacity_rps"]) for s in ss),
            "search_s": [s["s"] for s in ss],
            "searches": ss,
        }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
