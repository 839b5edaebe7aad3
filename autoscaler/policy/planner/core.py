"""The MIG planner: pack each model's capacity onto MIG slices across GPUs.

Place in the loop: the last pure step of ``decide``. Input: the models, the
req/s each must sustain (headroom already included) and the cluster as
observed; output: a ``Plan`` -- desired replicas per (model, profile), the
concrete (gpu, profile, start) assignments, the target layout of every GPU,
the ordered make-before-break actions, the shortfall, the cost and a reason
for every change. Zero I/O; ``now_s`` only stamps the plan.

Objective, in order: (1) meet every model's demand, >= 2 replicas on distinct
GPUs for high availability; (2) fewest GPUs (a freed whole GPU can be returned
or given to the multinode backend); (3) fewest slices; (4) least disruption:
running replicas stay where they are, and at most ``churn_budget`` CREATE +
DELETE actions per call that stop or move something that runs (a scale-up
that deletes nothing is not counted; the rest is deferred with
``Reason.CHURN_BUDGET`` and the next call continues).

How (a fast heuristic; ``milp.py`` holds the exact reference):
1. sizing (``planner.sizing``): keep the running replicas that still earn
   their place; add the fewest-slices mix covering the missing req/s; drop
   replicas demand no longer needs (least efficient, emptiest GPU first);
   switch a model wholesale to its fresh optimal mix only when that saves at
   least max(7, 25%) of its slices and the new mix can be placed beside the
   old one -- smaller savings are not worth the churn; a model that holds
   more capacity than its (long-stabilized) demand swaps one oversized
   replica per tick for a smaller one on an empty instance (``_downsize``).
2. multinode models (``planner.multinode``) take whole RDMA GPUs,
   all-or-nothing per group, one fabric preferred.
3. placement (``planner.place``, then ``planner.repair``, over ``packing``): a running model short of
   its demand first takes empty instances that exist now, on any usable
   profile (``place_urgent``: ready in a start delay, not after a
   repartition; such a GPU keeps its layout this tick); then new replicas fill GPUs
   already in use, then empty GPUs are cut with whole-GPU patterns; high
   availability is repaired by swapping; a lightly used GPU whose replicas
   all fit elsewhere is emptied (consolidation).
4. on small clusters (<= 16 GPUs; ``planner.search``), when the result is above the slice lower
   bound, a coordinate descent over the new models' alternative mixes
   (each within 6 slices of its optimum) keeps the best plan: a lost GPU
   there is 25-50% (the benchmark's optimality gap vs the MILP). While a
   shortfall remains, two models' mixes are changed at once (at most 128
   plans): some fleets fit only a joint change.
5. actions (``planner.actions``): churn budget (within a priority, the
   creates that need no repartition first), dependency order, layouts.
6. warm spares (``planner.spare``): on a calm tick, empty instances of the
   profiles ``decide`` learned to keep are carved on GPUs already in use.

Shortfall priority rule (when the cluster cannot hold everything): first
one replica for every model with demand that would otherwise hold none, so
no priority starves another to zero (``Reason.FLEET_SHARE_MIN``); then higher
``ModelSpec.priority`` first; within one priority, every model's floor
(min_replicas, 2 for high availability) before anyone's extra capacity; the
extra capacity is then handed out in proportion to demand (replica by
replica, always to the model with the smallest fraction of its demand met).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import autoscaler.policy.planner.actions as acts
from autoscaler.mig.layout import Placement
from autoscaler.mig.products import PRODUCTS, Product
from autoscaler.policy.planner.multinode import WHOLE, group_of, plan_multinode
from autoscaler.policy.planner.packing import GpuWork
from autoscaler.policy.planner.place import place_all, refill, unmet
from autoscaler.policy.planner.repair import consolidate, fix_high_availability
from autoscaler.policy.planner.rightsize import DOWNSIZE_MIN_SLICES, downsize, free_profiles
from autoscaler.policy.planner.search import plan_key, search_mixes, worth_searching
from autoscaler.policy.planner.sizing import (
    EPS,
    cover,
    mix_slices,
    usable_profiles,
)
from autoscaler.policy.planner.spare import keep_spares
from autoscaler.policy.planner.urgent import place_urgent
from autoscaler.policy.planner.work import HEALTHY, ModelWork
from autoscaler.policy.types import (
    ClusterState,
    ModelSpec,
    Plan,
    Reason,
    RepartitionScope,
    Replica,
    ReplicaState,
)

__all__ = ["DOWNSIZE_MIN_SLICES", "WHOLE", "apply_plan_to_cluster", "group_of", "plan"]

apply_plan_to_cluster = acts.apply_plan_to_cluster

# A model is moved wholesale to its fresh optimal mix only when that saves at
# least a whole GPU's worth of compute (7 slices) or 25% of its slices. The
# small-cluster search (``planner.search``) only considers mixes within its
# SEARCH_SLACK (< 7) slices of the optimum, so a plan never undoes its own
# choice next tick.
REBALANCE_MIN_SLICES = 7
# Consolidate -> refill rounds when a shortage meets an emptied GPU.
CONSOLIDATE_ROUNDS = 4


def plan(
    models: Sequence[ModelSpec],
    demand_rps: Mapping[str, float],
    cluster: ClusterState,
    *,
    churn_budget: int | None = None,
    now_s: float = 0.0,
    fast_path: bool = True,
    spares: Mapping[str, int] | None = None,
    repartition_scope: RepartitionScope = RepartitionScope.GPU,
) -> Plan:
    """Plan replicas, placements, layouts and actions for one tick (pure).

    ``spares``: profile -> empty instances to keep carved on GPUs in use
    (``planner.spare.keep_spares``: on calm ticks where a repartition touches one
    GPU; none where it drains the node, ``repartition_scope`` NODE). Where it
    drains the node, consolidation also moves replicas only into instances as
    cut now (``repair.consolidate``).

    ``fast_path``: a running model short of its demand first takes empty
    instances that exist now (``planner.urgent``), and creates that need no
    repartition go first under the churn budget -- right when repartitions
    take minutes (mig-manager); off where they are ~instant (the local
    emulation), so bursts are met with the most efficient profiles.
    """
    # A NaN/inf/non-number demand is not a demand: the model holds as if blind.
    invalid = {k for k, v in demand_rps.items() if not isinstance(v, (int, float)) or not math.isfinite(v)}
    demand_rps = {k: max(0.0, float(v)) for k, v in demand_rps.items() if k not in invalid}
    specs = {m.name: m for m in models}
    rows = _gpu_rows(cluster)  # read once: every attempt builds its own GpuWork from them
    gpus, by_id = _gpu_work(rows)
    mig_products: list[Product] = []
    for w in gpus:
        if w.product not in mig_products:
            mig_products.append(w.product)

    removed: dict[str, Reason] = {}  # replica id -> why it goes
    replicas_by_model: dict[str, list[Replica]] = {}
    for r in cluster.replicas:
        replicas_by_model.setdefault(r.model, []).append(r)
    for name, reps in replicas_by_model.items():
        if name not in specs:  # model no longer declared
            for r in reps:
                removed[r.id] = Reason.SCALE_DOWN_DEMAND

    # Load of each GPU now (healthy replicas' compute): scale-down removes from the emptiest first.
    load: dict[str, int] = {}
    for r in cluster.replicas:
        w = by_id.get(r.gpu)
        if w is not None and r.state in HEALTHY and r.profile in w.product.profiles:
            load[r.gpu] = load.get(r.gpu, 0) + w.product.profiles[r.profile].compute

    removed0 = dict(removed)
    free_now = free_profiles(cluster, by_id)
    mn_models = [s for s in models if s.backend == "multinode"]
    no_rebalance: set[str] = set()
    while True:
        removed = dict(removed0)
        work: dict[str, ModelWork] = {}
        for spec in models:
            if spec.backend == "multinode":
                continue
            d = demand_rps.get(spec.name)
            m = ModelWork(spec, usable_profiles(spec, mig_products), None if d is None else max(0.0, float(d)))
            work[spec.name] = m
            _size_model(m, replicas_by_model.get(spec.name, []), by_id, load, removed,
                        rebalance=spec.name not in no_rebalance, free_now=free_now)

        def attempt(adds: Mapping[str, dict[str, int]] | None, work=work, removed=removed, reuse=False,
                    plain=False, reuse_probe=None) -> Plan:
            return _attempt(cluster, rows, models, demand_rps, specs, work, removed, adds, churn_budget, now_s,
                            mn_models, reuse, plain, fast_path, recut=repartition_scope is RepartitionScope.GPU,
                            reuse_probe=reuse_probe)

        probe: list[bool] = []
        best = attempt(None, reuse_probe=probe)
        if any(probe):
            # Variant: fill idle GPUs' existing instances first. Kept only when it
            # is no worse in shortfall, GPUs and slices, and needs fewer actions.
            # Tried only where it would place something differently (``probe``):
            # otherwise it is this very plan, and at thousands of GPUs an attempt
            # is a tenth of a second.
            alt = attempt(None, reuse=True)
            if plan_key(alt) < plan_key(best):
                best = alt
                attempt = functools.partial(attempt, reuse=True)  # the search continues from it
        # A switch to the optimal mix that cannot be placed (no room beside the
        # replicas it replaces) is dropped: keep serving as is, scale only.
        failed = {n for n, m in work.items() if m.rebalanced and _mix_of(best, n) != m.target_mix()}
        if not failed - no_rebalance:
            break
        no_rebalance |= failed
    if worth_searching(best, work, gpus):
        if any(m.add and m.spec.high_availability for m in work.values()):
            # Variant: pack without holding HA replicas back, repair HA after.
            alt = attempt(None, plain=True)
            if plan_key(alt) < plan_key(best):
                best = alt
                attempt = functools.partial(attempt, plain=True)
        best = search_mixes(best, work, attempt, gpus)
    if invalid & set(specs):
        reasons = {n: rs + ((Reason.INVALID_METRIC,) if n in invalid else ()) for n, rs in best.reasons.items()}
        best = dataclasses.replace(best, reasons=reasons)
    if spares:
        best = keep_spares(best, cluster, spares, repartition_scope)
    return best


def _attempt(cluster: ClusterState, rows: list[tuple], models: Sequence[ModelSpec], demand_rps: Mapping[str, float],
             specs: dict[str, ModelSpec], work0: dict[str, ModelWork], removed0: dict[str, Reason],
             adds: Mapping[str, dict[str, int]] | None, churn_budget: int | None, now_s: float,
             mn_models: list[ModelSpec], reuse: bool = False, plain: bool = False,
             fast_path: bool = True, *, recut: bool = True, reuse_probe: list[bool] | None = None) -> Plan:
    """Place, repair and finish one candidate (sizing already done; ``adds`` overrides new mixes)."""
    gpus, by_id = _gpu_work(rows)
    removed = dict(removed0)
    work: dict[str, ModelWork] = {}
    for name, m0 in work0.items():
        m = copy.copy(m0)
        m.keep = list(m0.keep)
        m.reasons = list(m0.reasons)
        m.add = dict(adds[name]) if adds is not None and name in adds else dict(m0.add)
        work[name] = m
    # Pin the kept replicas; block the instances of replicas that go.
    for m in work.values():
        for r in m.keep:
            by_id[r.gpu].place(m.spec.name, r.profile, r.start, (), replica=r.id)
    for r in cluster.replicas:
        if r.id in removed or r.model not in work:
            w = by_id.get(r.gpu)
            if w is not None and r.profile in w.product.profiles and r.profile != WHOLE:
                w.block(Placement(r.start, r.profile))

    # Multinode groups take whole RDMA GPUs before new MIG replicas are placed.
    groups = plan_multinode(mn_models, demand_rps, cluster, gpus, by_id, removed)
    # A running model short of its demand first takes empty instances as they are cut now.
    if fast_path:
        place_urgent(work, gpus)

    total_new = sum(sum(m.add.values()) for m in work.values())
    placed_tier2: set[tuple[str, int]] = set()
    if total_new:
        place_all(work, gpus, placed_tier2, reuse=reuse, plain=plain, reuse_probe=reuse_probe)
    moved = fix_high_availability(work, gpus, removed)
    evacuated: set[str] = set()
    starting = frozenset(r.id for r in cluster.replicas if r.state is ReplicaState.STARTING)
    for _ in range(CONSOLIDATE_ROUNDS):
        moved |= consolidate(work, gpus, removed, evacuated, recut=recut, starting=starting, copies=moved)
        if not (total_new and unmet(work, gpus)):
            break
        # The HA repair or consolidation may have opened space while demand
        # is still unmet: use it now, not next tick (a plan must be a
        # fixpoint of itself), then look again while that helps.
        before = sum(len(g.hard) for g in gpus)
        ha = frozenset(n for n, m in work.items() if m.spec.high_availability)
        for level in sorted({m.spec.priority for m in work.values()}, reverse=True):
            # A GPU just emptied on purpose is not refilled with new replicas in
            # the space its old ones leave (that would only churn them).
            refill([m for m in work.values() if m.spec.priority == level], gpus, placed_tier2, ha,
                   keep_closed=frozenset(evacuated))
        if sum(len(g.hard) for g in gpus) == before:
            break
        moved |= fix_high_availability(work, gpus, removed)
    # Consolidation and top-ups change what is where: check the HA spread last.
    moved |= fix_high_availability(work, gpus, removed)

    return acts.finish(
        now_s=now_s,
        cluster=cluster,
        gpus=gpus,
        work=work,
        groups=groups,
        removed=removed,
        placed_tier2=placed_tier2,
        moved=moved,
        churn_budget=churn_budget,
        demand_rps=demand_rps,
        specs=specs,
        fast_first=fast_path,
    )


def _gpu_work(rows: list[tuple]) -> tuple[list[GpuWork], dict[str, GpuWork]]:
    gpus: list[GpuWork] = []
    by_id: dict[str, GpuWork] = {}
    for gid, node, product, rdma, fabric, current, order, busy in rows:
        w = GpuWork(gid, node, product, rdma, fabric, current, order)
        w.frozen = busy
        gpus.append(w)
        by_id[gid] = w
    return gpus, by_id


def _gpu_rows(cluster: ClusterState) -> list[tuple]:
    """What ``GpuWork`` is built from, per GPU of known hardware (unknown hardware is never planned onto)."""
    rows = []
    for i, g in enumerate(cluster.gpus):
        product = PRODUCTS.get(g.product)
        if product is not None:
            rows.append((g.id, g.node, product, g.rdma, g.fabric, tuple(sorted(g.layout)) if g.mig_enabled else (),
                         i, g.busy))
    return rows


# ---------------------------------------------------------------- sizing with state


def _mix_of(p: Plan, model: str) -> dict[str, int]:
    return {prof: n for (m, prof), n in p.desired.items() if m == model and n}


def _size_model(m: ModelWork, reps: list[Replica], by_id: dict[str, GpuWork], load: dict[str, int],
                removed: dict[str, Reason], *, rebalance: bool = True, free_now: frozenset[str] | None = None) -> None:
    spec = m.spec
    healthy: list[Replica] = []
    for r in reps:
        w = by_id.get(r.gpu)
        if r.state not in HEALTHY:
            removed[r.id] = Reason.REPLACE_FAILED
        elif w is None or r.profile not in m.cap or r.profile not in w.product.profiles or w.current == () \
                or Placement(r.start, r.profile) not in w.current:
            removed[r.id] = Reason.PROFILE_EFFICIENCY  # profile no longer usable, or instance gone
        else:
            healthy.append(r)
    if any(removed.get(r.id) is Reason.REPLACE_FAILED for r in reps):
        m.why(Reason.REPLACE_FAILED)
    if not m.options:
        for r in healthy:
            removed[r.id] = Reason.PROFILE_EFFICIENCY
        m.why(Reason.SHORTFALL)
        return
    current = sum(m.cap[r.profile] for r in healthy)
    m.running = len(healthy)
    if m.demand is None:
        # Blind: hold what serves now (never scale down on a partial picture).
        m.demand = current
        m.why(Reason.HOLD_MISSING_METRICS)
    demand = m.demand
    ceiling = max(0, spec.max_replicas)
    fresh = cover(demand, m.options, m.floor, ceiling)
    if not healthy:
        m.add = fresh
        m.create_reason = Reason.MIN_REPLICAS if demand <= EPS else Reason.SCALE_UP_DEMAND
        if fresh:
            m.why(m.create_reason)
        return
    eff = {o.name: o.efficiency for o in m.options}
    # Removal preference: least efficient, on the emptiest GPU, not yet ready, then id.
    healthy.sort(key=lambda r: (eff[r.profile], load.get(r.gpu, 0), r.state is ReplicaState.READY, r.id))
    keep = list(healthy)
    n, cap = len(keep), current
    add: dict[str, int] = {}
    if cap >= demand - EPS and n >= m.floor:
        for r in list(keep):
            c = m.cap[r.profile]
            if n - 1 >= m.floor and cap - c >= demand - EPS:
                if spec.high_availability and len({k.gpu for k in keep if k is not r}) < 2:
                    continue  # never scale down onto a single GPU
                keep.remove(r)
                n, cap = n - 1, cap - c
                removed[r.id] = Reason.SCALE_DOWN_DEMAND
        if not any(removed.get(r.id) is Reason.SCALE_DOWN_DEMAND for r in healthy):
            add = downsize(m, keep, cap, demand, removed, free_now)
    else:
        add = cover(demand - cap, m.options, max(0, m.floor - n), max(0, ceiling - n))
    while len(keep) > ceiling:
        r = keep.pop(0)
        removed[r.id] = Reason.MAX_REPLICAS
    adjusted = _mix(keep)
    for p, c in add.items():
        adjusted[p] = adjusted.get(p, 0) + c
    fresh_s, adj_s = mix_slices(fresh, m.options), mix_slices(adjusted, m.options)
    # Worked number: a light model on 7 x 2g (14 slices) whose fresh optimum is
    # 7 x 1g (7 slices) saves 7 >= max(7, 2): switch. 9 slices vs 8: hold.
    margin = max(REBALANCE_MIN_SLICES, math.ceil(0.25 * fresh_s))
    if rebalance and adj_s >= fresh_s + margin:
        m.rebalanced = True
        want = dict(fresh)
        # Keep the running replicas that the fresh mix also has (including any
        # the scale-down above had picked): READY, fullest GPU first.
        keep_order = sorted(healthy, key=lambda r: (r.state is not ReplicaState.READY, -load.get(r.gpu, 0), r.id))
        kept: list[Replica] = []
        for r in keep_order:
            if want.get(r.profile, 0) > 0:
                want[r.profile] -= 1
                kept.append(r)
                removed.pop(r.id, None)
            else:
                removed[r.id] = Reason.PROFILE_EFFICIENCY
        keep = kept
        add = {p: c for p, c in want.items() if c > 0}
        m.why(Reason.PROFILE_EFFICIENCY)
        m.create_reason = Reason.PROFILE_EFFICIENCY
    m.keep = keep
    m.add = add
    if add:
        m.why(m.create_reason)
    if any(removed.get(r.id) is Reason.SCALE_DOWN_DEMAND for r in healthy):
        m.why(Reason.SCALE_DOWN_DEMAND)
    if add and m.create_reason is not Reason.PROFILE_EFFICIENCY:
        if len(keep) < m.floor:
            m.create_reason = Reason.HIGH_AVAILABILITY if spec.high_availability and len(keep) < 2 else Reason.MIN_REPLICAS
        elif any(removed.get(r.id) is Reason.REPLACE_FAILED for r in reps) and cap >= demand - EPS:
            m.create_reason = Reason.REPLACE_FAILED


def _mix(reps: list[Replica]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reps:
        out[r.profile] = out.get(r.profile, 0) + 1
    return out


