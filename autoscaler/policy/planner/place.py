"""Planner step 2b: place new replicas, repair high availability, consolidate.

Pure; used by ``planner.plan`` after sizing and after the scale-up fast path
(``planner.urgent.place_urgent``). Works on the per-GPU work state
of ``packing`` (``GpuWork``) in two tiers: first only space that is free now,
then also the space of replicas that leave this tick (a CREATE there waits
for their DELETE). When everything cannot fit, the shortfall priority rule
(see ``planner``) decides who gets the space: one replica for every model
that would otherwise have none (``_place_presence``), then higher priority
first, floors before extra capacity, the extra capacity in proportion to demand.

Size: ~500 lines, over the house limit of ~450, because the two tiers, the
shortfall rule and consolidation walk the same ``GpuWork`` state in one order;
split, each part would re-derive what the previous one left free.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement, check_layout
from autoscaler.policy.planner.packing import GpuWork, Index, fit, interleave, overlaps, pack
from autoscaler.policy.planner.sizing import EPS, cover
from autoscaler.policy.types import Reason

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.work import ModelWork

# Consolidation gives up after this many GPUs that cannot be emptied: bounded
# work on 10,000 GPUs (each try scans signatures, not GPUs).
CONSOLIDATE_TRIES = 64


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


def _open_tier2(gpus: list[GpuWork], skip: frozenset[str] = frozenset()
                ) -> tuple[dict[str, dict[int, Placement]], dict[str, set[int]]]:
    """Make the instances of leaving replicas usable (as empty instances),
    except on the GPUs in ``skip``."""
    saved = {g.id: g.blocked for g in gpus if g.blocked and g.id not in skip}
    before = {g.id: set(g.hard) for g in gpus}
    for g in gpus:
        if g.blocked and g.id not in skip:
            g.soft |= set(g.blocked.values())
            g.blocked = {}
    return saved, before


def _close_tier2(gpus: list[GpuWork], saved: dict[str, dict[int, Placement]], before: dict[str, set[int]],
                 placed_tier2: set[tuple[str, int]]) -> None:
    for g in gpus:
        for s in set(g.hard) - before[g.id]:
            placed_tier2.add((g.id, s))
        if g.id in saved:
            # Instances of leaving replicas that nothing new took stay blocked
            # (their replica is deleted this tick; the instance stays as it is);
            # those a new replica overlaps are taken by it (the CREATE waits for
            # their DELETE: see planner/actions.py).
            taken = [Placement(s, v[1]) for s, v in g.hard.items()]
            g.blocked = {s: p for s, p in saved[g.id].items()
                         if not any(overlaps(g.product, p, t) for t in taken)}
            g.soft -= set(g.blocked.values())


def _pack_two_tiers(gpus: list[GpuWork], pools: dict[str, deque[str]], placed_tier2: set[tuple[str, int]],
                    ha: frozenset[str] = frozenset(), reuse: bool = False, reuse_probe: list[bool] | None = None) -> None:
    """Tier 1: space free now. Tier 2: also the space of replicas leaving this tick."""
    pack(gpus, pools, Index(gpus), ha_models=ha, reuse_layouts=reuse, reuse_probe=reuse_probe)
    if not any(pools.values()) or not any(g.blocked for g in gpus):
        return
    saved, before = _open_tier2(gpus)
    pack(gpus, pools, Index(gpus), ha_models=ha)
    _close_tier2(gpus, saved, before, placed_tier2)


def _place_one(index: Index, model: str, profile: str, ha: frozenset[str]) -> bool:
    """One replica on the fullest GPU it fits (another GPU than its siblings when HA)."""
    got = None
    if model in ha:
        got = index.find(profile, used_only=False, avoid_model=model)
    if got is None:
        got = index.find(profile, used_only=False)
    if got is None:
        return False
    g, start, destroyed = got
    index.remove(g)
    g.place(model, profile, start, destroyed)
    index.add(g)
    return True


def _place_seq(gpus: list[GpuWork], items: list[tuple[str, str]], placed_tier2: set[tuple[str, int]],
               ha: frozenset[str]) -> None:
    """Place ``(model, profile)`` items one at a time in the given order (the
    proportional shortage path), tier 1 then tier 2; one index for all, so the
    cost is items x signatures, not items x GPUs."""
    index = Index(gpus)
    left = [it for it in items if not _place_one(index, it[0], it[1], ha)]
    if left and any(g.blocked for g in gpus):
        saved, before = _open_tier2(gpus)
        index = Index(gpus)
        for model, prof in left:
            _place_one(index, model, prof, ha)
        _close_tier2(gpus, saved, before, placed_tier2)


def place_all(work: dict[str, ModelWork], gpus: list[GpuWork], placed_tier2: set[tuple[str, int]],
              *, reuse: bool = False, plain: bool = False, reuse_probe: list[bool] | None = None) -> None:
    """Place every model's new replicas (``m.add``); ``reuse``: fill the empty
    instances of idle GPUs' current layouts before cutting new patterns (the only
    packing it changes is the first: ``reuse_probe`` gets whether it would);
    ``plain``: do not hold HA replicas back while packing (repair after)."""
    snap = _snapshot(gpus)
    ha = frozenset(n for n, m in work.items() if m.spec.high_availability)
    pools = _pools({n: m.add for n, m in work.items()})
    _pack_two_tiers(gpus, pools, placed_tier2, frozenset() if plain else ha, reuse, reuse_probe)
    if not any(pools.values()):
        return
    if ha:
        # Holding HA replicas back for other GPUs can strand one at the end;
        # pack plainly and let the HA repair swap replicas afterwards.
        _restore(gpus, snap)
        placed_tier2.clear()
        pools = _pools({n: m.add for n, m in work.items()})
        _pack_two_tiers(gpus, pools, placed_tier2)
        if not any(pools.values()):
            return
    # Not everything fits: redo by the shortfall priority rule.
    _restore(gpus, snap)
    placed_tier2.clear()
    present = _place_presence(work, gpus, placed_tier2, ha)
    levels = sorted({m.spec.priority for m in work.values()}, reverse=True)
    for level in levels:
        ms = [m for m in work.values() if m.spec.priority == level and m.add]
        floors: dict[str, dict[str, int]] = {}
        extras: list[tuple[float, str, str]] = []
        for m in ms:
            need_floor = max(0, m.floor - len(m.keep) - present.get(m.spec.name, 0))
            items = sorted(((p, m.cap[p]) for p, c in m.add.items() for _ in range(c)), key=lambda pc: -pc[1])
            have = sum(m.cap[r.profile] for r in m.keep)
            shared = present.get(m.spec.name, 0)
            if shared:  # the presence replica is one of its adds (max_replicas holds)
                items = items[:max(0, len(items) - shared)]
                have += shared * _smallest(m).cap
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
            _place_seq(gpus, [(name, p) for _f, name, p in extras], placed_tier2, ha)
    # Whatever did not fit with the chosen profiles: the models' other profiles,
    # one replica at a time to the least-served model of the highest priority.
    for level in levels:
        refill([m for m in work.values() if m.spec.priority == level], gpus, placed_tier2, ha)
    _trim_excess(work, gpus)


def _place_presence(work: dict[str, ModelWork], gpus: list[GpuWork], placed_tier2: set[tuple[str, int]],
                    ha: frozenset[str]) -> dict[str, int]:
    """A full fleet never starves a model to zero: before any priority level's
    floors or extra capacity, every model that would otherwise hold no replica
    while it has demand (or a floor) gets one, on its smallest usable profile,
    and says so with ``Reason.FLEET_SHARE_MIN``. Worked number: 16 GPUs full of
    a priority-2 model's flash crowd and a priority-0 model back from silence
    at 40 req/s: without this the priority-0 model would get nothing until the
    crowd passed; with it, one 1g slice (58 req/s) is carved for it first.
    Returns model -> replicas placed here (0 or 1)."""
    want: dict[str, dict[str, int]] = {}
    for name, m in work.items():
        if m.keep or not m.add or not m.options:
            continue
        if not ((m.demand or 0.0) > EPS or m.floor > 0):
            continue
        want[name] = {_smallest(m).name: 1}
    if not want:
        return {}
    before = {name: _count(gpus, name) for name in want}
    pools = _pools(want)
    _pack_two_tiers(gpus, pools, placed_tier2, ha)
    out: dict[str, int] = {}
    for name in want:
        n = _count(gpus, name) - before[name]
        out[name] = n
        if n:
            work[name].why(Reason.FLEET_SHARE_MIN)
    return out


def _smallest(m: ModelWork):
    return min(m.options, key=lambda o: (o.compute, -o.cap, o.name))


def _count(gpus: list[GpuWork], model: str) -> int:
    return sum(1 for g in gpus for v in g.hard.values() if v[0] == model)


def _trim_excess(work: dict[str, ModelWork], gpus: list[GpuWork]) -> None:
    """Drop new replicas a model does not need after all (the shortage path can
    over-provide: floors on small profiles, then bigger ones on top)."""
    for m in work.values():
        mine = [(g, s, v) for g in gpus for s, v in g.hard.items() if v[0] == m.spec.name]
        have = sum(m.cap.get(v[1], 0.0) for _g, _s, v in mine)
        n = len(mine)
        for g, s, v in sorted(mine, key=lambda t: (m.cap.get(t[2][1], 0.0), t[0].order, t[1])):
            if v[2] is not None:
                continue
            c = m.cap.get(v[1], 0.0)
            rest = [h.id for h, s2, _ in mine if (h, s2) != (g, s) and s2 in h.hard and h.hard[s2][0] == m.spec.name]
            if n - 1 < m.floor or have - c < (m.demand or 0.0) - EPS:
                continue
            if m.spec.high_availability and len(set(rest)) < 2:
                continue
            del g.hard[s]
            g.soft.add(Placement(s, v[1]))
            n, have = n - 1, have - c


def unmet(work: dict[str, ModelWork], gpus: list[GpuWork]) -> bool:
    have: dict[str, float] = {}
    count: dict[str, int] = {}
    for g in gpus:
        for model, prof, _rid in g.hard.values():
            m = work.get(model)
            if m is not None:
                have[model] = have.get(model, 0.0) + m.cap.get(prof, 0.0)
                count[model] = count.get(model, 0) + 1
    return any(
        (have.get(n, 0.0) < (m.demand or 0.0) - EPS or count.get(n, 0) < m.floor)
        and count.get(n, 0) < m.spec.max_replicas and m.options
        for n, m in work.items()
    )


def refill(ms: list[ModelWork], gpus: list[GpuWork], placed_tier2: set[tuple[str, int]], ha: frozenset[str],
           *, keep_closed: frozenset[str] = frozenset()) -> None:
    """Top up models whose demand or floor is unmet with any usable profile
    that still fits, one replica at a time to the least-served model (tier 1,
    then tier 2). Cost: replicas placed x signatures."""
    if not ms:
        return
    by_name = {m.spec.name: m for m in ms}
    have: dict[str, float] = dict.fromkeys(by_name, 0.0)
    count: dict[str, int] = dict.fromkeys(by_name, 0)
    for g in gpus:
        for model, prof, _rid in g.hard.values():
            if model in by_name:
                have[model] += by_name[model].cap.get(prof, 0.0)
                count[model] += 1

    def run(index: Index) -> None:
        active = sorted(ms, key=lambda m: m.spec.name)
        while active:
            def met(m: ModelWork) -> float:
                return have[m.spec.name] / m.demand if m.demand and m.demand > EPS else math.inf

            m = min(active, key=lambda m: (met(m), m.spec.name))
            n = m.spec.name
            need = (m.demand or 0.0) - have[n]
            room = m.spec.max_replicas - count[n]
            if (need <= EPS and count[n] >= m.floor) or room <= 0:
                active.remove(m)
                continue
            opts = [o for o in m.options if index.find(o.name, used_only=False) is not None]
            mix = cover(need, opts, max(0, m.floor - count[n]), room) if opts else {}
            first = next((o.name for o in opts if o.name in mix), None)
            if first is None or not _place_one(index, n, first, ha):
                active.remove(m)
                continue
            have[n] += m.cap.get(first, 0.0)
            count[n] += 1

    run(Index(gpus))
    if any(g.blocked for g in gpus) and any(
        ((m.demand or 0.0) - have[m.spec.name] > EPS or count[m.spec.name] < m.floor)
        and count[m.spec.name] < m.spec.max_replicas for m in ms
    ):
        saved, before = _open_tier2(gpus, keep_closed)
        run(Index(gpus))
        _close_tier2(gpus, saved, before, placed_tier2)


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
            g0.blocked[s] = Placement(s, v[1])
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


def _hosts(g: GpuWork, model: str) -> bool:
    return any(v[0] == model for v in g.hard.values())


def consolidate(work: dict[str, ModelWork], gpus: list[GpuWork], removed: dict[str, Reason],
                evacuated: set[str] | None = None, *, recut: bool = True,
                starting: frozenset[str] = frozenset()) -> set[tuple[str, int]]:
    """Empty lightly used GPUs whose replicas all fit in free space elsewhere.

    ``recut`` False: only into empty instances as cut now. Where a repartition drains the
    whole node (``RepartitionScope.NODE``), a move that needs one evicts every pod of the
    destination's node to save part of a GPU: a saving not worth that disruption.

    ``starting``: ids of replicas not ready yet. A GPU hosting one is not emptied: the
    move would throw away a start already paid for (the model's capacity arrives one
    start later, while the demand that created it is usually still there). Once it is
    ready, the GPU is a candidate like any other."""
    moved: set[tuple[str, int]] = set()
    # A GPU that took a fast-path replica this tick is not emptied: moving that
    # replica would mostly mean a repartition, which is what the fast path avoids.
    used = [g for g in gpus if g.hard and g.whole is None and not g.frozen and not g.keep_cut
            and not any(v[2] in starting for v in g.hard.values())]
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
                g.blocked[s] = Placement(s, prof)
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
