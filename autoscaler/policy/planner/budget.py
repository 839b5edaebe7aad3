"""Planner step 3a: the churn budget -- which CREATEs and DELETEs go this call.

Pure; used by ``actions.finish``. Its input is the full target the placement
steps left on each ``GpuWork`` (every new replica a ``Create``, every removal a
reason); its output is the selection, after which ``apply_selection`` drops
the deferred creates from the target and puts the deferred deletes back.

Churn budget: CREATE + DELETE actions per call that stop or move something
that runs. The DELETE of a replica that serves nothing (failed, crash-looping)
is not churn, and a scale-up CREATE that needs no DELETE to make room, or only
such a one, is not churn either and is not counted (its REPARTITION, if any,
only cuts instances that are empty or dead): it disturbs nothing that serves
(so crash-looping replicas are replaced at once, however many failed together),
the HPA behavior already bounds how fast a model grows, and holding it back
only delays capacity a model is short of. Worked number: a flash crowd taking one model from 3 to 14
replicas under a budget of 4 would start 4 a tick over three 15 s ticks, the
last ones 30 s after the first -- on top of a 30 s start, with every request
meanwhile queueing. Filled in this order: new
capacity by priority (with the deletes its space depends on), clean-up and
scale-down deletes, then replacements: the models with a consolidation move
first, each model's moves and other replacements one unit, all or nothing: a
copy without its delete is churn for nothing, and the next tick would scale the
copy down again. Multinode
groups (``planner.multinode``): one CREATE or DELETE per member GPU, the whole
group selected or deferred together, also where a create needs the GPU of one
member (half a group holds its other GPUs and serves nothing).

A model short of its demand whose new mix replaces its old one (a
rebalance, ``Reason.PROFILE_EFFICIENCY``) still grows when the whole
replacement does not fit the budget: its creates that need no delete go,
free of the budget as any scale-up and named one (``SCALE_UP_DEMAND``), until
what runs plus them covers the demand; the replacement waits for a budget it
fits. Worked number: a model
at 900 req/s on 4g, 3g, 3g and two 1g replicas, asked for 1,800, whose fresh
mix is ten 1g replicas: the replacement is 8 creates + 3 deletes, which a
budget of 4 never admits, so without this it stayed at 900 req/s for 42
minutes of a simulated day (onoff, held-out seed 6, node-scope cuts); with
it, five 1g replicas start on an empty GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement
from autoscaler.policy.planner.multinode import WHOLE, Groups, group_of
from autoscaler.policy.planner.work import HEALTHY
from autoscaler.policy.types import Reason, Replica, ReplicaState

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.packing import GpuWork

# Deletes that replace capacity: they wait until the model's new replicas are ready.
REPLACING = (Reason.PROFILE_EFFICIENCY, Reason.CONSOLIDATE, Reason.HIGH_AVAILABILITY)
# Replicas that serve nothing: their delete stops nothing that runs.
DEAD = (ReplicaState.FAILED, ReplicaState.CRASHLOOP)


class Create:
    """One new replica of the full target: where, why, and its key in this call's order
    (``rid`` is named once it is selected; a multinode member's at once)."""

    __slots__ = ("gpu", "group", "model", "order", "profile", "reason", "rid", "start", "tier2")

    def __init__(self, model: str, profile: str, gpu: str, start: int, reason: Reason, tier2: bool,
                 group: str | None, order: int) -> None:
        self.model, self.profile, self.gpu, self.start = model, profile, gpu, start
        self.reason, self.tier2, self.group, self.order = reason, tier2, group, order
        self.rid: str | None = None


def select(creates: list[Create], removed: dict[str, Reason], replicas: dict[str, Replica],
           by_id: dict[str, GpuWork], budget: int | None, work: dict, demand_rps: Mapping[str, float],
           full_cap: dict[str, float], fast_first: bool = True) -> tuple[set[int], set[str], set[str]]:
    """Which creates / deletes happen this tick (all of them without a budget)."""
    if budget is None:
        return {c.order for c in creates}, set(removed), set()
    by_model_c: dict[str, list[Create]] = {}
    for c in creates:
        by_model_c.setdefault(c.model, []).append(c)
    on_gpu: dict[str, list[str]] = {}
    for rid in removed:
        on_gpu.setdefault(replicas[rid].gpu, []).append(rid)
    sel_c: set[int] = set()
    sel_d: set[str] = set()
    left = max(0, budget)

    def serves(rid: str) -> bool:  # a failed or crash-looping replica serves nothing: its delete is no churn
        return replicas[rid].state not in DEAD

    def needs(rid: str) -> bool:  # a replacement delete waits for all its model's creates
        return removed[rid] in REPLACING and any(c.order not in sel_c for c in by_model_c.get(replicas[rid].model, []))

    def deps_of(c: Create) -> set[str]:  # the deletes a create needs first (room on its GPU)
        if c.tier2:
            return {d for d in on_gpu.get(c.gpu, []) if d not in sel_d}
        return {d for d in on_gpu.get(c.gpu, []) if d not in sel_d and overlap(by_id[c.gpu], c, replicas[d])}

    def take_create(unit: list[Create], along: Sequence[str] = ()) -> None:
        nonlocal left
        deps: set[str] = {d for d in along if d not in sel_d}
        for c in unit:
            deps |= deps_of(c)
        deps |= {r for d in deps if replicas[d].profile == WHOLE for r in members(d)} - sel_d
        if any(removed[d] in REPLACING and replicas[d].model not in {c.model for c in unit} and d not in along
               for d in deps):
            return
        if not along and all(_growth(c) for c in unit) and not any(serves(d) for d in deps):
            sel_c.update(c.order for c in unit)  # not churn: see the module docstring
            sel_d.update(deps)
            return
        cost = len(unit) + sum(1 for d in deps if serves(d))
        if cost > left:
            return
        left -= cost
        sel_c.update(c.order for c in unit)
        sel_d.update(deps)

    def grow_short(model: str, cs: list[Create]) -> None:
        """A deferred replacement's creates that need no delete, as growth, up to the demand."""
        m = work.get(model)
        if m is None or m.demand is None:
            return
        short = m.demand - sum(m.cap.get(r.profile, 0.0) for r in replicas.values()
                               if r.model == model and r.state in HEALTHY)
        for c in sorted(cs, key=lambda c: (fast_first and needs_cut(by_id[c.gpu], c), c.order)):
            if short <= 0:
                return
            if c.order in sel_c or c.group is not None or deps_of(c):
                continue
            c.reason = Reason.SCALE_UP_DEMAND  # growth now, whatever the replacement it came with
            sel_c.add(c.order)
            short -= m.cap.get(c.profile, 0.0)

    def members(rid: str) -> list[str]:  # a multinode group goes whole: every member GPU of it
        return [r for r in removed if group_of(r) == group_of(rid) and replicas[r].model == replicas[rid].model]

    def take_delete(rid: str) -> None:
        nonlocal left
        if rid in sel_d or needs(rid):
            return
        group = members(rid) if replicas[rid].profile == WHOLE else [rid]
        cost = sum(1 for r in group if serves(r))
        if cost > left:
            return
        left -= cost
        sel_d.update(group)

    def units(cs: list[Create]) -> list[list[Create]]:
        out: dict[str, list[Create]] = {}
        for c in cs:
            out.setdefault(c.group or f"#{c.order}", []).append(c)
        return list(out.values())

    prio = {n: m.spec.priority for n, m in work.items()}
    growth = [c for c in creates if c.reason not in REPLACING]
    # Capacity that serves soonest first: a create on an instance that exists now
    # is ready in a start delay, one behind a repartition minutes later.
    growth.sort(key=lambda c: (-prio.get(c.model, 0), c.reason is Reason.PROFILE_EFFICIENCY,
                               fast_first and needs_cut(by_id[c.gpu], c), c.order))
    for u in units(growth):
        take_create(u)
    for rid in sorted(removed, key=lambda r: (removed[r] in REPLACING, r)):
        if removed[rid] not in REPLACING:
            take_delete(rid)
    # A move or a replacement is all or nothing per model: copies made without
    # deleting what they replace are churn for nothing -- the next tick finds the
    # model over its demand and scales the copies down again, and the tick after
    # starts the replacement over (a loop, one start delay per turn).
    # One unit per model, whatever names its parts: a consolidation may move a model's new
    # copy (named a move) while the replica it replaces goes for profile efficiency, and a
    # moved copy of a model that must spread is named for high availability.
    seen: set[str] = set()
    for kind in ("move", "replace"):
        for model in sorted({c.model for c in creates if _replacement(c.reason) == kind} - seen):
            seen.add(model)
            cs = [c for c in creates if c.model == model and _replacement(c.reason) is not None]
            ds = sorted(r for r in removed if _replacement(removed[r]) is not None and replicas[r].model == model)
            take_create(cs, ds)
            if any(c.order not in sel_c for c in cs):
                grow_short(model, [c for c in cs if _replacement(c.reason) == "replace"])
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


def withdraw_replacement(rid: str, creates: Sequence[Create], removed: Mapping[str, Reason],
                         replicas: Mapping[str, Replica], sel_c: set[int], sel_d: set[str]) -> None:
    """``rid``'s delete cannot go this call: if it is part of a replacement, the whole
    replacement (that model's copies and replacing deletes) waits with it, as ``select``
    takes one all or nothing."""
    if _replacement(removed[rid]) is not None:
        _withdraw(replicas[rid].model, creates, removed, replicas, sel_c, sel_d)


def _withdraw(model: str, creates: Sequence[Create], removed: Mapping[str, Reason],
              replicas: Mapping[str, Replica], sel_c: set[int], sel_d: set[str]) -> None:
    sel_c.difference_update(c.order for c in creates if c.model == model and _replacement(c.reason) is not None)
    sel_d.difference_update([d for d in sel_d if replicas[d].model == model and _replacement(removed[d]) is not None])


def settle(creates: Sequence[Create], removed: Mapping[str, Reason], replicas: Mapping[str, Replica],
           by_id: Mapping[str, GpuWork], chosen: set[int], sel_c: set[int], sel_d: set[str]) -> set[str]:
    """Make a selection that lost members since ``select`` chose ``chosen`` whole again;
    the models it defers more of.

    Once ``finish`` defers a delete, a create that needs its room (another model's,
    placed where the deferred replica stays) cannot go either: the GPU would be cut
    for both. Once a replacement's create is deferred, the rest of that replacement
    waits with it (all or nothing, as ``select`` takes it), and its deletes may hold
    room that yet other creates need. So this runs to a fixpoint."""
    deferred: set[str] = set()
    while True:
        held: dict[str, list[Replica]] = {}
        for rid in removed:
            if rid not in sel_d:
                held.setdefault(replicas[rid].gpu, []).append(replicas[rid])
        drop: list[Create] = []
        for c in creates:
            if c.order not in sel_c:
                continue
            stay = held.get(c.gpu, ())
            if stay and (c.tier2 or any(overlap(by_id[c.gpu], c, r) for r in stay)):
                drop.append(c)
        groups = {c.group for c in drop if c.group is not None}
        drop += [c for c in creates if c.group in groups and c.order in sel_c and c not in drop]
        for c in drop:
            sel_c.discard(c.order)
            deferred.add(c.model)
        torn = {c.model for c in creates
                if _replacement(c.reason) is not None and c.order in chosen and c.order not in sel_c}
        torn = {m for m in torn
                if any(c.model == m and _replacement(c.reason) is not None and c.order in sel_c for c in creates)
                or any(replicas[d].model == m and _replacement(removed[d]) is not None for d in sel_d)}
        for m in torn:
            _withdraw(m, creates, removed, replicas, sel_c, sel_d)
            deferred.add(m)
        if not drop and not torn:
            return deferred


def needs_cut(g: GpuWork, c: Create) -> bool:
    return c.group is not None or Placement(c.start, c.profile) not in g.current


def _growth(c: Create) -> bool:
    """A scale-up CREATE (not a replacement or a move): free of the churn budget when it
    deletes nothing."""
    return c.reason not in REPLACING and c.reason is not Reason.CONSOLIDATE


def overlap(g: GpuWork, c: Create, r: Replica) -> bool:
    if c.group is not None or r.profile == WHOLE:
        return True
    pc, pr = g.product.profiles[c.profile], g.product.profiles.get(r.profile)
    if pr is None:
        return True
    return c.start < r.start + pr.mem_slots and r.start < c.start + pc.mem_slots


def apply_selection(gpus: list[GpuWork], by_id: dict[str, GpuWork], creates: list[Create], sel_c: set[int],
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
