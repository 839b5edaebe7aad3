"""Planner step 3: churn budget, action order, layouts, the ``Plan`` value.

Pure; used by ``planner.plan``. Also ``apply_plan_to_cluster``: the cluster a
plan leaves behind (new replicas READY), used by tests, the simulator and the
recording fakes.

Action order (make-before-break), in waves until everything is emitted:
REPARTITION of GPUs whose removed instances are empty by now -> CREATE ->
DRAIN + DELETE of replicas of models with no new replica pending; only when
nothing else can go, WAIT_READY of the pending new replicas, which lets their
models' own removals follow (a WAIT_READY holds back the rest of its chain, so
it comes no earlier than something needs it). A serving replica is drained
only while its model keeps at least min(capacity before, capacity after,
target) req/s from ready replicas (a replica still STARTING counts after,
never before: a drain that waits for it is deferred with
``Reason.HOLD_CONVERGING`` until a later tick finds it ready); a REPARTITION
waits for the DELETE of every replica on an instance it destroys; a CREATE
on a new or occupied instance waits for its GPU's REPARTITION or the DELETE
of the replica there. What can never become ready (a model's new replica
needs the space its own old replica still serves from, and dropping that one
first would break the floor) is deferred with ``Reason.CHURN_BUDGET`` rather
than dropping capacity.

Churn budget: CREATE + DELETE actions per call that stop or move something
that runs. A scale-up CREATE that needs no DELETE to make room is not churn
and is not counted (its REPARTITION, if any, only cuts instances that are
empty): it disturbs nothing that serves, the HPA behavior already bounds how
fast a model grows, and holding it back only delays capacity a model is
short of. Worked number: a flash crowd taking one model from 3 to 14
replicas under a budget of 4 would start 4 a tick over three 15 s ticks, the
last ones 30 s after the first -- on top of a 30 s start, with every request
meanwhile queueing. Filled in this order: new
capacity by priority (with the deletes its space depends on), clean-up and
scale-down deletes, consolidation moves, other replacements -- each of the
last two all or nothing per model: a copy without its delete is churn for
nothing, and the next tick would scale the copy down again. Multinode
groups (``planner.multinode``): one CREATE per member GPU, the whole group
selected or deferred together.

``Plan.desired`` is the full target; ``assignments`` / ``layouts`` are what
this call's actions leave behind (deferred changes excluded), so
``apply_plan_to_cluster(cluster, plan)`` matches them exactly. ``Cost``
counts MIG instances created / destroyed by the REPARTITIONs.

Size: ~600 lines, over the house limit of ~450, because the churn budget is
filled in one ordered pass whose stages (new capacity, clean-up, consolidation,
replacements) share the budget and the chains they link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement, check_layout
from autoscaler.mig.products import Product
from autoscaler.policy.types import (
    Action,
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

from autoscaler.policy.planner.multinode import WHOLE, Groups, group_of
from autoscaler.policy.planner.work import HEALTHY

# Deletes that replace capacity: they wait until the model's new replicas are ready.
REPLACING = (Reason.PROFILE_EFFICIENCY, Reason.CONSOLIDATE, Reason.HIGH_AVAILABILITY)


# ---------------------------------------------------------------- finishing the plan


class _Create:
    __slots__ = ("gpu", "group", "model", "order", "profile", "reason", "rid", "start", "tier2")

    def __init__(self, model: str, profile: str, gpu: str, start: int, reason: Reason, tier2: bool,
                 group: str | None, order: int) -> None:
        self.model, self.profile, self.gpu, self.start = model, profile, gpu, start
        self.reason, self.tier2, self.group, self.order = reason, tier2, group, order
        self.rid: str | None = None


def finish(*, now_s: float, cluster: ClusterState, gpus: list[GpuWork], work: dict, groups: Groups,
           removed: dict[str, Reason], placed_tier2: set, moved: set, churn_budget: int | None,
           demand_rps: Mapping[str, float], specs: Mapping[str, ModelSpec], fast_first: bool = True) -> Plan:
    by_id = {g.id: g for g in gpus}
    replicas = {r.id: r for r in cluster.replicas}
    # ---- the full target
    creates: list[_Create] = []
    for g in gpus:
        for s, (model, prof, rid) in sorted(g.hard.items()):
            if rid is None:
                reason = Reason.CONSOLIDATE if (g.id, s) in moved else work[model].create_reason
                if (g.id, s) in moved and work[model].spec.high_availability and Reason.HIGH_AVAILABILITY in work[model].reasons:
                    reason = Reason.HIGH_AVAILABILITY
                creates.append(_Create(model, prof, g.id, s, reason, (g.id, s) in placed_tier2, None, len(creates)))
    for model, gid, members in groups.new:
        for i, gpu in enumerate(members):
            c = _Create(model, WHOLE, gpu, 0, Reason.SCALE_UP_DEMAND, False, gid, len(creates))
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
    sel_c, sel_d, deferred_models = _select(creates, removed, replicas, by_id, churn_budget, work, demand_rps, full_cap,
                                            fast_first)
    reasons: dict[str, list[Reason]] = {n: list(m.reasons) for n, m in work.items()}
    for n, rs in groups.reasons.items():
        reasons[n] = list(rs)
    caps = {n: sp.capacity for n, sp in specs.items()}
    target: dict[str, float] = {}
    for name in specs:
        d = demand_rps.get(name)
        m = work.get(name)
        if d is None and m is not None and m.demand is not None:
            d = m.demand
        target[name] = max(0.0, float(d)) if d is not None else math.inf
    converging: set[str] = set()
    # models with a replica still starting that the plan keeps: a drain stuck on one waits for it
    starting = {r.model for r in replicas.values() if r.state is ReplicaState.STARTING and r.id not in removed}
    while True:
        _apply_selection(gpus, by_id, creates, sel_c, removed, sel_d, replicas, groups)
        actions, stuck = _order(gpus, by_id, creates, sel_c, removed, sel_d, replicas, cluster, caps, target)
        if not stuck:
            break
        for c in stuck[0]:
            sel_c.discard(c.order)
            deferred_models.add(c.model)
        for rid in stuck[1]:
            sel_d.discard(rid)
            model = replicas[rid].model
            (converging if model in starting else deferred_models).add(model)
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
    actions = _finalize_actions(actions, creates)
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
    layouts = {g.id: _final_layout(g) for g in gpus}
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


def _select(creates: list[_Create], removed: dict[str, Reason], replicas: dict[str, Replica],
            by_id: dict[str, GpuWork], budget: int | None, work: dict, demand_rps: Mapping[str, float],
            full_cap: dict[str, float], fast_first: bool = True) -> tuple[set[int], set[str], set[str]]:
    """Which creates / deletes happen this tick (all of them without a budget)."""
    if budget is None:
        return {c.order for c in creates}, set(removed), set()
    by_model_c: dict[str, list[_Create]] = {}
    for c in creates:
        by_model_c.setdefault(c.model, []).append(c)
    on_gpu: dict[str, list[str]] = {}
    for rid in removed:
        on_gpu.setdefault(replicas[rid].gpu, []).append(rid)
    sel_c: set[int] = set()
    sel_d: set[str] = set()
    left = max(0, budget)

    def needs(rid: str) -> bool:  # a replacement delete waits for all its model's creates
        return removed[rid] in REPLACING and any(c.order not in sel_c for c in by_model_c.get(replicas[rid].model, []))

    def take_create(unit: list[_Create], along: Sequence[str] = ()) -> None:
        nonlocal left
        deps: set[str] = {d for d in along if d not in sel_d}
        for c in unit:
            if c.tier2:
                deps |= {d for d in on_gpu.get(c.gpu, []) if d not in sel_d}
            else:
                deps |= {d for d in on_gpu.get(c.gpu, []) if d not in sel_d and _overlap(by_id[c.gpu], c, replicas[d])}
        if any(removed[d] in REPLACING and replicas[d].model not in {c.model for c in unit} and d not in along
               for d in deps):
            return
        if not deps and not along and all(_growth(c) for c in unit):
            sel_c.update(c.order for c in unit)  # not churn: see the module docstring
            return
        cost = len(unit) + len(deps)
        if cost > left:
            return
        left -= cost
        sel_c.update(c.order for c in unit)
        sel_d.update(deps)

    def take_delete(rid: str) -> None:
        nonlocal left
        if rid in sel_d or left < 1 or needs(rid):
            return
        group = [rid]
        if replicas[rid].profile == WHOLE:
            group = [r for r in removed if group_of(r) == group_of(rid) and replicas[r].model == replicas[rid].model]
        if len(group) > left:
            return
        left -= len(group)
        sel_d.update(group)

    def units(cs: list[_Create]) -> list[list[_Create]]:
        out: dict[str, list[_Create]] = {}
        for c in cs:
            out.setdefault(c.group or f"#{c.order}", []).append(c)
        return list(out.values())

    prio = {n: m.spec.priority for n, m in work.items()}
    growth = [c for c in creates if c.reason not in REPLACING]
    # Capacity that serves soonest first: a create on an instance that exists now
    # is ready in a start delay, one behind a repartition minutes later.
    growth.sort(key=lambda c: (-prio.get(c.model, 0), c.reason is Reason.PROFILE_EFFICIENCY,
                               fast_first and _needs_cut(by_id[c.gpu], c), c.order))
    for u in units(growth):
        take_create(u)
    for rid in sorted(removed, key=lambda r: (removed[r] in REPLACING, r)):
        if removed[rid] not in REPLACING:
            take_delete(rid)
    # A move or a replacement is all or nothing per model: copies made without
    # deleting what they replace are churn for nothing -- the next tick finds the
    # model over its demand and scales the copies down again, and the tick after
    # starts the replacement over (a loop, one start delay per turn).
    for kind in ("move", "replace"):
        for model in sorted({c.model for c in creates if _replacement(c.reason) == kind}):
            cs = [c for c in creates if c.model == model and _replacement(c.reason) == kind]
            ds = sorted(r for r in removed if _replacement(removed[r]) == kind and replicas[r].model == model)
            take_create(cs, ds)
    for rid in sorted(removed):
        take_delete(rid)
    deferred = {c.model for c in creates if c.order not in sel_c}
    deferred |= {replicas[r].model for r in removed if r not in sel_d}
    return sel_c, sel_d, deferred


def _replacement(why: Reason) -> str | None:
    """"move" for a consolidation move, "replace" for any other replacement, else None."""
    if why is Reason.CONSOLIDATE:
        return "move"
    return "replace" if why in REPLACING else None


def _add_reason(reasons: dict[str, list[Reason]], model: str, why: Reason) -> None:
    rs = reasons.setdefault(model, [])
    if why not in rs:
        rs.append(why)


def _needs_cut(g: GpuWork, c: _Create) -> bool:
    return c.group is not None or Placement(c.start, c.profile) not in g.current


def _growth(c: _Create) -> bool:
    """A scale-up CREATE (not a replacement or a move): free of the churn budget when it
    deletes nothing."""
    return c.reason not in REPLACING and c.reason is not Reason.CONSOLIDATE


def _overlap(g: GpuWork, c: _Create, r: Replica) -> bool:
    if c.group is not None or r.profile == WHOLE:
        return True
    pc, pr = g.product.profiles[c.profile], g.product.profiles.get(r.profile)
    if pr is None:
        return True
    return c.start < r.start + pr.mem_slots and r.start < c.start + pc.mem_slots


def _apply_selection(gpus: list[GpuWork], by_id: dict[str, GpuWork], creates: list[_Create], sel_c: set[int],
                     removed: dict[str, Reason], sel_d: set[str], replicas: dict[str, Replica], groups: Groups) -> None:
    """Drop deferred creates from the target; put deferred deletes back in it."""
    for c in creates:
        g = by_id[c.gpu]
        if c.order in sel_c:
            continue
        if c.group is None:
            if g.hard.get(c.start, (None, None, "x"))[2] is None and g.hard.get(c.start, ("",))[0] == c.model:
                del g.hard[c.start]
        elif g.whole == c.model and not any(r.gpu == g.id and r.profile == WHOLE and r.model == c.model
                                            and r.id not in removed for r in replicas.values()):
            g.whole = None
    for rid in removed:
        r = replicas[rid]
        g = by_id.get(r.gpu)
        if g is None or r.profile == WHOLE:
            continue
        if rid not in sel_d and r.state in HEALTHY and r.profile in g.product.profiles:
            g.hard[r.start] = (r.model, r.profile, rid)
            g.blocked.pop(r.start, None)


def _final_layout(g: GpuWork) -> tuple[Placement, ...]:
    """Occupied instances, plus every current instance that still fits beside them."""
    if g.whole is not None:
        return ()
    occupied = tuple(sorted(Placement(s, v[1]) for s, v in g.hard.items())) if g.hard else ()
    return _fill_layout(g.product, occupied, g.current)


@lru_cache(maxsize=8192)
def _fill_layout(product: Product, occupied: tuple[Placement, ...], current: tuple[Placement, ...]
                 ) -> tuple[Placement, ...]:
    """``_final_layout``'s work, cached: a fleet repeats the same few GPU states tick after tick."""
    layout = list(occupied)
    for p in sorted(current, key=lambda p: (-product.profiles[p.profile].compute, p.start)):
        if p in layout:
            continue
        if not check_layout(product, layout + [p]):
            layout.append(p)
    return tuple(sorted(layout))


def _order(gpus: list[GpuWork], by_id: dict[str, GpuWork], creates: list[_Create], sel_c: set[int],
           removed: dict[str, Reason], sel_d: set[str], replicas: dict[str, Replica], cluster: ClusterState,
           caps: Mapping[str, Mapping[str, float]], target: Mapping[str, float]
           ) -> tuple[list[Action], tuple[list[_Create], list[str]] | None]:
    mig_on = {g.id: g.mig_enabled for g in cluster.gpus}
    # REPARTITION per GPU whose layout or mode changes.
    repart: dict[str, Action] = {}
    rep_deps: dict[str, set[str]] = {}
    for g in gpus:
        final = _final_layout(g)
        whole = g.whole is not None
        was_whole = not mig_on.get(g.id, True)
        if whole == was_whole and (whole or final == g.current):
            continue
        if was_whole and not whole and not final:
            continue  # a freed whole GPU stays as it is until something needs MIG on it
        if whole:
            act = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=g.id, model=g.whole, profile=WHOLE, layout=())
        else:
            act = Action(ActionKind.REPARTITION, Reason.REPARTITION, gpu=g.id, layout=final)
        repart[g.id] = act
        fs = set(final)
        rep_deps[g.id] = {
            rid for rid in sel_d
            if replicas[rid].gpu == g.id
            and (whole or was_whole or Placement(replicas[rid].start, replicas[rid].profile) not in fs
                 or replicas[rid].state not in HEALTHY)
        }
    c_deps: dict[int, set[str]] = {}
    c_rep: dict[int, str | None] = {}
    for c in creates:
        if c.order not in sel_c:
            continue
        g = by_id[c.gpu]
        pl = Placement(c.start, c.profile)
        if c.gpu in repart and (c.group is not None or pl not in g.current or not mig_on.get(c.gpu, True)):
            c_rep[c.order] = c.gpu
            c_deps[c.order] = set()
        else:
            c_rep[c.order] = None
            c_deps[c.order] = {rid for rid in sel_d if replicas[rid].gpu == c.gpu and _overlap(g, c, replicas[rid])}
    # Make-before-break by capacity: a serving replica is drained only while
    # its model keeps at least min(capacity before, capacity after, target)
    # req/s from replicas that are ready. Worked number: 2 x 7g (279 req/s)
    # becoming 2 x 1g (112) for a target of 106: after one new 1g is ready
    # (335), one 7g may go (195 >= 106); the second waits for the second 1g.
    def rps(model: str, profile: str) -> float:
        return float(caps.get(model, {}).get(profile, 0.0))

    # A replica still STARTING serves nothing yet: it counts toward the capacity
    # after the plan, never toward what serves while the plan runs, so a ready
    # replica it is to replace stays until a later tick finds it ready.
    serving: dict[str, float] = {}
    after: dict[str, float] = {}
    for r in replicas.values():
        if r.profile == WHOLE:
            continue
        if r.state is ReplicaState.READY:
            serving[r.model] = serving.get(r.model, 0.0) + rps(r.model, r.profile)
        if r.state in HEALTHY and r.id not in sel_d:
            after[r.model] = after.get(r.model, 0.0) + rps(r.model, r.profile)
    for c in creates:
        if c.order in sel_c and c.profile != WHOLE:
            after[c.model] = after.get(c.model, 0.0) + rps(c.model, c.profile)
    floor = {m: min(serving.get(m, 0.0), after.get(m, 0.0), target.get(m, 0.0)) for m in set(serving) | set(after)}
    d_deps: dict[str, set[int]] = {rid: set() for rid in sel_d}
    done_c: set[int] = set()
    done_d: set[str] = set()
    done_r: set[str] = set()
    actions: list[Action] = []
    cs = {c.order: c for c in creates}
    # A WAIT_READY holds back everything after it in its chain, and a chain links
    # every action of a model and of a GPU. So each WAIT_READY is emitted only once
    # nothing else can go without it: a model's own removals wait for its new
    # replicas (make-before-break), but another model's scale-down, and a create
    # on the instance it frees, are not queued behind a start -- or behind a
    # repartition, when the new replica's GPU is re-cut. Worked case: a model adds
    # a 3g on a GPU being re-cut (180 s) and a 3g where another model scales down;
    # the second no longer waits the 180 s, and the model is not held busy (no new
    # plan for it) all that time.
    unwaited: list[int] = []

    def wait_ready(orders: list[int]) -> None:
        for o in orders:
            c = cs[o]
            actions.append(Action(ActionKind.WAIT_READY, c.reason, gpu=c.gpu, model=c.model, profile=c.profile,
                                  start=c.start, replica=str(o)))
            if c.profile != WHOLE:
                serving[c.model] = serving.get(c.model, 0.0) + rps(c.model, c.profile)

    while True:
        progress = False
        for gid in sorted(repart):
            if gid not in done_r and rep_deps[gid] <= done_d:
                actions.append(repart[gid])
                done_r.add(gid)
                progress = True
        wave = [o for o in sorted(c_deps) if o not in done_c and c_deps[o] <= done_d
                and (c_rep[o] is None or c_rep[o] in done_r)]
        for o in wave:
            c = cs[o]
            actions.append(Action(ActionKind.CREATE, c.reason, gpu=c.gpu, model=c.model, profile=c.profile,
                                  start=c.start, replica=str(o)))
            done_c.add(o)
            unwaited.append(o)
            progress = True
        dw = []
        pending_models = {cs[o].model for o in unwaited}  # a new replica created, not yet waited for
        for rid in sorted(d_deps):
            if rid in done_d:
                continue
            r = replicas[rid]
            if r.model in pending_models:
                continue  # make-before-break: a model's own removals wait for its new replicas
            c = rps(r.model, r.profile) if r.state is ReplicaState.READY and r.profile != WHOLE else 0.0
            if c and serving.get(r.model, 0.0) - c < floor.get(r.model, 0.0) - 1e-9:
                continue
            serving[r.model] = serving.get(r.model, 0.0) - c
            dw.append(rid)
        for rid in dw:
            r = replicas[rid]
            if r.state in HEALTHY:
                actions.append(Action(ActionKind.DRAIN, removed[rid], gpu=r.gpu, model=r.model, profile=r.profile,
                                      start=r.start, replica=rid))
        for rid in dw:
            r = replicas[rid]
            actions.append(Action(ActionKind.DELETE, removed[rid], gpu=r.gpu, model=r.model, profile=r.profile,
                                  start=r.start, replica=rid))
            done_d.add(rid)
            progress = True
        if len(done_c) == len(c_deps) and len(done_d) == len(d_deps) and len(done_r) == len(repart):
            wait_ready(unwaited)
            return actions, None
        if not progress and unwaited:
            wait_ready(unwaited)  # what is left needs the new replicas serving
            unwaited, progress = [], True
        if not progress:
            stuck_c = [cs[o] for o in c_deps if o not in done_c]
            stuck_d = [rid for rid in d_deps if rid not in done_d]
            return actions, (stuck_c, stuck_d)


def _finalize_actions(actions: list[Action], creates: list[_Create]) -> list[Action]:
    """Replace the provisional create keys with the new replica ids."""
    cs = {str(c.order): c for c in creates}
    out = []
    for a in actions:
        if a.kind in (ActionKind.CREATE, ActionKind.WAIT_READY) and a.replica in cs:
            a = replace(a, replica=cs[a.replica].rid)
        out.append(a)
    return out


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
