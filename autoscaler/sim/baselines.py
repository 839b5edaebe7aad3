"""Baseline policies the simulator runs beside migscale (pure: no I/O, time as ``now_s``).

Place in the loop: a baseline replaces ``decide`` -- it reads the same
``Observation`` and returns actions for the same actuator -- so the benchmark
compares policies, not simulators. The HPA arithmetic is the production
``policy/hpa.py`` stages, not a copy.

- ``static-peak``: whole GPUs (7g, no MIG sharing), as many per model as its
  trace peak needs at the full-GPU capacity; fixed for the whole run.
- ``hpa-queue``: a static MIG layout; one Deployment per model requesting one
  profile; the Kubernetes HPA on ``triton:queue_compute:ratio`` with target 1
  (NVIDIA's reference setup); new pods land on a free instance of their
  profile, bin-packed (the scheduler's MostAllocated scoring), or stay Pending.
- ``hpa-util``: the same, with HPA on per-pod slice utilisation at 70%
  (a Pods metric, so the missing-pod rules apply).
- ``oracle``: a lower bound computed from the trace alone: perfect foresight,
  perfect packing (fractional slices of each model's most efficient profile,
  continuous), zero delays. It bounds every policy that serves the demand at
  its SLO capacity; a policy that under-provisions can of course use less.
  Held to the fleet's GPUs (``oracle_capped``) it misses where the fleet is
  truly too small, and its attainment is then the ceiling for every policy.
- ``reactive_frontier``: not a policy but a second bound, priced like the
  oracle: the GPU-hours a rule that only reacts (capacity = (1 + h) x the
  demand max it saw over a window, ``lag_s`` late) needs per attainment
  target. The benchmark prints it beside the oracle, so that a policy's gap to
  the oracle can be split into the cost of reacting and the cost of packing.

Size: ~500 lines, over the house limit of ~450: the baselines and both bounds
are priced by one set of helpers (capacity per slice, fractional packing), and
the benchmarks import them from this one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from autoscaler.mig import Placement, get_product
from autoscaler.policy import hpa
from autoscaler.policy.types import (
    LIVE,
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Observation,
    Reason,
    ReplicaState,
)


def best_profile(spec: ModelSpec, product: str) -> str:
    """The profile with the most req/s per compute slice (ties: the smaller slice)."""
    prod = get_product(product)
    opts = [(c / prod.profiles[p].compute, -prod.profiles[p].compute, p)
            for p, c in spec.capacity.items() if p in prod.profiles and c > 0 and p in spec.allowed_profiles]
    if not opts:
        raise ValueError(f"model {spec.name}: no usable profile with capacity on {product}")
    return max(opts)[2]


# ------------------------------------------------------------------ oracle


def slice_rates(specs: Sequence[ModelSpec], product: str) -> tuple[np.ndarray, np.ndarray]:
    """Per model, the oracle's two numbers: req/s per compute slice of its most efficient
    profile, and its floor in compute slices (min_replicas x the smallest usable slice).

    One place for them, so the oracle and the reactive bound price a slice the same way."""
    prod = get_product(product)
    eff = np.empty(len(specs))
    floor = np.empty(len(specs))
    for i, s in enumerate(specs):
        usable = [(p, c) for p, c in s.capacity.items() if p in prod.profiles and c > 0]
        if not usable:
            raise ValueError(f"model {s.name}: no usable profile with capacity on {product}")
        eff[i] = max(c / prod.profiles[p].compute for p, c in usable)
        floor[i] = s.min_replicas * min(prod.profiles[p].compute for p, _ in usable)
    return eff, floor


def oracle_slices(
    specs: Sequence[ModelSpec], demand_rps: np.ndarray, product: str
) -> np.ndarray:
    """Compute slices the cluster needs per step: sum over models of max(demand / best efficiency,
    min_replicas x the smallest usable slice). ``demand_rps[m, k]``; returns shape (k,)."""
    eff, floor = slice_rates(specs, product)
    total = np.zeros(demand_rps.shape[1])
    for i in range(len(specs)):
        total += np.maximum(demand_rps[i] / eff[i], floor[i])
    return total


def oracle_hours(
    specs: Sequence[ModelSpec], demand_rps: np.ndarray, step_s: float, product: str
) -> tuple[float, float]:
    """(GPU-hours, slice-hours) of the oracle bound: slices packed perfectly, 7 per GPU."""
    slices = oracle_slices(specs, demand_rps, product)
    per_gpu = get_product(product).compute_slices
    return float(slices.sum() * step_s / per_gpu / 3600.0), float(slices.sum() * step_s / 3600.0)


def oracle_capped(
    specs: Sequence[ModelSpec], demand_rps: np.ndarray, product: str, max_slices: float
) -> tuple[np.ndarray, np.ndarray]:
    """The oracle held to the fleet: ``(slices per step, req/s served per model and step)``.

    Where the uncapped oracle needs more than ``max_slices`` compute slices (16
    GPUs x 7 = 112), it serves as many requests as the fleet can: every
    model's floor first (its min_replicas, as any policy must keep them), then
    the rest of the fleet to the models that serve the most req/s per slice.
    That order maximises requests served per step, so its attainment is an
    upper bound on any policy's with these GPUs (fractional slices, no
    delays) -- a fleet that is truly too small shows as the oracle missing
    too. Below the cap it is exactly ``oracle_slices``.
    """
    eff, floor = slice_rates(specs, product)
    d = np.asarray(demand_rps, dtype=float)
    need = np.maximum(d / eff[:, None], floor[:, None])  # (models, steps)
    total = need.sum(axis=0)
    served = d.copy()
    over = total > max_slices + 1e-9
    if not over.any():
        return total, served
    fl = np.minimum(need[:, over], floor[:, None])
    # floors first (scaled down if even they do not fit), then by efficiency
    fscale = np.minimum(1.0, max_slices / np.maximum(fl.sum(axis=0), 1e-12))
    alloc = fl * fscale
    left = max_slices - alloc.sum(axis=0)
    extra = need[:, over] - fl
    for i in np.argsort(-eff, kind="stable"):
        give = np.minimum(extra[i], np.maximum(left, 0.0))
        alloc[i] += give
        left = left - give
    served[:, over] = np.minimum(d[:, over], alloc * eff[:, None])
    slices = total.copy()
    slices[over] = alloc.sum(axis=0)
    return slices, served


# ------------------------------------------------------------------ reactive bound

# h from -0.5 to 10 in steps of 0.001, built from integers so that h = 0 is on the grid exactly.
# Negative h (provision below what was seen) is allowed: it can only lower the bound.
DEFAULT_HEADROOM_GRID = np.arange(-500, 10_001) / 1000.0


def reactive_frontier(
    demand_rps: np.ndarray,
    per_slice_rps: np.ndarray,
    step_s: float,
    slices_per_gpu: int,
    lag_s: float,
    window_s: float,
    targets: Sequence[float],
    *,
    floor_slices: np.ndarray | None = None,
    headroom_grid: np.ndarray | Sequence[float] = DEFAULT_HEADROOM_GRID,
) -> dict[float, float | None]:
    """Fewest GPU-hours a windowed-max reactive rule needs to reach each SLO attainment target.

    The rule, per model ``m`` and step ``k`` (``L = floor(lag_s / step_s)``,
    ``w = max(1, round(window_s / step_s))`` steps)::

        capacity[m, k] = max((1 + h_m) * max(demand[m, k-L-w+1 .. k-L]), floor_slices[m] * per_slice_rps[m])

    Before the trace starts, demand is held at its first value (as the
    simulator's warm-up does). A step misses ``max(demand - capacity, 0)``
    req/s; attainment is ``1 - missed / total``; GPU-hours are
    ``sum(capacity / per_slice_rps) * step_s / 3600 / slices_per_gpu``. For each
    target this returns the minimum GPU-hours over per-model headrooms ``h_m``
    in ``headroom_grid`` (and the chords between grid points, see below), or
    ``None`` when no choice in the grid reaches the target. With ``lag_s = 0``,
    a one-step window and ``h = 0`` the rule is the oracle.

    The bound is generous to the rule on purpose, so that a policy that cannot
    beat it has a reason, not an excuse:

    - fractional perfect packing: capacity costs exactly ``capacity /
      per_slice_rps`` compute slices at every instant, ``slices_per_gpu`` to a
      GPU, with no whole replicas, no MIG geometry, no repartitions;
    - zero tick: the rule re-decides every step, not every control tick;
    - instant start after the lag: capacity decided on data up to step ``k - L``
      serves at step ``k``; ``lag_s`` is all the delay there is (scrape + replica
      start), and it is rounded down to whole steps;
    - no queueing: a request is missed only when its step's demand exceeds the
      step's capacity; capacity equal to demand meets the SLO, and no backlog
      carries into the next step;
    - exact measurement: the rule sees the true per-step mean rates;
    - hindsight headroom: each model gets its own ``h_m``, chosen with the
      whole trace known, jointly to minimise GPU-hours.

    It covers one family of rules (a windowed max times a headroom), not every
    non-clairvoyant policy: a predictor (trend, seasonality) could do better.
    So it is evidence of what reacting costs on a trace, not a proof over all
    policies.

    Exactness: per model, misses and GPU-hours are computed exactly at every
    grid point (one sort per model, no pass per ``h``), each model's points are
    reduced to their lower convex hull, and the hulls' segments are taken
    greedily, most misses saved per GPU-hour first -- the Lagrangian sweep done
    exactly -- the last one in part, along its chord. Without a floor, GPU-hours
    are linear in ``h`` and misses convex, so the curve lies under its chords:
    the answer is reached by the rule at some ``h`` and is its minimum to within
    the grid's resolution. A floor can bend the curve the other way (a step that
    leaves the floor starts to cost and to save at once); the answer is then the
    convex relaxation, at most one model's hull segment below what headrooms on
    the grid reach -- again on the generous side.
    """
    d = np.asarray(demand_rps, dtype=float)
    if d.ndim != 2 or d.shape[1] == 0:
        raise ValueError(f"demand_rps: expected a 2-D array (models, steps) with at least one step, "
                         f"got shape {d.shape}")
    n_models, n_steps = d.shape
    bad = d[~(np.isfinite(d) & (d >= 0))]
    if bad.size:
        raise ValueError(f"demand_rps: rates must be finite and >= 0, got {bad[0]!r}")
    rate = np.asarray(per_slice_rps, dtype=float)
    if rate.shape != (n_models,):
        raise ValueError(f"per_slice_rps: expected shape ({n_models},) (one per model), got {rate.shape}")
    bad = rate[~(np.isfinite(rate) & (rate > 0))]
    if bad.size:
        raise ValueError(f"per_slice_rps: rates must be finite and > 0, got {bad[0]!r}")
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s: must be > 0, got {step_s!r}")
    if isinstance(slices_per_gpu, bool) or not isinstance(slices_per_gpu, int | np.integer) \
            or slices_per_gpu < 1:
        raise ValueError(f"slices_per_gpu: must be an integer >= 1, got {slices_per_gpu!r}")
    if not (math.isfinite(lag_s) and lag_s >= 0):
        raise ValueError(f"lag_s: must be >= 0, got {lag_s!r}")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s: must be > 0, got {window_s!r}")
    targets = list(targets)
    if not targets:
        raise ValueError("targets: expected at least one attainment target, got none")
    for t in targets:
        if not (math.isfinite(t) and 0 < t <= 1):
            raise ValueError(f"targets: each must be in (0, 1], got {t!r}")
    if floor_slices is None:
        floor = np.zeros(n_models)
    else:
        floor = np.asarray(floor_slices, dtype=float)
        if floor.shape != (n_models,):
            raise ValueError(f"floor_slices: expected shape ({n_models},) (one per model), got {floor.shape}")
        bad = floor[~(np.isfinite(floor) & (floor >= 0))]
        if bad.size:
            raise ValueError(f"floor_slices: must be finite and >= 0, got {bad[0]!r}")
    grid = np.asarray(headroom_grid, dtype=float)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"headroom_grid: expected a non-empty 1-D sequence, got shape {grid.shape}")
    bad = grid[~(np.isfinite(grid) & (grid > -1))]
    if bad.size:
        raise ValueError(f"headroom_grid: each headroom must be finite and > -1, got {bad[0]!r}")
    u = np.unique(1.0 + grid)  # the capacity multiplier 1 + h, sorted

    seen = lagged_window_max(d, step_s, lag_s, window_s)

    to_gpu_h = step_s / 3600.0 / slices_per_gpu
    hull_g, hull_m = [], []
    for i in range(n_models):
        floor_rps = floor[i] * rate[i]
        # max(d - max(u r, F), 0) = max(d - u r, 0) - max(min(F, d) - u r, 0): two hinge sums
        miss = _hinge_sums(d[i], seen[i], u) - _hinge_sums(np.minimum(floor_rps, d[i]), seen[i], u)
        miss = np.maximum(miss, 0.0)  # rounding in the difference of suffix sums
        # max(u r, F) = u r + max(F - u r, 0)
        cap = u * seen[i].sum() + _hinge_sums(np.full(n_steps, floor_rps), seen[i], u)
        g, m = _lower_hull(cap / rate[i] * to_gpu_h, miss)
        hull_g.append(g)
        hull_m.append(m)

    g0 = sum(float(g[0]) for g in hull_g)
    m0 = sum(float(m[0]) for m in hull_m)
    dg = np.concatenate([np.diff(g) for g in hull_g])
    saved = np.concatenate([-np.diff(m) for m in hull_m])
    useful = saved > 0  # a hull is convex: once a segment saves nothing, none after it does
    dg, saved = dg[useful], saved[useful]
    # most misses saved per GPU-hour first; within one model the hull already orders its segments so
    order = np.argsort(-(saved / np.maximum(dg, 1e-300)), kind="stable")
    dg, saved = dg[order], saved[order]
    cum_g = np.concatenate([[0.0], np.cumsum(dg)])
    cum_saved = np.concatenate([[0.0], np.cumsum(saved)])
    total = float(d.sum())
    tol = 1e-9 * total  # rounding in the suffix sums; far below any target's resolution
    out: dict[float, float | None] = {}
    for t in targets:
        need = m0 - (1.0 - t) * total  # misses to remove from the cheapest point
        if need <= tol:
            out[t] = g0
            continue
        j = int(np.searchsorted(cum_saved, need - tol, side="left"))
        if j >= len(cum_saved):
            out[t] = None
            continue
        frac = min(1.0, max(0.0, (need - cum_saved[j - 1]) / saved[j - 1]))
        out[t] = g0 + float(cum_g[j - 1] + frac * dg[j - 1])
    return out


def lagged_window_max(demand_rps: np.ndarray, step_s: float, lag_s: float, window_s: float) -> np.ndarray:
    """``seen[m, k] = max(demand[m, k-L-w+1 .. k-L])`` (``L = floor(lag_s / step_s)``,
    ``w = max(1, round(window_s / step_s))`` steps): what a rule ``lag_s`` late saw over
    its window. The trace's first rate stands in before t = 0."""
    d = np.asarray(demand_rps, dtype=float)
    n_steps = d.shape[1]
    lag = math.floor(lag_s / step_s + 1e-9)
    w = max(1, round(window_s / step_s))
    ext = np.concatenate([np.repeat(d[:, :1], lag + w - 1, axis=1), d], axis=1)
    return np.lib.stride_tricks.sliding_window_view(ext[:, : n_steps + w - 1], w, axis=1).max(axis=2)


def _hinge_sums(x: np.ndarray, r: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``sum_k max(x_k - u * r_k, 0)`` for every ``u`` of the sorted array ``u > 0`` (``r >= 0``).

    A term is positive exactly while ``u < x_k / r_k``: sorting those thresholds
    once and keeping suffix sums of ``x`` and ``r`` gives every ``u`` by a
    binary search, instead of a pass over the steps per ``u``."""
    blind = r <= 0  # nothing seen: the term is x_k whatever the headroom
    const = float(np.maximum(x[blind], 0.0).sum())
    xs, rs = x[~blind], r[~blind]
    th = xs / rs
    order = np.argsort(th, kind="stable")
    th, xs, rs = th[order], xs[order], rs[order]
    sx = np.append(np.cumsum(xs[::-1])[::-1], 0.0)
    sr = np.append(np.cumsum(rs[::-1])[::-1], 0.0)
    i = np.searchsorted(th, u, side="right")  # first threshold above u
    return const + sx[i] - u * sr[i]


def _lower_hull(g: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lower convex hull of the points (g, m), from the least g (monotone chain).

    The exact curve is convex; the hull only removes rounding noise and
    collinear points, so that each model's segments save strictly less per
    GPU-hour one after the other and the greedy merge may reorder freely."""
    order = np.lexsort((m, g))
    hg: list[float] = []
    hm: list[float] = []
    for gi, mi in zip(g[order].tolist(), m[order].tolist()):
        while len(hg) >= 2 and (hg[-1] - hg[-2]) * (mi - hm[-2]) - (hm[-1] - hm[-2]) * (gi - hg[-2]) <= 0:
            hg.pop()
            hm.pop()
        hg.append(gi)
        hm.append(mi)
    return np.array(hg), np.array(hm)


# ------------------------------------------------------------------ static-peak


def static_peak_counts(specs: Sequence[ModelSpec], peak_rps: Mapping[str, float], product: str) -> dict[str, int]:
    """Whole GPUs per model: max(min_replicas, ceil(peak / full-GPU capacity))."""
    full = get_product(product).full.name
    out: dict[str, int] = {}
    for s in specs:
        cap = s.capacity.get(full)
        if not cap:
            raise ValueError(f"static-peak: model {s.name} has no capacity for the whole-GPU profile {full}")
        out[s.name] = max(s.min_replicas, math.ceil(peak_rps.get(s.name, 0.0) / cap - 1e-9))
    return out


# ------------------------------------------------------------------ static MIG layout for the HPA baselines


def static_mig_layouts(
    specs: Sequence[ModelSpec], peak_rps: Mapping[str, float], gpus: Sequence[GpuState]
) -> tuple[dict[str, str], dict[str, tuple[Placement, ...]]]:
    """Each model's Deployment profile (its most efficient) and one fixed layout per GPU.

    GPUs are cut uniformly, one profile each (seven 1g, three 2g, two 3g, ...),
    in proportion to the slices the models of each profile need at their peak
    -- a sensible hand-made static cut, the kind the HPA baselines get.
    """
    product = gpus[0].product
    prod = get_product(product)
    profile = {s.name: best_profile(s, product) for s in specs}
    need: dict[str, float] = {}
    for s in specs:
        p = profile[s.name]
        reps = max(s.min_replicas, math.ceil(peak_rps.get(s.name, 0.0) / s.capacity[p] - 1e-9))
        need[p] = need.get(p, 0.0) + reps * prod.profiles[p].compute
    total = sum(need.values()) or 1.0
    order = sorted(need, key=lambda p: -need[p])
    n = len(gpus)
    alloc = {p: max(1, round(n * need[p] / total)) for p in order}
    while sum(alloc.values()) > n:  # trim the largest allocation first
        big = max(alloc, key=lambda p: alloc[p])
        alloc[big] -= 1
    while sum(alloc.values()) < n:
        alloc[order[0]] += 1
    layouts: dict[str, tuple[Placement, ...]] = {}
    it = iter(gpus)
    for p, k in alloc.items():
        for _ in range(k):
            g = next(it)
            layouts[g.id] = _fill(prod, p)
    return profile, layouts


def _fill(prod, profile: str) -> tuple[Placement, ...]:
    from autoscaler.mig import free_starts

    layout: list[Placement] = []
    while True:
        starts = free_starts(prod, layout, profile)
        if not starts:
            return tuple(sorted(layout))
        layout.append(Placement(starts[0], profile))


# ------------------------------------------------------------------ HPA baselines


@dataclass(frozen=True)
class HpaBaselineConfig:
    metric: Literal["queue_compute", "utilization"]
    target: float  # 1.0 for the queue:compute ratio, 0.7 for utilisation
    profiles: Mapping[str, str]  # model -> the profile its Deployment requests
    tolerance: float = hpa.DEFAULT_TOLERANCE
    scale_up: hpa.ScalingRules = hpa.DEFAULT_SCALE_UP
    scale_down: hpa.ScalingRules = hpa.DEFAULT_SCALE_DOWN
    sync_s: float = 15.0  # the HPA controller's sync period


@dataclass(frozen=True)
class HpaBaselineState:
    recommendations: Mapping[str, tuple[hpa.Recommendation, ...]] = field(default_factory=dict)
    events: Mapping[str, tuple[hpa.ScaleEvent, ...]] = field(default_factory=dict)
    pending: Mapping[str, int] = field(default_factory=dict)  # pods with no free instance


def hpa_decide(
    obs: Observation, state: HpaBaselineState, specs: Sequence[ModelSpec], cfg: HpaBaselineConfig, now_s: float
) -> tuple[tuple[Action, ...], HpaBaselineState]:
    """One HPA sync over every model's Deployment, then the scheduler's placement."""
    recs, events, pending = dict(state.recommendations), dict(state.events), {}
    keep_recs = max(cfg.scale_up.stabilization_window_s, cfg.scale_down.stabilization_window_s)
    keep_events = hpa.longest_period_s(cfg.scale_up, cfg.scale_down)
    cluster = obs.cluster
    taken = _occupied(cluster)
    actions: list[Action] = []
    for s in specs:
        pods = [r for r in cluster.replicas if r.model == s.name and r.state in LIVE]
        n = len(pods)
        if n < s.min_replicas:
            desired = s.min_replicas
        else:
            sig = obs.models.get(s.name) if obs.source_ok else None
            if cfg.metric == "queue_compute":
                value = sig.queue_compute_ratio if sig is not None else None
                prop = None if value is None else hpa.replica_ratio(n, value, cfg.target, cfg.tolerance)
            else:
                vals = []
                for r in pods:
                    rs = obs.replicas.get(r.id)
                    vals.append(rs.busy_fraction if rs is not None and r.state == ReplicaState.READY else None)
                prop = hpa.pods_metric_replicas(n, vals, cfg.target, cfg.tolerance)
            proposal, _ = hpa.combine_metrics(n, [prop])
            stab, _ = hpa.stabilize(n, proposal, recs.get(s.name, ()), now_s,
                                    cfg.scale_up.stabilization_window_s, cfg.scale_down.stabilization_window_s)
            if prop is not None:
                recs[s.name] = hpa.record_recommendation(recs.get(s.name, ()), hpa.Recommendation(now_s, proposal),
                                                         keep_recs)
            desired, _ = hpa.apply_behavior(n, stab, s.min_replicas, s.max_replicas, events.get(s.name, ()),
                                            cfg.scale_up, cfg.scale_down, now_s)
        events[s.name] = hpa.record_scale_event(events.get(s.name, ()), now_s, n, desired, keep_events)
        if desired > n:
            prof = cfg.profiles[s.name]
            for _ in range(desired - n):
                spot = _schedule(cluster, taken, prof)
                if spot is None:
                    pending[s.name] = pending.get(s.name, 0) + 1
                    continue
                taken.add(spot)
                actions.append(Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu=spot[0], model=s.name,
                                      profile=prof, start=spot[1]))
        elif desired < n:
            load = _gpu_load(cluster)
            # Kubernetes removes unready pods first; then we take the emptiest GPU's
            victims = sorted(pods, key=lambda r: (r.state == ReplicaState.READY, load.get(r.gpu, 0), r.id))
            for r in victims[: n - desired]:
                actions.append(Action(ActionKind.DRAIN, Reason.SCALE_DOWN_DEMAND, gpu=r.gpu, model=s.name,
                                      profile=r.profile, start=r.start, replica=r.id))
                actions.append(Action(ActionKind.DELETE, Reason.SCALE_DOWN_DEMAND, gpu=r.gpu, model=s.name,
                                      profile=r.profile, start=r.start, replica=r.id))
    return tuple(actions), HpaBaselineState(recs, events, pending)


def _occupied(cluster: ClusterState) -> set[tuple[str, int]]:
    return {(r.gpu, r.start) for r in cluster.replicas}


def _gpu_load(cluster: ClusterState) -> dict[str, int]:
    load: dict[str, int] = {}
    for r in cluster.replicas:
        load[r.gpu] = load.get(r.gpu, 0) + 1
    return load


def _schedule(cluster: ClusterState, taken: set[tuple[str, int]], profile: str) -> tuple[str, int] | None:
    """A free instance of ``profile``: the fullest GPU first (MostAllocated), then by id."""
    load: dict[str, int] = {}
    for g, _ in taken:
        load[g] = load.get(g, 0) + 1
    best = None
    for g in cluster.gpus:
        for pl in g.layout:
            if pl.profile == profile and (g.id, pl.start) not in taken:
                key = (-load.get(g.id, 0), g.id, pl.start)
                if best is None or key < best[0]:
                    best = (key, (g.id, pl.start))
    return None if best is None else best[1]
