"""Exact reference for the planner: a MILP solved by HiGHS (``scipy.optimize.milp``).

Not on the control path: tests and ``benchmarks/planner.py`` use it to
measure the heuristic's optimality gap on small instances (<= 8 GPUs, <= 6
models). Written independently of the heuristic -- it shares only the MIG
geometry (``maximal_layouts``) and the input types.

Model (fresh cluster, MIG models only):
- ``z[g,l]`` binary: GPU g is cut with maximal layout l (at most one per GPU;
  a sub-layout is a maximal layout with some instances left empty);
- ``n[g,p,m]`` integer: replicas of model m on profile-p instances of GPU g,
  at most the number of p instances in the chosen layout;
- capacity: sum over g,p of cap[m,p] * n[g,p,m] >= demand[m];
  min/max replicas; high availability: ``y[g,m] <= sum_p n[g,p,m]``,
  ``sum_g y[g,m] >= 2``;
- objective: GPUs used (weight 7*G+1, so one GPU outweighs every slice), then
  compute slices used. Identical GPUs are ordered (``u[g] >= u[g+1]``) to cut
  the symmetric search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from autoscaler.mig.layout import maximal_layouts
from autoscaler.mig.products import STANDARD_KINDS, get_product
from autoscaler.policy.types import ModelSpec


@dataclass(frozen=True)
class MilpResult:
    feasible: bool
    gpus_used: int | None = None
    slices_used: int | None = None
    # (gpu index, profile, model) -> replicas
    counts: Mapping[tuple[int, str, str], int] = field(default_factory=dict)
    status: str = ""


def _usable(spec: ModelSpec, product_profiles: Mapping) -> dict[str, float]:
    out = {}
    for name in spec.allowed_profiles:
        prof = product_profiles.get(name)
        cap = float(spec.capacity.get(name, 0.0) or 0.0)
        if prof is None or not cap > 0:
            continue
        if spec.memory_gb is not None and prof.fit_gib < spec.memory_gb - 1e-9:
            continue
        out[name] = cap
    return out


def solve(models: Sequence[ModelSpec], demand_rps: Mapping[str, float], products: Sequence[str],
          *, time_limit_s: float = 30.0) -> MilpResult:
    """Fewest GPUs (then slices) that meet every model's demand on empty GPUs of ``products``."""
    mig = [m for m in models if m.backend != "multinode"]
    if len(mig) != len(models):
        raise ValueError("the MILP reference covers MIG models only")
    prods = [get_product(p) for p in products]
    G = len(prods)
    kinds_needed: set[str] = set(STANDARD_KINDS)
    for pr in prods:
        for m in mig:
            for name in _usable(m, pr.profiles):
                kinds_needed.add(pr.profiles[name].kind)
    order = tuple(k for k in ("1g", "1g+me", "1g.dbl", "2g", "3g", "4g", "7g") if k in kinds_needed)

    var: list[tuple] = []  # descriptors
    def new(desc: tuple) -> int:
        var.append(desc)
        return len(var) - 1

    z: dict[tuple[int, int], int] = {}
    layouts: list[tuple] = []
    n: dict[tuple[int, str, str], int] = {}
    y: dict[tuple[int, str], int] = {}
    for g, pr in enumerate(prods):
        ls = maximal_layouts(pr, order)
        layouts.append(ls)
        for li in range(len(ls)):
            z[(g, li)] = new(("z", g, li))
        for m in mig:
            for p in _usable(m, pr.profiles):
                n[(g, p, m.name)] = new(("n", g, p, m.name))
            if m.high_availability:
                y[(g, m.name)] = new(("y", g, m.name))
    nv = len(var)
    rows: list[tuple[dict[int, float], float, float]] = []
    for g, pr in enumerate(prods):
        rows.append(({z[(g, li)]: 1.0 for li in range(len(layouts[g]))}, -np.inf, 1.0))
        profs = {p for (gg, p, _m) in n if gg == g}
        for p in profs:
            coef: dict[int, float] = {idx: 1.0 for (gg, pp, _m), idx in n.items() if gg == g and pp == p}
            for li, lay in enumerate(layouts[g]):
                cnt = sum(1 for pl in lay if pl.profile == p)
                if cnt:
                    coef[z[(g, li)]] = -float(cnt)
            rows.append((coef, -np.inf, 0.0))
        if g + 1 < G and prods[g + 1] is pr:
            coef = {z[(g, li)]: 1.0 for li in range(len(layouts[g]))}
            for li in range(len(layouts[g + 1])):
                coef[z[(g + 1, li)]] = coef.get(z[(g + 1, li)], 0.0) - 1.0
            rows.append((coef, 0.0, np.inf))
    for m in mig:
        mine = {k: idx for k, idx in n.items() if k[2] == m.name}
        d = max(0.0, float(demand_rps.get(m.name, 0.0) or 0.0))
        floor = max(m.min_replicas, 2 if m.high_availability else 0)
        if d > 1e-9:
            # Any demand needs a replica. Said in whole replicas, this holds for a demand
            # below the solver's feasibility tolerance (~1e-7), which the capacity row alone
            # would let pass with none.
            floor = max(floor, 1)
        floor = min(floor, m.max_replicas)
        if d > 1e-9:
            caps = {k: _usable(m, prods[k[0]].profiles)[k[1]] for k in mine}
            if not caps:
                return MilpResult(False, status=f"{m.name}: no usable profile")
            rows.append(({idx: caps[k] for k, idx in mine.items()}, d - 1e-9, np.inf))
        if floor > 0 or m.max_replicas < 10**6:
            if not mine and floor > 0:
                return MilpResult(False, status=f"{m.name}: no usable profile")
            if mine:
                rows.append(({idx: 1.0 for idx in mine.values()}, float(floor), float(m.max_replicas)))
        if m.high_availability:
            for g in range(G):
                coef = {y[(g, m.name)]: 1.0}
                for (gg, _p, _mm), idx in mine.items():
                    if gg == g:
                        coef[idx] = -1.0
                rows.append((coef, -np.inf, 0.0))
            rows.append(({y[(g, m.name)]: 1.0 for g in range(G)}, 2.0, np.inf))
    A = lil_matrix((len(rows), nv))
    lb = np.empty(len(rows))
    ub = np.empty(len(rows))
    for i, (coef, lo, hi) in enumerate(rows):
        for j, v in coef.items():
            A[i, j] = v
        lb[i], ub[i] = lo, hi
    W = 7.0 * G + 1.0
    c = np.zeros(nv)
    upper = np.ones(nv)
    for (g, li), idx in z.items():
        c[idx] = W
    for (g, p, _m), idx in n.items():
        c[idx] = prods[g].profiles[p].compute
        upper[idx] = prods[g].compute_slices
    res = milp(
        c,
        constraints=[LinearConstraint(A.tocsr(), lb, ub)] if rows else [],
        integrality=np.ones(nv),
        bounds=Bounds(np.zeros(nv), upper),
        options={"time_limit": time_limit_s, "disp": False},
    )
    if res.x is None:
        return MilpResult(False, status=str(res.message))
    x = np.round(res.x).astype(int)
    counts = {k: int(x[idx]) for k, idx in n.items() if x[idx]}
    slices = sum(prods[g].profiles[p].compute * v for (g, p, _m), v in counts.items())
    hosting = len({g for (g, _p, _m) in counts})  # a GPU counts when it hosts a replica
    return MilpResult(True, hosting, slices, counts, status=str(res.message))


def optimal_gpus(models: Sequence[ModelSpec], demand_rps: Mapping[str, float], products: Sequence[str],
                 *, time_limit_s: float = 30.0) -> int | None:
    """The optimal GPU count, or None when no assignment meets the demand."""
    r = solve(models, demand_rps, products, time_limit_s=time_limit_s)
    return r.gpus_used if r.feasible else None
