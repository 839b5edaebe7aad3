"""Planner step 2c: repair high availability, then consolidate.

Pure; used by ``planner.plan`` once ``planner.place`` has placed the new
replicas, on the same per-GPU work state (``packing.GpuWork``). Both passes
only rearrange what is placed:
- ``fix_high_availability``: a model that must run on two GPUs and sits on one
  swaps a new replica with another model's elsewhere, else moves one;
- ``consolidate``: a lightly used GPU whose replicas all fit in free space
  elsewhere is emptied, so it can be released.
Each pass returns the (GPU, start) slots it filled; the replicas it displaces
are recorded in ``removed`` with their reason.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement, check_layout
from autoscaler.policy.planner.packing import GpuWork, Index, fit
from autoscaler.policy.planner.sizing import EPS
from autoscaler.policy.types import Reason

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.work import ModelWork

# Consolidation gives up after this many GPUs that cannot be emptied: bounded
# work on 10,000 GPUs (each try scans signatures, not GPUs).
CONSOLIDATE_TRIES = 64


def fix_high_availability(work: dict[str, ModelWork], gpus: list[GpuWork],
                           removed: dict[str, Reason]) -> set[tuple[str, int]]:
    """>= 2 replicas on distinct GPUs for every HA model: swap new replicas, else move one."""
    moved: set[tuple[str, int]] = set()
    ha = {n for n, m in work.items() if m.spec.high_availability}
    if not ha:
        return moved
    # One pass to find the models that break the rule (rare), then look closer.
    on: dict[str, list[str]] = {}
    for g in gpus:
        for v in g.hard.values():
            if v[0] in ha:
                on.setdefault(v[0], []).append(g.id)
    broken = sorted(n for n, ids in on.items() if len(ids) >= 2 and len(set(ids)) < 2)
    for m in (work[n] for n in broken):
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
                    if other is not None and other.spec.high_availability and not _still_spread(v2[0], h, s2, g0, gpus):
                        continue
                    g.hard[s] = (v2[0], v[1], None)
                    h.hard[s2] = (m.spec.name, v[1], None)
                    done = True
                    break
            if done:
                break
        if done:
            continue
        # b) exchange a new replica with a new replica of another (non-HA) model
        #    of a different profile elsewhere, when both still fit after the swap
        #    (3g+3g | 1g+1g -> 3g+1g | 3g+1g)
        if _swap_across(m.spec.name, where, g0, gpus, ha):
            continue
        # c) move one replica (a new one, the smallest, if any) to another GPU
        index = Index([h for h in gpus if h is not g0])
        got = None
        for g, s, v in sorted(where, key=lambda t: (t[2][2] is not None, g0.product.profiles[t[2][1]].compute, t[1])):
            got = index.find(v[1], used_only=False)
            if got is not None:
                break
        if got is None:
            m.why(Reason.SHORTFALL)
            continue
        h, start, destroyed = got
        h.place(m.spec.name, v[1], start, destroyed)
        moved.add((h.id, start))
        del g0.hard[s]
        if v[2] is not None:
            g0.block(Placement(s, v[1]))
            m.keep = [r for r in m.keep if r.id != v[2]]
            removed[v[2]] = Reason.HIGH_AVAILABILITY
        else:
            g0.soft.add(Placement(s, v[1]))
        m.why(Reason.HIGH_AVAILABILITY)
    return moved


def _swap_across(name: str, where: list, g0: GpuWork, gpus: list[GpuWork], ha: set[str]) -> bool:
    for _g, s, v in where:
        if v[2] is not None:
            continue
        for h in gpus:
            if h is g0 or h.whole is not None or h.frozen or h.keep_cut or g0.keep_cut or not h.hard:
                continue
            for s2, v2 in list(h.hard.items()):
                if v2[2] is not None or v2[0] == name or v2[1] == v[1]:
                    continue
                if v2[0] in ha and not _still_spread(v2[0], h, s2, g0, gpus):
                    continue
                saved = [(x, dict(x.hard), dict(x.blocked), set(x.soft)) for x in (g0, h)]
                del g0.hard[s]
                g0.soft.add(Placement(s, v[1]))
                del h.hard[s2]
                h.soft.add(Placement(s2, v2[1]))
                a = fit(g0.product, g0.occupied(), tuple(sorted(g0.soft)), v2[1])
                b = fit(h.product, h.occupied(), tuple(sorted(h.soft)), v[1])
                if a is not None and b is not None:
                    g0.place(v2[0], v2[1], a[0], a[1])
                    h.place(name, v[1], b[0], b[1])
                    if not check_layout(g0.product, g0.hard_layout()) and not check_layout(h.product, h.hard_layout()):
                        return True
                for x, hard, blocked, soft in saved:
                    x.hard, x.blocked, x.soft = hard, blocked, soft
    return False


def _still_spread(model: str, h: GpuWork, s2: int, g0: GpuWork, gpus: list[GpuWork]) -> bool:
    """Would ``model`` keep >= 2 distinct GPUs if its replica at (h, s2) moved to g0?"""
    ids = [g.id for g in gpus for s, v in g.hard.items() if v[0] == model and not (g is h and s == s2)]
    return len(ids) + 1 < 2 or len(set(ids) | {g0.id}) >= 2


def consolidate(work: dict[str, ModelWork], gpus: list[GpuWork], removed: dict[str, Reason],
                evacuated: set[str] | None = None, *, recut: bool = True,
                starting: frozenset[str] = frozenset(),
                copies: Container[tuple[str, int]] = frozenset()) -> set[tuple[str, int]]:
    """Empty lightly used GPUs whose replicas all fit in free space elsewhere.

    ``recut`` False: only into empty instances as cut now. Where a repartition drains the
    whole node (``RepartitionScope.NODE``), a move that needs one evicts every pod of the
    destination's node to save part of a GPU: a saving not worth that disruption.

    ``starting``: ids of replicas not ready yet. A GPU hosting one is not emptied: the
    move would throw away a start already paid for (the model's capacity arrives one
    start later, while the demand that created it is usually still there). Once it is
    ready, the GPU is a candidate like any other.

    Nor is a GPU hosting a replica its model has outgrown this plan: one without which
    the model's capacity, new replicas included, still covers its demand. It stays
    only until the new replicas serve (make before break); the next plan scales it
    down, so a copy made now would be deleted one tick after it was paid for.
    ``copies``: the (GPU, start) slots this plan's moves filled, copies of running
    replicas rather than new capacity."""
    moved: set[tuple[str, int]] = set()
    outgrown = _outgrown(work, gpus, copies)
    # A GPU that took a fast-path replica this tick is not emptied: moving that
    # replica would mostly mean a repartition, which is what the fast path avoids.
    used = [g for g in gpus if g.hard and g.whole is None and not g.frozen and not g.keep_cut
            and not any(v[2] in starting or v[2] in outgrown for v in g.hard.values())]
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
        index.remove(g)
        touched: dict[str, tuple] = {}
        plan_moves: list[tuple[GpuWork, int]] = []
        ok = True
        items = sorted(g.hard.items(), key=lambda kv: (-g.product.profiles[kv[1][1]].compute, kv[0]))
        for s, (model, prof, rid) in items:
            m = work.get(model)
            avoid = model if (m is not None and m.spec.high_availability) else None
            got = index.find(prof, used_only=True, exclude={g.id}, avoid_model=avoid, exact_only=not recut)
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
            tries += 1  # only failures count, so the next tick stops at the same GPU
            for h in gpus:
                if h.id in touched:
                    index.remove(h)
                    h.hard, h.blocked, h.soft = touched[h.id]
                    index.add(h)
            index.add(g)
            continue
        for s, (model, prof, rid) in items:
            if rid is not None:
                g.block(Placement(s, prof))
                removed[rid] = Reason.CONSOLIDATE
                m = work.get(model)
                if m is not None:
                    m.keep = [r for r in m.keep if r.id != rid]
                    m.why(Reason.CONSOLIDATE)
            else:
                g.soft.add(Placement(s, prof))
        g.hard = {}
        if evacuated is not None:
            evacuated.add(g.id)
        for h, start in plan_moves:
            moved.add((h.id, start))
        free_total -= g.product.compute_slices
        index.add(g)
    return moved


def _outgrown(work: dict[str, ModelWork], gpus: list[GpuWork], copies: Container[tuple[str, int]]) -> set[str]:
    """Ids of running replicas of growing models (a new replica placed this plan, by the
    fast path or the sizing, not a move's copy) whose capacity the model no longer needs
    once what is placed for it serves. A model with no demand figure has outgrown nothing."""
    held: dict[str, float] = {}
    growing: set[str] = set()
    running: list[tuple[str, str, str]] = []
    for g in gpus:
        for s, (model, prof, rid) in g.hard.items():
            m = work.get(model)
            if m is None or m.demand is None:
                continue
            held[model] = held.get(model, 0.0) + m.cap.get(prof, 0.0)
            if rid is None:
                if (g.id, s) not in copies:
                    growing.add(model)
            else:
                running.append((model, prof, rid))
    return {rid for model, prof, rid in running if model in growing
            and held[model] - work[model].cap.get(prof, 0.0) >= (work[model].demand or 0.0) - EPS}
