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
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Observation,
    Reason,
    ReplicaState,
)

_LIVE = (ReplicaState.STARTING, ReplicaState.READY)


def best_profile(spec: ModelSpec, product: str) -> str:
    """The profile with the most req/s per compute slice (ties: the smaller slice)."""
    prod = get_product(product)
    opts = [(c / prod.profiles[p].compute, -prod.profiles[p].compute, p)
            for p, c in spec.capacity.items() if p in prod.profiles and c > 0 and p in spec.allowed_profiles]
    if not opts:
        raise ValueError(f"model {spec.name}: no usable profile with capacity on {product}")
    return max(opts)[2]


# ------------------------------------------------------------------ oracle


def oracle_slices(
    specs: Sequence[ModelSpec], demand_rps: np.ndarray, product: str
) -> np.ndarray:
    """Compute slices the cluster needs per step: sum over models of max(demand / best efficiency,
    min_replicas x the smallest usable slice). ``demand_rps[m, k]``; returns shape (k,)."""
    prod = get_product(product)
    total = np.zeros(demand_rps.shape[1])
    for i, s in enumerate(specs):
        usable = [(p, c) for p, c in s.capacity.items() if p in prod.profiles and c > 0]
        eff = max(c / prod.profiles[p].compute for p, c in usable)
        floor = s.min_replicas * min(prod.profiles[p].compute for p, _ in usable)
        total += np.maximum(demand_rps[i] / eff, floor)
    return total


def oracle_hours(
    specs: Sequence[ModelSpec], demand_rps: np.ndarray, step_s: float, product: str
) -> tuple[float, float]:
    """(GPU-hours, slice-hours) of the oracle bound: slices packed perfectly, 7 per GPU."""
    slices = oracle_slices(specs, demand_rps, product)
    per_gpu = get_product(product).compute_slices
    return float(slices.sum() * step_s / per_gpu / 3600.0), float(slices.sum() * step_s / 3600.0)


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
        pods = [r for r in cluster.replicas if r.model == s.name and r.state in _LIVE]
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
