"""Planner benchmark: optimality gap against the exact MILP, and speed at scale.

Prints ONE JSON object:
- ``gap_mean`` / ``gap_max``: the heuristic's relative excess in GPUs used
  over the MILP optimum, ``(heuristic - optimal) / optimal``, on random small
  instances (<= 8 GPUs, <= 6 models) where the MILP finds a solution
  (targets: mean <= 0.02, max <= 0.10);
- ``plan_s_p50_1k`` / ``plan_s_p99_1k``: seconds per ``plan()`` call, 1,000
  GPUs x 200 models (target p99 < 1 s);
- ``plan_s_p99_10k``: 10,000 GPUs x 1,000 models (target < 10 s);
- ``plan_s_p50_8k_precut`` / ``plan_s_p99_8k_precut``: 8,000 GPUs already cut (the fleet of
  ``k8s_scale.py``: most idle, every one cut) x 200 models, 1-3 models' demand moved;
- ``peak_mb_1k`` / ``peak_mb_10k``: peak Python heap allocated by one call
  (tracemalloc; the cluster it reads is not counted), ``rss_max_mb`` the
  whole process;
- ``gpus_vs_whole_gpu_baseline_mean``: GPUs the planner uses over GPUs with
  one whole GPU per replica (MIG off), on the same small instances;
- ``plan_s_cold_*``: the first call on an empty cluster (cold caches).

Each timed call is a re-plan: the cluster already runs the plan for one
demand vector and the demand then moves by up to +-20% per model, which is
what a control tick sees. ``--quick`` runs fewer instances (a smoke check).

Run: ``.venv/bin/python benchmarks/planner.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.mig.layout import Placement
from autoscaler.mig.products import get_product
from autoscaler.policy.milp import solve
from autoscaler.policy.planner import apply_plan_to_cluster, plan
from autoscaler.policy.types import ClusterState, GpuState, ModelSpec

PRODUCTS = ("A100-SXM4-80GB", "H100-SXM5-80GB", "A100-SXM4-40GB", "H200-141GB")


def random_model(rng: random.Random, name: str, product: str) -> ModelSpec:
    """A model whose capacity table follows the shapes in docs/profile-throughput.md.

    light: batch-1 bound, small slices win (1g..7g gain only 1.2-2.5x);
    medium: throughput roughly linear in slices; heavy: needs >= 3g memory.
    Some small profiles are dropped (their latency breaks the SLO).
    """
    prod = get_product(product)
    std = prod.standard_profiles()
    kind = rng.choice(("light", "light", "medium", "heavy"))
    base = rng.uniform(20, 200)
    caps: dict[str, float] = {}
    for p in std:
        c = p.compute
        if kind == "light":
            gain = 1 + (rng.uniform(0.15, 0.35) * (c - 1) ** 0.7)
        elif kind == "medium":
            gain = c ** rng.uniform(0.8, 1.0)
        else:
            gain = c ** rng.uniform(0.9, 1.05)
        caps[p.name] = round(base * gain, 1)
    allowed = [p.name for p in std]
    memory = None
    if kind == "heavy":
        memory = rng.choice((0.3, 0.45)) * prod.memory_gb
    elif rng.random() < 0.3:
        allowed = allowed[1:]  # 1g too slow for the SLO
    return ModelSpec(
        name=name,
        capacity=caps,
        allowed_profiles=tuple(allowed),
        min_replicas=rng.choice((0, 1, 1, 2)),
        max_replicas=rng.choice((4, 8, 16)),
        high_availability=rng.random() < 0.2,
        priority=0,
        memory_gb=memory,
    )


def random_instance(rng: random.Random, max_gpus: int = 8, max_models: int = 6
                    ) -> tuple[list[ModelSpec], dict[str, float], list[str]]:
    n_gpus = rng.randint(1, max_gpus)
    product = rng.choice(PRODUCTS)
    products = [product] * n_gpus
    if rng.random() < 0.15 and n_gpus > 1:  # a mixed fleet now and then
        other = rng.choice([p for p in PRODUCTS[:2] if p != product] or [product])
        cut = rng.randint(1, n_gpus - 1)
        products = [product] * cut + [other] * (n_gpus - cut)
    models = [random_model(rng, f"m{i}", product) for i in range(rng.randint(1, max_models))]
    # Demand: share out a random fraction of the fleet's slices.
    total_slices = 7 * n_gpus * rng.uniform(0.2, 0.95)
    weights = [rng.random() + 0.05 for _ in models]
    demand = {}
    for m, w in zip(models, weights):
        slices = total_slices * w / sum(weights)
        usable = [p for p in m.allowed_profiles if m.capacity.get(p)]
        p = rng.choice(usable)
        prof = get_product(product).profiles[p]
        demand[m.name] = round(max(0.0, slices * m.capacity[p] / prof.compute * rng.uniform(0.6, 1.0)), 1)
    return models, demand, products


def fresh_cluster(products: list[str]) -> ClusterState:
    return ClusterState(gpus=tuple(GpuState(f"node-{i // 8}/{i % 8}", f"node-{i // 8}", p) for i, p in enumerate(products)))


def whole_gpu_baseline(models: list[ModelSpec], demand: dict[str, float], product: str) -> int:
    """GPUs when every replica gets a whole GPU (MIG off): the usual deployment MIG improves on."""
    prod = get_product(product)
    total = 0
    for m in models:
        usable = [p for p in m.allowed_profiles if m.capacity.get(p)
                  and (m.memory_gb is None or prod.profiles[p].memory_gb >= m.memory_gb)]
        best = max(m.capacity[p] for p in usable)
        need = math.ceil(demand[m.name] / best - 1e-9) if demand[m.name] > 0 else 0
        total += min(m.max_replicas, max(need, m.min_replicas, 2 if m.high_availability else 0))
    return total


def gaps(n: int, seed: int = 1) -> tuple[list[float], list[float], int]:
    rng = random.Random(seed)
    out: list[float] = []
    saved: list[float] = []
    infeasible = 0
    while len(out) < n:
        models, demand, products = random_instance(rng)
        ref = solve(models, demand, products, time_limit_s=20)
        if not ref.feasible or not ref.gpus_used:
            infeasible += 1
            continue
        p = plan(models, demand, fresh_cluster(products))
        used = p.cost.gpus_used
        if p.shortfall:
            used = len(products) + 1  # missed demand the MILP met: count as one GPU too many
        out.append((used - ref.gpus_used) / ref.gpus_used)
        saved.append(used / whole_gpu_baseline(models, demand, products[0]))
    return out, saved, infeasible


def scale_case(n_gpus: int, n_models: int, seed: int) -> tuple[list[ModelSpec], dict[str, float], ClusterState]:
    rng = random.Random(seed)
    products = ["A100-SXM4-80GB"] * (n_gpus // 2) + ["H100-SXM5-80GB"] * (n_gpus - n_gpus // 2)
    models = [random_model(rng, f"m{i}", "A100-SXM4-80GB") for i in range(n_models)]
    per_model_slices = 7 * n_gpus * 0.7 / n_models
    demand = {}
    a100 = get_product("A100-SXM4-80GB")
    for m in models:
        best = max(m.capacity[p] / a100.profiles[p].compute for p in m.allowed_profiles
                   if m.memory_gb is None or a100.profiles[p].memory_gb >= m.memory_gb)
        demand[m.name] = per_model_slices * best * rng.uniform(0.5, 0.9)
    cluster = fresh_cluster(products)
    first = plan(models, demand, cluster)
    return models, demand, apply_plan_to_cluster(cluster, first)


def time_plans(n_gpus: int, n_models: int, runs: int) -> tuple[list[float], float, float]:
    t0 = time.perf_counter()
    models, demand, cluster = scale_case(n_gpus, n_models, seed=n_gpus)
    cold = time.perf_counter() - t0  # first call: empty cluster, cold caches
    rng = random.Random(7)
    times: list[float] = []
    peak = 0.0
    for i in range(runs):
        moved = {k: v * rng.uniform(0.8, 1.2) for k, v in demand.items()}
        t0 = time.perf_counter()
        plan(models, moved, cluster)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    plan(models, {k: v * 1.1 for k, v in demand.items()}, cluster)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return times, peak, cold


def precut_case(seed: int = 3) -> tuple[list[ModelSpec], dict[str, float], ClusterState]:
    """1,000 nodes of 8 A100s cut as a GPU operator's default config might leave them (per node:
    4 GPUs 7x1g, 2 GPUs 3x2g+1g, 2 GPUs 2x3g), 200 models placed: the fleet of
    ``benchmarks/k8s_scale.py``, where most GPUs are idle but already cut."""
    rng = random.Random(seed)
    models = [random_model(rng, f"m{i}", "A100-SXM4-80GB") for i in range(200)]
    a100 = get_product("A100-SXM4-80GB")
    demand = {}
    for m in models:
        best = max(m.capacity[p] for p in m.allowed_profiles
                   if m.memory_gb is None or a100.profiles[p].memory_gb >= m.memory_gb)
        demand[m.name] = best * rng.uniform(1, 5)
    cuts = (tuple(Placement(i, "1g.10gb") for i in range(7)),
            (Placement(0, "2g.20gb"), Placement(2, "2g.20gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb")),
            (Placement(0, "3g.40gb"), Placement(4, "3g.40gb")))
    gpus = tuple(GpuState(f"node-{i // 8:04d}/{i % 8}", f"node-{i // 8:04d}", "A100-SXM4-80GB",
                          cuts[0] if i % 8 < 4 else cuts[1] if i % 8 < 6 else cuts[2]) for i in range(8000))
    cluster = ClusterState(gpus=gpus)
    return models, demand, apply_plan_to_cluster(cluster, plan(models, demand, cluster))


def time_precut(runs: int) -> list[float]:
    """Re-plans of the pre-cut 8,000-GPU fleet after 1-3 models' demand moved (a tick where the
    HPA stages changed a count): the call a Kubernetes tick at that size makes."""
    models, demand, cluster = precut_case()
    rng = random.Random(11)
    times = []
    for i in range(runs):
        moved = dict(demand)
        for k in rng.sample(sorted(demand), 1 + i % 3):
            moved[k] *= rng.uniform(0.5, 1.8)
        t0 = time.perf_counter()
        plan(models, moved, cluster)
        times.append(time.perf_counter() - t0)
    return times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances and runs (smoke check)")
    ap.add_argument("--out", help="also write the JSON object to this file")
    args = ap.parse_args()
    n_gap, runs_1k, runs_10k = (40, 3, 1) if args.quick else (200, 7, 5)
    g, ratio, infeasible = gaps(n_gap)
    t1k, peak1k, cold1k = time_plans(1000, 200, runs_1k)
    t10k, peak10k, cold10k = time_plans(10000, 1000, runs_10k)
    t8k = time_precut(runs_1k * 2)
    result = json.dumps({
        "gap_mean": round(statistics.fmean(g), 4),
        "gap_max": round(max(g), 4),
        "gap_instances": len(g),
        "gap_optimal_fraction": round(sum(1 for x in g if x <= 0) / len(g), 4),
        "milp_infeasible_skipped": infeasible,
        "gpus_vs_whole_gpu_baseline_mean": round(statistics.fmean(ratio), 4),
        "plan_s_p50_1k": round(statistics.median(t1k), 4),
        "plan_s_p99_1k": round(pct(t1k, 0.99), 4),
        "plan_runs_1k": len(t1k),
        "plan_s_cold_1k": round(cold1k, 4),
        "plan_s_p50_10k": round(statistics.median(t10k), 4),
        "plan_s_p99_10k": round(pct(t10k, 0.99), 4),
        "plan_runs_10k": len(t10k),
        "plan_s_cold_10k": round(cold10k, 4),
        "plan_s_p50_8k_precut": round(statistics.median(t8k), 4),
        "plan_s_p99_8k_precut": round(pct(t8k, 0.99), 4),
        "plan_runs_8k_precut": len(t8k),
        "peak_mb_1k": round(peak1k, 1),
        "peak_mb_10k": round(peak10k, 1),
        "rss_max_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    })
    print(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(result + "\n")


if __name__ == "__main__":
    main()
