"""Planner step 2a: the scale-up fast path -- time to capacity before slices.

Pure; used by ``planner._attempt`` before ``planner.place.place_all``. A
running model short of its demand first takes empty MIG instances that exist
now, on any profile it can use: a replica there serves after a pod start
(~30 s), one behind a repartition after minutes (mig-manager: 3-5 min,
docs/gpu-operator.md), and a burst is lost by then. What is still missing is re-sized
by fewest slices and placed as usual; later ticks' scale-down, right-sizing
and consolidation move the model back to its efficient mix.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
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
    pool = _FreePool(free)
    count = {n: len(work[n].keep) for n in have}
    picked = dict.fromkeys(have, 0)
    for level in sorted({work[n].spec.priority for n in have}, reverse=True):
        active = sorted(n for n in have if work[n].spec.priority == level)
        while active and pool.alive:
            n = min(active, key=lambda n: (have[n] / (work[n].demand or 1.0), n))
            m = work[n]
            need = (m.demand or 0.0) - have[n]

            def rank(gp: tuple[GpuWork, Placement], m=m, need=need) -> tuple:
                g, p = gp
                c, comp = m.cap[p.profile], g.product.profiles[p.profile].compute
                covers = c >= need - EPS
                return (not g.hard, not covers, comp if covers else -c / comp, -c, g.rdma, g.order, p.start)

            best = pool.best(m.cap, rank)
            if need <= EPS or count[n] >= m.spec.max_replicas or best is None:
                active.remove(n)
                continue
            g, p = best
            g.place(n, p.profile, p.start, ())
            g.keep_cut = True
            pool.take(g, p)
            have[n] += m.cap[p.profile]
            count[n] += 1
            picked[n] += 1
    for n, k in picked.items():
        if k:
            m = work[n]
            m.add = cover((m.demand or 0.0) - have[n], m.options, max(0, m.floor - count[n]),
                          max(0, m.spec.max_replicas - count[n]))


class _FreePool:
    """The free instances of ``place_urgent``, for the best one by a model's rank in O(classes x log n).

    Why: a scale-up at 8,000 GPUs has ~20,000 free instances and places
    hundreds of replicas; scanning them all per replica was the whole tick
    (minutes). Within one (product, profile) class the rank's capacity and
    compute terms are equal, so its order is (not g.hard, g.rdma, g.order,
    p.start) -- the same for every model and need. Each class keeps a heap in
    that order; the best instance is the best of the classes' heads by the
    full rank, ties to the earlier instance in the original list, exactly as
    ``min`` over the list. Taking an instance kills the overlapping ones on its
    GPU and re-keys the GPU's others (its ``hard`` changed); stale heap
    entries are skipped when they surface.
    """

    def __init__(self, free: list[tuple[GpuWork, Placement]]) -> None:
        self.free = free
        self.dead = [False] * len(free)
        self.alive = len(free)
        self.version: dict[int, int] = {}
        self.on_gpu: dict[int, list[int]] = {}
        self.heaps: dict[tuple[int, str], list[tuple]] = {}
        for i, (g, _p) in enumerate(free):
            self.on_gpu.setdefault(id(g), []).append(i)
        for i in range(len(free)):
            self._push(i)

    def _push(self, i: int) -> None:
        g, p = self.free[i]
        heap = self.heaps.setdefault((id(g.product), p.profile), [])
        heapq.heappush(heap, (not g.hard, g.rdma, g.order, p.start, i, self.version.get(id(g), 0)))

    def best(self, cap: Mapping[str, float], rank: Callable[[tuple[GpuWork, Placement]], tuple]
             ) -> tuple[GpuWork, Placement] | None:
        top: tuple | None = None
        for (_prod, profile), heap in self.heaps.items():
            if profile not in cap:
                continue
            while heap and (self.dead[heap[0][4]] or heap[0][5] != self.version.get(id(self.free[heap[0][4]][0]), 0)):
                heapq.heappop(heap)
            if heap:
                i = heap[0][4]
                key = (*rank(self.free[i]), i)
                if top is None or key < top:
                    top = key
        return None if top is None else self.free[top[-1]]

    def take(self, g: GpuWork, p: Placement) -> None:
        self.version[id(g)] = self.version.get(id(g), 0) + 1
        for i in self.on_gpu[id(g)]:
            if self.dead[i]:
                continue
            if overlaps(g.product, p, self.free[i][1]):
                self.dead[i] = True
                self.alive -= 1
            else:
                self._push(i)
