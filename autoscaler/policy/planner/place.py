"""Planner step 2b: place new replicas.

Pure; used by ``planner.plan`` after sizing and after the scale-up fast path
(``planner.urgent.place_urgent``); the passes that then rearrange what is
placed (high availability, consolidation) are in ``planner.repair``. Works on
the per-GPU work state of ``packing`` (``GpuWork``) in two tiers: first only
space that is free now, then also the space of replicas that leave this tick
(a CREATE there waits for their DELETE). When everything cannot fit, the
shortfall priority rule (see ``planner``) decides who gets the space: one
replica for every model that would otherwise have none (``_place_presence``),
then higher priority first, floors before extra capacity, the extra capacity
in proportion to demand.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement
from autoscaler.policy.planner.packing import GpuWork, Index, interleave, overlaps, pack
from autoscaler.policy.planner.sizing import EPS, cover
from autoscaler.policy.types import Reason

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.work import ModelWork

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
            # their DELETE: see planner/order.py).
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
