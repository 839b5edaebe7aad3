"""Planner step 3: the ``Plan`` value -- the full target, the selection this call makes, ids, cost.

Pure; used by ``planner.plan``. ``finish`` takes what the placement steps
left on each GPU, lets the churn budget choose what goes this call
(``budget.py``), orders it make-before-break (``order.py``), names the new
replicas, and counts the cost. A delete that ``order`` cannot place (its
model would serve less than its demand while a kept replica is still starting)
waits, and so does the rest of a replacement it belongs to
(``budget.withdraw_replacement``): a copy without the delete it pairs with is
scaled down by the next plan and made again by the one after. What needed the
deferred replica's room waits too (``budget.settle``), until the selection is
whole again. Also ``apply_plan_to_cluster``: the cluster a
plan leaves behind (new replicas READY), used by tests, the simulator and the
recording fakes.

``Plan.desired`` is the full target; ``assignments`` / ``layouts`` are what
this call's actions leave behind (deferred changes excluded), so
``apply_plan_to_cluster(cluster, plan)`` matches them exactly. ``Cost``
counts MIG instances created / destroyed by the REPARTITIONs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from autoscaler.policy.planner.budget import Create, apply_selection, select, settle, withdraw_replacement
from autoscaler.policy.planner.multinode import WHOLE, Groups, group_of
from autoscaler.policy.planner.order import final_layout, finalize_actions, order
from autoscaler.policy.planner.work import HEALTHY
from autoscaler.policy.types import (
    ActionKind,
    Assignment,
    ClusterState,
    Cost,
    ModelSpec,
    Plan,
    Reason,
    Replica,
    ReplicaState,
)

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.packing import GpuWork


def finish(*, now_s: float, cluster: ClusterState, gpus: list[GpuWork], work: dict, groups: Groups,
           removed: dict[str, Reason], placed_tier2: set, moved: set, churn_budget: int | None,
           demand_rps: Mapping[str, float], specs: Mapping[str, ModelSpec], fast_first: bool = True) -> Plan:
    """The ``Plan`` for what placement left on ``gpus``: the churn budget's selection, in
    order, with ids, assignments, layouts, shortfalls, reasons and cost."""
    by_id = {g.id: g for g in gpus}
    replicas = {r.id: r for r in cluster.replicas}
    # ---- the full target
    creates: list[Create] = []
    for g in gpus:
        for s, (model, prof, rid) in sorted(g.hard.items()):
            if rid is None:
                reason = Reason.CONSOLIDATE if (g.id, s) in moved else work[model].create_reason
                if (g.id, s) in moved and work[model].spec.high_availability and Reason.HIGH_AVAILABILITY in work[model].reasons:
                    reason = Reason.HIGH_AVAILABILITY
                creates.append(Create(model, prof, g.id, s, reason, (g.id, s) in placed_tier2, None, len(creates)))
    for model, gid, members in groups.new:
        for i, gpu in enumerate(members):
            c = Create(model, WHOLE, gpu, 0, Reason.SCALE_UP_DEMAND, False, gid, len(creates))
            c.rid = f"{gid}-{i}"
            creates.append(c)
    full_cap: dict[str, float] = {}
    desired: dict[tuple[str, str], int] = {}
    for g in gpus:
        for model, prof, _rid in g.hard.values():
            desired[(model, prof)] = desired.get((model, prof), 0) + 1
            full_cap[model] = full_cap.get(model, 0.0) + work[model].cap.get(prof, 0.0)
    for model, gids in groups.kept.items():
        n = len(gids) + sum(1 for m, _, _ in groups.new if m == model)
        if n:
            desired[(model, WHOLE)] = n
        full_cap[model] = full_cap.get(model, 0.0) + n * groups.gcap[model]

    # ---- churn budget
    removed = {rid: why for rid, why in removed.items() if rid in replicas}
    sel_c, sel_d, deferred_models = select(creates, removed, replicas, by_id, churn_budget, work, demand_rps, full_cap,
                                           fast_first)
    chosen = set(sel_c)
    reasons: dict[str, list[Reason]] = {n: list(m.reasons) for n, m in work.items()}
    for n, rs in groups.reasons.items():
        reasons[n] = list(rs)
    caps = {n: sp.capacity for n, sp in specs.items()}
    # What each model must keep serving while the plan runs (``order``'s drain floor):
    # its demand; unbounded when unknown, so only capacity before and after bound it.
    keep_rps: dict[str, float] = {}
    for name in specs:
        d = demand_rps.get(name)
        m = work.get(name)
        if d is None and m is not None and m.demand is not None:
            d = m.demand
        keep_rps[name] = max(0.0, float(d)) if d is not None else math.inf
    converging: set[str] = set()
    # models with a replica still starting that the plan keeps: a drain stuck on one waits for it
    starting = {r.model for r in replicas.values() if r.state is ReplicaState.STARTING and r.id not in removed}
    while True:
        apply_selection(gpus, by_id, creates, sel_c, removed, sel_d, replicas, groups)
        actions, stuck = order(gpus, by_id, creates, sel_c, removed, sel_d, replicas, cluster, caps, keep_rps)
        if not stuck:
            break
        for c in stuck[0]:
            sel_c.discard(c.order)
            deferred_models.add(c.model)
        for rid in stuck[1]:
            sel_d.discard(rid)
            model = replicas[rid].model
            (converging if model in starting else deferred_models).add(model)
            withdraw_replacement(rid, creates, removed, replicas, sel_c, sel_d)
        deferred_models |= settle(creates, removed, replicas, by_id, chosen, sel_c, sel_d)
    for n in deferred_models:
        _add_reason(reasons, n, Reason.CHURN_BUDGET)
    for n in converging - deferred_models:
        _add_reason(reasons, n, Reason.HOLD_CONVERGING)

    # ---- ids, assignments, layouts
    taken = {r.id for r in cluster.replicas}
    counters: dict[str, int] = {}
    for c in creates:
        if c.order in sel_c and c.rid is None:
            k = counters.get(c.model, 0)
            while f"{c.model}-{k}" in taken:
                k += 1
            c.rid = f"{c.model}-{k}"
            taken.add(c.rid)
            counters[c.model] = k + 1
    actions = finalize_actions(actions, creates)
    assignments: list[Assignment] = []
    final_cap: dict[str, float] = {}
    for g in gpus:
        for s, (model, prof, rid) in sorted(g.hard.items()):
            assignments.append(Assignment(model, prof, g.id, s, rid))
            spec = specs.get(model)
            cap = float(spec.capacity.get(prof, 0.0)) if spec else 0.0
            final_cap[model] = final_cap.get(model, 0.0) + cap
    kept_whole = [r for r in cluster.replicas if r.profile == WHOLE and r.id not in sel_d and r.id in replicas
                  and specs.get(r.model) is not None and r.state in HEALTHY]
    for r in kept_whole:
        assignments.append(Assignment(r.model, WHOLE, r.gpu, 0, r.id))
    for c in creates:
        if c.group is not None and c.order in sel_c:
            assignments.append(Assignment(c.model, WHOLE, c.gpu, 0, None))
    seen_groups: set[str] = set()
    for a in assignments:
        if a.profile == WHOLE:
            gid = group_of(a.replica) if a.replica else next(
                c.group for c in creates if c.gpu == a.gpu and c.group is not None)
            if gid not in seen_groups:
                seen_groups.add(gid)
                final_cap[a.model] = final_cap.get(a.model, 0.0) + groups.gcap.get(a.model, 0.0)
    layouts = {g.id: final_layout(g) for g in gpus}
    for a in assignments:
        if a.profile == WHOLE:
            layouts[a.gpu] = ()

    # ---- shortfall, reasons, cost
    shortfall: dict[str, float] = {}
    target: dict[str, float] = {}
    per_model: dict[str, int] = {}
    for (m, _p), c in desired.items():
        per_model[m] = per_model.get(m, 0) + c
    for name, spec in specs.items():
        d = demand_rps.get(name)
        if d is None:
            m = work.get(name)
            d = m.demand if m is not None and m.demand is not None else full_cap.get(name, 0.0)
        d = max(0.0, float(d))
        target[name] = d
        gap = d - full_cap.get(name, 0.0)
        if gap > 1e-9:
            shortfall[name] = gap
        # A floor (min_replicas, 2 for HA) the cluster cannot hold is a shortfall too.
        n = per_model.get(name, 0)
        floor = min(max(spec.min_replicas, 2 if spec.high_availability else 0), spec.max_replicas)
        if gap > 1e-9 or n < floor:
            _add_reason(reasons, name, Reason.SHORTFALL)
    for name in specs:
        rs = reasons.setdefault(name, [])
        if not rs:
            rs.append(Reason.KEEP)
    used = {a.gpu for a in assignments}
    slices = 0
    for a in assignments:
        g = by_id[a.gpu]
        slices += g.product.compute_slices if a.profile == WHOLE else g.product.profiles[a.profile].compute
    created = destroyed = 0
    for act in actions:
        if act.kind is ActionKind.REPARTITION:
            g = by_id[act.gpu]
            before, after = set(g.current), set(act.layout or ())
            created += len(after - before)
            destroyed += len(before - after)
    cost = Cost(
        gpus_used=len(used),
        slices_used=slices,
        instances_created=created,
        instances_destroyed=destroyed,
        gpus_repartitioned=sum(1 for a in actions if a.kind is ActionKind.REPARTITION),
    )
    return Plan(
        t_s=now_s,
        desired=dict(sorted(desired.items())),
        assignments=tuple(assignments),
        layouts=layouts,
        actions=tuple(actions),
        shortfall=shortfall,
        cost=cost,
        reasons={n: tuple(rs) for n, rs in sorted(reasons.items())},
        capacity_rps={n: final_cap.get(n, 0.0) for n in specs},
        target_rps=target,
    )


def _add_reason(reasons: dict[str, list[Reason]], model: str, why: Reason) -> None:
    rs = reasons.setdefault(model, [])
    if why not in rs:
        rs.append(why)


# ---------------------------------------------------------------- simulation


def apply_plan_to_cluster(cluster: ClusterState, plan: Plan) -> ClusterState:
    """The cluster after ``plan``'s actions all succeeded (new replicas READY)."""
    gone = {a.replica for a in plan.actions if a.kind is ActionKind.DELETE}
    reps = [r for r in cluster.replicas if r.id not in gone]
    for a in plan.actions:
        if a.kind is ActionKind.CREATE:
            reps.append(Replica(a.replica or "", a.model or "", a.profile or "", a.gpu or "", a.start or 0,
                                ReplicaState.READY, plan.t_s))
    gpus = []
    parts = {a.gpu: a for a in plan.actions if a.kind is ActionKind.REPARTITION}
    for g in cluster.gpus:
        a = parts.get(g.id)
        if a is not None:
            if a.profile == WHOLE:
                g = replace(g, layout=(), mig_enabled=False, reserved_by=a.model)
            else:
                g = replace(g, layout=tuple(a.layout or ()), mig_enabled=True, reserved_by=None)
        if not g.mig_enabled and g.reserved_by is not None and not any(r.gpu == g.id for r in reps):
            g = replace(g, reserved_by=None)
        gpus.append(g)
    return ClusterState(gpus=tuple(gpus), replicas=tuple(reps))
