"""Planner step 2a: the scale-up fast path -- time to capacity before slices.

Pure; used by ``planner._attempt`` before ``planner_place.place_all``. A
running model short of its demand first takes empty MIG instances that exist
now, on any profile it can use: a replica there serves after a pod start
(~30 s), one behind a repartition after minutes (mig-manager: 3-5 min,
docs/gpu-operator.md), and a burst is lost by then. What is still missing is re-sized
by fewest slices and placed as usual; later ticks' scale-down, right-sizing
and consolidation move the model back to its efficient mix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.mig.layout import Placement
from autoscaler.policy.planner.packing import GpuWork, overlaps
from autoscaler.policy.planner.sizing import EPS, cover

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.policy.planner.work import ModelWork


def place_urgent(work: dict[str, ModelWork], gpus: list[GpuWork]) -> None:
    """Scale-up fast path: cover a running model's shortfall with empty MIG
    instances that exist now, before the fewest-slices sizing (``m.add``).

    Why: a replica on an existing instance serves in a start delay (~30 s); one
    that needs a repartition first waits minutes (mig-manager: ~180 s), and a
    burst is lost by then. The cost is a less efficient profile for a while:
    the next ticks' scale-down (least efficient first), rebalancing and
    consolidation move the model back to its efficient mix once it is served.

    Only models with replicas running that are short of their demand (not a
    switch to a better mix, not a first deployment: those are not urgent and
    pack best from scratch). Instances on GPUs already in use first (no GPU
    more), then idle GPUs as they are cut now. One instance at a time to the
    least-served model, highest priority first; per model the instance that
    covers the rest with the fewest slices, else the most efficient one.
    A GPU that takes such a replica keeps its layout this tick (``keep_cut``).
    What is still missing is re-sized with ``cover`` and placed as usual.
    """
    have: dict[str, float] = {}
    for n, m in work.items():
        if not m.add or not m.running or m.rebalanced or not m.options or m.demand is None:
            continue
        got = sum(m.cap.get(r.profile, 0.0) for r in m.keep)
        if m.demand - got > EPS:
            have[n] = got
    if not have:
        return
    free: list[tuple[GpuWork, Placement]] = []
    for g in gpus:
        if g.whole is not None or g.frozen or not g.soft:
            continue
        occ = g.occupied()
        free += [(g, p) for p in sorted(g.soft) if not any(overlaps(g.product, p, o) for o in occ)]
    if not free:
        return
    count = {n: len(work[n].keep) for n in have}
    picked = dict.fromkeys(have, 0)
    for level in sorted({work[n].spec.priority for n in have}, reverse=True):
        active = sorted(n for n in have if work[n].spec.priority == level)
        while active and free:
            n = min(active, key=lambda n: (have[n] / (work[n].demand or 1.0), n))
            m = work[n]
            need = (m.demand or 0.0) - have[n]
            cands = [(g, p) for g, p in free if p.profile in m.cap]
            if need <= EPS or count[n] >= m.spec.max_replicas or not cands:
                active.remove(n)
                continue

            def rank(gp: tuple[GpuWork, Placement], m=m, need=need) -> tuple:
                g, p = gp
                c, comp = m.cap[p.profile], g.product.profiles[p.profile].compute
                covers = c >= need - EPS
                return (not g.hard, not covers, comp if covers else -c / comp, -c, g.rdma, g.order, p.start)

            g, p = min(cands, key=rank)
            g.place(n, p.profile, p.start, ())
            g.keep_cut = True
            free = [(h, q) for h, q in free if not (h is g and overlaps(g.product, p, q))]
            have[n] += m.cap[p.profile]
            count[n] += 1
            picked[n] += 1
    for n, k in picked.items():
        if k:
            m = work[n]
            m.add = cover((m.demand or 0.0) - have[n], m.options, max(0, m.floor - count[n]),
                          max(0, m.spec.max_replicas - count[n]))
