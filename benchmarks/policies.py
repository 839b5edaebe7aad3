"""Side-by-side policy benchmark: migscale vs HPA baselines vs static peak vs the oracle bound.

Every policy runs in the same simulator (``autoscaler/sim``) on the same
seeded 24 h mixed trace, 12 models with capacity tables shaped like the
MIGPerf measurements (docs/profile-throughput.md, ``sim/scenarios.py``), 16 A100-80GB GPUs.
Prints ONE JSON object::

    {"policies": {NAME: {slo_attainment, per_model, gpu_hours, slice_hours,
                         reconfigurations, recovery_s, ...}},
     "targets": {...each target, its value and whether it is met...},
     "reactive_bound": {...GPU-hours vs the oracle a windowed-max reactive rule needs...},
     "setup": {...}}

and writes ``benchmarks/results/policies.png`` (demand vs capacity, GPUs in
use, worst p99 / SLO) with the same JSON beside it (``policies.json``). ``--diagnose`` adds migscale runs with single config or
simulator changes so a miss can be attributed (``"diagnostics"``).

``reactive_bound`` is what the oracle is not: the fewest GPU-hours, as a
multiple of the oracle's, that a rule reacting to demand it saw ``lag_s`` ago
(capacity = (1 + h) x the max over the last ``window_s``, h per model chosen
with hindsight, perfect fractional packing, no queueing) needs to reach each
attainment target on this trace (``sim/baselines.py: reactive_frontier``).
A target a policy misses where this is far above the oracle is a cost of
reacting, not of packing. ``null``: not reachable by that rule.

Run: ``.venv/bin/python benchmarks/policies.py [--hours 24] [--seed 1] [--diagnose]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.config import initial_cluster_state, model_specs, parse_cluster, parse_models
from autoscaler.mig import get_product
from autoscaler.sim import baselines as bl
from autoscaler.sim import report, scenarios
from autoscaler.sim import traces as tr
from autoscaler.sim.cluster import SimConfig
from autoscaler.sim.run import POLICIES, Result, simulate

RESULTS = Path(__file__).resolve().parent / "results"
MEAN_SLICES = 3.0  # each model's mean demand, in slices of its most efficient profile
POLICY = {"tick_s": 15}  # everything else: the cluster.yaml defaults
# 5 s: a fast path (scrape every step, replica already warm); 45 s: the simulator's
# scrape_delay_s + start_delay_s (15 + 30); 60 s: that plus one 15 s control tick.
BOUND_LAGS_S = (5.0, 45.0, 60.0)
BOUND_WINDOW_S = 300.0
BOUND_TARGETS = (0.99, 0.995, 0.999)


def setup(n_models: int, n_gpus: int, hours: float, seed: int, policy: dict[str, Any]):
    fleet = scenarios.fleet(n_models)
    models = parse_models({"models": fleet})
    cluster = parse_cluster(scenarios.cluster(n_gpus, policy=policy))
    means = {m["name"]: MEAN_SLICES * scenarios.best_slice_rps(m) for m in fleet}
    trace = tr.generate("mixed", [m["name"] for m in fleet], hours * 3600, seed=seed, mean_rps=means)
    return models, cluster, trace


def reactive_bound(oracle: Result, models, cluster, step_s: float) -> dict[str, Any]:
    """The ``reactive_bound`` section, on the oracle's own demand grid and slice prices."""
    t0 = time.perf_counter()
    tl = oracle.timeline
    by_name = {s.name: s for s in model_specs(models, cluster)}
    specs = [by_name[n] for n in tl.models]  # the rows of the oracle's demand, in its order
    product = initial_cluster_state(cluster).gpus[0].product
    rates, floors = bl.slice_rates(specs, product)
    per_gpu = get_product(product).compute_slices
    rows = []
    for lag_s in BOUND_LAGS_S:
        hours = bl.reactive_frontier(tl.demand_rps, rates, step_s, per_gpu, lag_s, BOUND_WINDOW_S,
                                     BOUND_TARGETS, floor_slices=floors)
        rows.append({"lag_s": lag_s, "window_s": BOUND_WINDOW_S,
                     "gpu_hours_vs_oracle": {str(t): None if h is None else round(h / oracle.gpu_hours, 3)
                                             for t, h in hours.items()}})
    return {"rule": "capacity = max((1 + h_m) * max demand over [t - lag_s - window_s, t - lag_s], floor); "
                    "h_m per model with hindsight; fractional packing, no queueing, decides every step",
            "by_lag": rows, "s": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", type=int, default=12)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--step-s", type=float, default=5.0)
    ap.add_argument("--plot", default=str(RESULTS / "policies.png"))
    ap.add_argument("--diagnose", action="store_true", help="extra migscale runs that isolate causes")
    args = ap.parse_args(argv)

    models, cluster, trace = setup(args.models, args.gpus, args.hours, args.seed, POLICY)
    sim = SimConfig(step_s=args.step_s)
    results = {}
    for name in POLICIES:
        results[name] = simulate(models, cluster, trace, name, args.step_s, sim=sim)
    out: dict[str, Any] = {"policies": {n: r.to_json() for n, r in results.items()}}

    m, o, s = results["migscale"], results["oracle"], results["static-peak"]
    hq, hu = results["hpa-queue"], results["hpa-util"]
    out["targets"] = {
        "slo_attainment>=0.999": {"value": round(m.slo_attainment, 6), "met": m.slo_attainment >= 0.999},
        "gpu_hours<=1.15x_oracle": {"value": round(m.gpu_hours / o.gpu_hours, 3),
                                    "met": m.gpu_hours <= 1.15 * o.gpu_hours},
        "gpu_hours_saving_vs_static_peak>=0.40": {"value": round(1 - m.gpu_hours / s.gpu_hours, 3),
                                                  "met": m.gpu_hours <= 0.60 * s.gpu_hours},
        "beats_hpa_queue_on_slo_and_gpu_hours": {
            "value": [round(m.slo_attainment - hq.slo_attainment, 6), round(hq.gpu_hours - m.gpu_hours, 2)],
            "met": m.slo_attainment > hq.slo_attainment and m.gpu_hours < hq.gpu_hours},
        "beats_hpa_util_on_slo_and_gpu_hours": {
            "value": [round(m.slo_attainment - hu.slo_attainment, 6), round(hu.gpu_hours - m.gpu_hours, 2)],
            "met": m.slo_attainment > hu.slo_attainment and m.gpu_hours < hu.gpu_hours},
        "simulate_24h_wall_s<60": {"value": round(m.wall_s * 24 / args.hours, 2),
                                   "met": m.wall_s * 24 / args.hours < 60},
    }
    out["reactive_bound"] = reactive_bound(o, models, cluster, args.step_s)
    out["setup"] = {
        "hours": args.hours, "seed": args.seed, "models": args.models, "gpus": args.gpus,
        "product": "A100-SXM4-80GB", "trace": "mixed (diurnal, bursty, flash, azure in turn)",
        "mean_slices_per_model": MEAN_SLICES, "requests": round(trace.total_requests()),
        "policy": POLICY, "sim": sim.__dict__,
    }
    if args.diagnose:
        diag = {}
        variants = {
            "churn_budget=1000": ({"churn_budget": 1000}, {}, {}),
            "repartition_delay_s=10": ({}, {"repartition_delay_s": 10.0}, {}),
            "correction_off": ({}, {}, "nocorr"),
            "all_three": ({"churn_budget": 1000}, {"repartition_delay_s": 10.0}, "nocorr"),
            # the loop's old behaviour: every model waits while anything converges
            "global_gate": ({}, {"in_flight_hook": False}, {}),
            # oversized replicas are never swapped for smaller profiles
            "rightsize_off": ({"rightsize_window_s": 0}, {}, {}),
        }
        from autoscaler.policy.demand import CorrectionConfig

        for label, (pol, simkw, over) in variants.items():
            mm, cc, _ = setup(args.models, args.gpus, args.hours, args.seed, {**POLICY, **pol})
            overrides = {"correction": CorrectionConfig(lo=1.0, hi=1.0)} if over == "nocorr" else None
            r = simulate(mm, cc, trace, "migscale", args.step_s, sim=SimConfig(step_s=args.step_s, **simkw),
                         policy_overrides=overrides)
            j = r.to_json()
            j.pop("per_model")
            j["gpu_hours_vs_oracle"] = round(r.gpu_hours / o.gpu_hours, 3)
            diag[label] = j
        out["diagnostics"] = diag
    if args.plot:
        t0 = time.perf_counter()
        report.plot([results[n] for n in ("migscale", "hpa-queue", "hpa-util", "static-peak", "oracle")],
                    args.plot, title=f"{args.models} models, {args.gpus} x A100-80GB, {args.hours:g} h mixed trace")
        out["plot"] = {"path": str(args.plot), "s": round(time.perf_counter() - t0, 2)}
    text = json.dumps(out)
    if args.plot:
        Path(args.plot).with_suffix(".json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
