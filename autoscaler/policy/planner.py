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
DELETE actions per call (the rest is deferred with ``Reason.CHURN_BUDGET``
and the next call continues).

How (a fast heuristic; ``milp.py`` holds the exact reference):
1. sizing (``planner_sizing``): keep the running replicas that still earn
   their place; add the fewest-slices mix covering the missing req/s; drop
   replicas demand no longer needs (least efficient, emptiest GPU first);
   switch a model wholesale to its fresh optimal mix only when that saves at
   least max(7, 25%) of its slices -- smaller savings are not worth the churn.
2. multinode models take whole RDMA GPUs, all-or-nothing per group, one
   fabric preferred.
3. packing (``packing``): new replicas fill GPUs already in use, then empty
   GPUs are cut with whole-GPU patterns; high availability is repaired by
   swapping; a lightly used GPU whose replicas all fit elsewhere is emptied.
4. actions (``planner_actions``): churn budget, dependency order, layouts.

Shortfall priority rule (when the cluster cannot hold everything): higher
``ModelSpec.priority`` first; within one priority, every model's floor
(min_replicas, 2 for high availability) before anyone's extra capacity; the
extra capacity is then handed out in proportion to demand (replica by
replica, always to the model with the smallest fraction of its demand met).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from typing import Mapping, Sequence

from autoscaler.mig.layout import Placement
from autoscaler.mig.products import PRODUCTS, Product
from autoscaler.policy import planner_actions as acts
from autoscaler.policy.packing import GpuWork, Index, interleave, pack
from autoscaler.policy.planner_sizing import (
    EPS,
    ProfileOption,
    alternatives,
    cover,
    mix_slices,
    required_min,
    usable_profiles,
)
from autoscaler.policy.types import ClusterState, ModelSpec, Plan, Reason, Replica, ReplicaState

__all__ = ["plan", "apply_plan_to_cluster", "group_of", "WHOLE"]

WHOLE = acts.WHOLE
group_of = acts.group_of
apply_plan_to_cluster = acts.apply_plan_to_cluster

HEALTHY = (ReplicaState.READY, ReplicaState.STARTING)
# A model is moved wholesale to its fresh optimal mix only when that saves at
# least a whole GPU's worth of compute (7 slices) or 25% of its slices. The
# small-cluster search below only considers mixes within SEARCH_SLACK (< 7)
# slices of the optimum, so a plan never undoes its own choice next tick.
REBALANCE_MIN_SLICES = 7
SEARCH_SLACK = 6
# Consolidation tries at most this many candidate GPUs per call: bounded work
# on 10,000 GPUs (each try scans signatures, not GPUs).
CONSOLIDATE_TRIES = 64


class _Model:
    """Planner-private per-model bookkeeping."""

    def __init__(self, spec: ModelSpec, options: list[ProfileOption], demand: float | None) -> None:
        self.spec = spec
        self.options = options
        self.cap = {o.name: o.cap for o in options}
        self.demand = demand
        self.floor = required_min(spec)
        self.keep: list[Replica] = []
        self.add: dict[str, int] = {}
        self.reasons: list[Reason] = []
        self.create_reason = Reason.SCALE_UP_DEMAND

    def why(self, r: Reason) -> None:
        if r not in self.reasons:
            self.reasons.append(r)


def plan(
    models: Sequence[ModelSpec],
    demand_rps: Mapping[str, float],
    cluster: ClusterState,
    *,
    churn_budget: int | None = None,
    now_s: float = 0.0,
) -> Plan:
    """Plan replicas, placements, layouts and actions for one tick (pure)."""
    specs = {m.name: m for m in models}
    gpus, by_id = _gpu_work(cluster)
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

    work: dict[str, _Model] = {}
    mn_models: list[ModelSpec] = []
    for spec in models:
        reps = replicas_by_model.get(spec.name, [])
        d = demand_rps.get(spec.name)
        demand = None if d is None else max(0.0, float(d))
        if spec.backend == "multinode":
            mn_models.append(spec)
            continue
        m = _Model(spec, usable_profiles(spec, mig_products), demand)
        work[spec.name] = m
        _size_model(m, reps, by_id, load, removed)

    def attempt(adds: Mapping[str, dict[str, int]] | None) -> Plan:
        return _attempt(cluster, models, demand_rps, specs, work, removed, adds, churn_budget, now_s, mn_models)

    best = attempt(None)
    if _worth_searching(best, work, gpus):
        best = _search_mixes(best, work, attempt, gpus)
    return best


# The mix search runs only on small clusters, where a missed GPU is a big
# relative loss (1 of 4 = 25%) and a plan costs about a millisecond.
SEARCH_MAX_GPUS = 16
SEARCH_ROUNDS = 2


def _lower_bound(work: dict[str, _Model], gpus: list[GpuWork]) -> int:
    per_gpu = max((g.product.compute_slices for g in gpus), default=7)
    by_id = {g.id: g for g in gpus}
    total = 0
    for m in work.values():
        total += mix_slices(m.add, m.options)
        total += sum(by_id[r.gpu].product.profiles[r.profile].compute for r in m.keep)
    return math.ceil(total / per_gpu)


def _worth_searching(best: Plan, work: dict[str, _Model], gpus: list[GpuWork]) -> bool:
    if len(gpus) > SEARCH_MAX_GPUS or not any(m.add for m in work.values()):
        return False
    return bool(best.shortfall) or best.cost.gpus_used > _lower_bound(work, gpus)


def _search_mixes(best: Plan, work: dict[str, _Model], attempt, gpus: list[GpuWork]) -> Plan:
    """Coordinate descent over each model's alternative mixes (new replicas only)."""
    lb = _lower_bound(work, gpus)
    current = {n: dict(m.add) for n, m in work.items() if m.add}
    alts: dict[str, list[dict[str, int]]] = {}
    for n, m in work.items():
        if not m.add:
            continue
        have = sum(m.cap[r.profile] for r in m.keep)
        alts[n] = alternatives((m.demand or 0.0) - have, m.options, max(0, m.floor - len(m.keep)),
                               max(0, m.spec.max_replicas - len(m.keep)), slack=SEARCH_SLACK)
    best_key = _plan_key(best)
    for _ in range(SEARCH_ROUNDS):
        improved = False
        for n in sorted(alts, key=lambda n: (-mix_slices(current[n], work[n].options), n)):
            for cand in alts[n]:
                if cand == current[n]:
                    continue
                trial = dict(current)
                trial[n] = cand
                p = attempt(trial)
                k = _plan_key(p)
                if k < best_key:
                    best, best_key, current, improved = p, k, trial, True
                    if not best.shortfall and best.cost.gpus_used <= lb:
                        return best
        if not improved:
            break
    return best


def _plan_key(p: Plan) -> tuple:
    return (round(sum(p.shortfall.values()), 6), p.cost.gpus_used, p.cost.slices_used, len(p.actions))


def _attempt(cluster: ClusterState, models: Sequence[ModelSpec], demand_rps: Mapping[str, float],
             specs: dict[str, ModelSpec], work0: dict[str, _Model], removed0: dict[str, Reason],
             adds: Mapping[str, dict[str, int]] | None, churn_budget: int | None, now_s: float,
             mn_models: list[ModelSpec]) -> Plan:
    """Place, repair and finish one candidate (sizing already done; ``adds`` overrides new mixes)."""
    gpus, by_id = _gpu_work(cluster)
    removed = dict(removed0)
    work: dict[str, _Model] = {}
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
                w.blocked[r.start] = Placement(r.start, r.profile)

    # Multinode groups take whole RDMA GPUs before new MIG replicas are placed.
    groups = acts.plan_multinode(mn_models, demand_rps, cluster, gpus, by_id, removed)

    total_new = sum(sum(m.add.values()) for m in work.values())
    placed_tier2: set[tuple[str, int]] = set()
    if total_new:
        _place_all(work, gpus, placed_tier2)
    moved = _fix_high_availability(work, gpus, removed)
    if any(m.keep for m in work.values()):
        moved |= _consolidate(work, gpus, removed)

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
    )


def _gpu_work(cluster: ClusterState) -> tuple[list[GpuWork], dict[str, GpuWork]]:
    gpus: list[GpuWork] = []
    by_id: dict[str, GpuWork] = {}
    for i, g in enumerate(cluster.gpus):
        product = PRODUCTS.get(g.product)
        if product is None:
            continue  # unknown hardware is never planned onto
        w = GpuWork(g.id, g.node, product, g.rdma, g.fabric, tuple(sorted(g.layout)) if g.mig_enabled else (), i)
        gpus.append(w)
        by_id[g.id] = w
    return gpus, by_id


# ---------------------------------------------------------------- sizing with state


def _size_model(m: _Model, reps: list[Replica], by_id: dict[str, GpuWork], load: dict[str, int],
                removed: dict[str, Reason]) -> None:
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
    if adj_s >= fresh_s + margin:
        want = dict(fresh)
        # Keep the running replicas that the fresh mix also has: READY, fullest GPU first.
        keep_order = sorted(keep, key=lambda r: (r.state is not ReplicaState.READY, -load.get(r.gpu, 0), r.id))
        kept: list[Replica] = []
        for r in keep_order:
            if want.get(r.profile, 0) > 0:
                want[r.profile] -= 1
                kept.append(r)
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


# ---------------------------------------------------------------- placement


def _snapshot(gpus: list[GpuWork]) -> list[tuple]:
    return [(dict(g.hard), dict(g.blocked), set(g.soft)) for g in gpus]


def _restore(gpus: list[GpuWork], snap: list[tuple]) -> None:
    for g, (h, b, s) in zip(gpus, snap):
        g.hard, g.blocked, g.soft = dict(h), dict(b), set(s)


def _pools(counts: dict[str, dict[str, int]]) -> dict[str, deque[str]]:
    """profile -> models (one entry per replica), models interleaved."""
    per_prof: dict[str, dict[str, int]] = {}
    for model, mix in counts.items():
        for p, c in mix.items():
            if c > 0:
                per_prof.setdefault(p, {})[model] = c
    return {p: interleave(ms) for p, ms in per_prof.items()}


def _pack_two_tiers(gpus: list[GpuWork], pools: dict[str, deque[str]], placed_tier2: set[tuple[str, int]],
                    ha: frozenset[str] = frozenset()) -> None:
    """Tier 1: space free now. Tier 2: also the space of replicas leaving this tick."""
    pack(gpus, pools, Index(gpus), ha_models=ha)
    if not any(pools.values()) or not any(g.blocked for g in gpus):
        return
    saved = {g.id: g.blocked for g in gpus if g.blocked}
    before = {g.id: set(g.hard) for g in gpus}
    for g in gpus:
        if g.blocked:
            g.soft |= set(g.blocked.values())
            g.blocked = {}
    pack(gpus, pools, Index(gpus), ha_models=ha)
    for g in gpus:
        for s in set(g.hard) - before[g.id]:
            placed_tier2.add((g.id, s))
        if g.id in saved:
            # Instances of leaving replicas that nothing new took stay blocked
            # (their replica is deleted this tick; the instance stays as it is).
            taken = {Placement(s, v[1]) for s, v in g.hard.items()}
            g.blocked = {s: p for s, p in saved[g.id].items() if p not in taken}
            g.soft -= set(g.blocked.values())


def _place_all(work: dict[str, _Model], gpus: list[GpuWork], placed_tier2: set[tuple[str, int]]) -> None:
    snap = _snapshot(gpus)
    ha = frozenset(n for n, m in work.items() if m.spec.high_availability)
    pools = _pools({n: m.add for n, m in work.items()})
    _pack_two_tiers(gpus, pools, placed_tier2, ha)
    if not any(pools.values()):
        return
    # Not everything fits: redo by the shortfall priority rule.
    _restore(gpus, snap)
    placed_tier2.clear()
    levels = sorted({m.spec.priority for m in work.values()}, reverse=True)
    for level in levels:
        ms = [m for m in work.values() if m.spec.priority == level and m.add]
        floors: dict[str, dict[str, int]] = {}
        extras: list[tuple[float, str, str]] = []
        for m in ms:
            need_floor = max(0, m.floor - len(m.keep))
            items = sorted(((p, m.cap[p]) for p, c in m.add.items() for _ in range(c)), key=lambda pc: -pc[1])
            have = sum(m.cap[r.profile] for r in m.keep)
            fl: dict[str, int] = {}
            for i, (p, c) in enumerate(items):
                if i < need_floor:
                    fl[p] = fl.get(p, 0) + 1
                    have += c
                else:
                    have += c
                    frac = have / m.demand if m.demand and m.demand > EPS else math.inf
                    extras.append((frac, m.spec.name, p))
            floors[m.spec.name] = fl
        snap1, t1 = _snapshot(gpus), set(placed_tier2)
        pools = _pools(floors)
        _pack_two_tiers(gpus, pools, placed_tier2, ha)
        if any(pools.values()):
            # The floors do not all fit as sized: every floor replica on the
            # model's smallest profile instead (a floor is about presence).
            _restore(gpus, snap1)
            placed_tier2.clear()
            placed_tier2 |= t1
            small = {}
            for name, fl in floors.items():
                n = sum(fl.values())
                if n:
                    o = min(work[name].options, key=lambda o: (o.compute, -o.cap, o.name))
                    small[name] = {o.name: n}
            pools = _pools(small)
            _pack_two_tiers(gpus, pools, placed_tier2, ha)
        extras.sort()
        snap2 = _snapshot(gpus)
        t2 = set(placed_tier2)
        ex_counts: dict[str, dict[str, int]] = {}
        for _f, name, p in extras:
            ex_counts.setdefault(name, {})
            ex_counts[name][p] = ex_counts[name].get(p, 0) + 1
        pools = _pools(ex_counts)
        _pack_two_tiers(gpus, pools, placed_tier2, ha)
        if any(pools.values()):
            # Proportional: one replica at a time to the least-served model.
            _restore(gpus, snap2)
            placed_tier2.clear()
            placed_tier2 |= t2
            for _f, name, p in extras:
                one = {p: deque([name])}
                _pack_two_tiers(gpus, one, placed_tier2, ha)
    # Whatever did not fit with the chosen profiles: the models' other profiles,
    # one replica at a time to the least-served model of the highest priority.
    for level in levels:
        _refill([m for m in work.values() if m.spec.priority == level], gpus, placed_tier2, ha)


def _placed(m: _Model, gpus: list[GpuWork]) -> list[str]:
    return [v[1] for g in gpus for v in g.hard.values() if v[0] == m.spec.name]


def _refill(ms: list[_Model], gpus: list[GpuWork], placed_tier2: set[tuple[str, int]], ha: frozenset[str]) -> None:
    def met(m: _Model) -> float:
        have = sum(m.cap.get(p, 0.0) for p in _placed(m, gpus))
        return have / m.demand if m.demand and m.demand > EPS else math.inf

    active = sorted(ms, key=lambda m: m.spec.name)
    while active:
        progress = False
        for m in sorted(active, key=lambda m: (met(m), m.spec.name)):
            profs = _placed(m, gpus)
            need = (m.demand or 0.0) - sum(m.cap.get(p, 0.0) for p in profs)
            room = m.spec.max_replicas - len(profs)
            if (need <= EPS and len(profs) >= m.floor) or room <= 0:
                active.remove(m)
                continue
            index = Index(gpus)
            opts = [o for o in m.options if index.find(o.name, used_only=False) is not None]
            if not opts:
                active.remove(m)
                continue
            mix = cover(need, opts, max(0, m.floor - len(profs)), room)
            first = next((o.name for o in opts if o.name in mix), None)
            if first is None:
                active.remove(m)
                continue
            pools = {first: deque([m.spec.name])}
            _pack_two_tiers(gpus, pools, placed_tier2, ha)
            if pools[first]:
                active.remove(m)
            else:
                progress = True
            break  # re-rank after every replica
        if not progress and active:
            continue


def _fix_high_availability(work: dict[str, _Model], gpus: list[GpuWork],
                           removed: dict[str, Reason]) -> set[tuple[str, int]]:
    """>= 2 replicas on distinct GPUs for every HA model: swap new replicas, else move one."""
    moved: set[tuple[str, int]] = set()
    for m in sorted(work.values(), key=lambda m: m.spec.name):
        if not m.spec.high_availability:
            continue
        where = [(g, s, v) for g in gpus for s, v in g.hard.items() if v[0] == m.spec.name]
        if len(where) < 2 or len({g.id for g, _, _ in where}) >= 2:
            continue
        g0 = where[0][0]
        done = False
        # a) swap a new replica with a same-profile new replica of another model elsewhere
        for g, s, v in where:
            if v[2] is not None:
                continue
            for h in gpus:
                if h is g0 or done:
                    continue
                for s2, v2 in h.hard.items():
                    other = work.get(v2[0])
                    if v2[1] != v[1] or v2[2] is not None or v2[0] == m.spec.name:
                        continue
                    if other is not None and other.spec.high_availability and _hosts(g0, v2[0]):
                        continue
                    g.hard[s] = (v2[0], v[1], None)
                    h.hard[s2] = (m.spec.name, v[1], None)
                    done = True
                    break
            if done:
                break
        if done:
            continue
        # b) place one more replica of the same profile on another GPU, drop one here
        g, s, v = next(((g, s, v) for g, s, v in where if v[2] is None), where[0])
        index = Index([h for h in gpus if h is not g0])
        got = index.find(v[1], used_only=False)
        if got is None:
            m.why(Reason.SHORTFALL)
            continue
        h, start, destroyed = got
        h.place(m.spec.name, v[1], start, destroyed)
        moved.add((h.id, start))
        del g0.hard[s]
        if v[2] is not None:
            g0.blocked[s] = Placement(s, v[1])
            m.keep = [r for r in m.keep if r.id != v[2]]
            removed[v[2]] = Reason.HIGH_AVAILABILITY
        else:
            g0.soft.add(Placement(s, v[1]))
        m.why(Reason.HIGH_AVAILABILITY)
    return moved


def _hosts(g: GpuWork, model: str) -> bool:
    return any(v[0] == model for v in g.hard.values())


def _consolidate(work: dict[str, _Model], gpus: list[GpuWork], removed: dict[str, Reason]) -> set[tuple[str, int]]:
    """Empty lightly used GPUs whose replicas all fit in free space elsewhere."""
    moved: set[tuple[str, int]] = set()
    used = [g for g in gpus if g.hard and g.whole is None]
    if len(used) < 2:
        return moved
    index = Index(gpus)
    free_total = sum(g.product.compute_slices - g.used_compute() for g in used)
    tries = 0
    for g in sorted(used, key=lambda g: (g.used_compute(), -g.order)):
        if tries >= CONSOLIDATE_TRIES:
            break
        need = g.used_compute()
        if need > free_total - (g.product.compute_slices - need):
            break  # sorted by load: no later GPU can fit either
        tries += 1
        index.remove(g)
        touched: dict[str, tuple] = {}
        plan_moves: list[tuple[GpuWork, int]] = []
        ok = True
        items = sorted(g.hard.items(), key=lambda kv: (-g.product.profiles[kv[1][1]].compute, kv[0]))
        for s, (model, prof, rid) in items:
            m = work.get(model)
            avoid = model if (m is not None and m.spec.high_availability) else None
            got = index.find(prof, used_only=True, exclude={g.id}, avoid_model=avoid)
            if got is None:
                ok = False
                break
            h, start, destroyed = got
            if h.id not in touched:
                touched[h.id] = (dict(h.hard), dict(h.blocked), set(h.soft))
            index.remove(h)
            h.place(model, prof, start, destroyed)
            index.add(h)
            plan_moves.append((h, start))
        if not ok:
            for h in gpus:
                if h.id in touched:
                    index.remove(h)
                    h.hard, h.blocked, h.soft = touched[h.id]
                    index.add(h)
            index.add(g)
            continue
        for s, (model, prof, rid) in items:
            if rid is not None:
                g.blocked[s] = Placement(s, prof)
                removed[rid] = Reason.CONSOLIDATE
                m = work.get(model)
                if m is not None:
                    m.keep = [r for r in m.keep if r.id != rid]
                    m.why(Reason.CONSOLIDATE)
            else:
                g.soft.add(Placement(s, prof))
        g.hard = {}
        for h, start in plan_moves:
            moved.add((h.id, start))
        free_total -= g.product.compute_slices
        index.add(g)
    return moved
