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
from autoscaler.policy.types import Reason

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
        # A switch to a better mix (a rebalance, or a right-size swap in ``rightsize.downsize``;
        # both create for profile efficiency) leaves its model short by the replicas it replaces
        # only until their copies are placed. Served here, from any empty instance, a copy could
        # be as large as what it replaces, on another GPU: a move, which the next tick could
        # make back.
        swap = m.create_reason is Reason.PROFILE_EFFICIENCY
        if not m.add or not m.running or swap or not m.options or m.demand is None:
            continue
        got = sum(m.cap.get(r.profile, 0.0) for r in m.keep)
        if m.demand - got > EPS:
            have[n] = got
    if not have:
        return
    pool = _FreePool([g for g in gpus if g.whole is None and not g.frozen and g.soft])
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

    Why: a scale-up at 8,000 GPUs has ~30,000 free instances and places a few
    to hundreds of replicas; scanning them all per replica was the whole tick
    (minutes), and even listing them all once per call was most of a re-plan.
    Within one (product, profile) class the rank's capacity and compute terms
    are equal, so its order is (not g.hard, g.rdma, g.order, p.start) -- the
    same for every model and need. Each class keeps a heap in that order; the
    best instance is the best of the classes' heads by the full rank, ties to
    the earlier instance in GPU order, exactly as ``min`` over a list of them
    all. GPUs in use are listed at once; an idle GPU (nothing occupied: every
    instance as cut is free) is listed only when some class's head would come
    from it: idle GPUs wait in (rdma, order) order, which is their heap order,
    so the first one of a class holding that profile bounds what is unlisted.
    Taking an instance kills the overlapping ones on its GPU and re-keys the
    GPU's others (its ``hard`` changed); stale heap entries are skipped when
    they surface.
    """

    def __init__(self, gpus: list[GpuWork]) -> None:
        self.free: dict[tuple[int, int], tuple[GpuWork, Placement]] = {}  # (gpu order, k) -> instance
        self.dead: set[tuple[int, int]] = set()
        self.version: dict[int, int] = {}
        self.on_gpu: dict[int, list[tuple[int, int]]] = {}
        self.heaps: dict[tuple[int, str], list[tuple]] = {}
        idle = sorted((g for g in gpus if not g.hard and not g.blocked), key=lambda g: (g.rdma, g.order))
        # per class, the idle GPUs holding an instance of it, in heap order; and how far each was listed
        self.idle: dict[tuple[int, str], list[GpuWork]] = {}
        for g in idle:
            for prof in {p.profile for p in g.soft}:
                self.idle.setdefault((id(g.product), prof), []).append(g)
        self.cursor: dict[tuple[int, str], int] = {}
        self.listed: set[int] = set()  # idle GPUs whose instances are in the heaps
        self.alive = sum(len(g.soft) for g in idle)  # an idle GPU's instances are all free
        for g in gpus:
            if g.hard or g.blocked:
                occ = g.occupied()
                self._list(g, [p for p in sorted(g.soft) if not any(overlaps(g.product, p, o) for o in occ)])
        for heap in self.heaps.values():
            heapq.heapify(heap)  # O(n), the same heap order as n pushes
        for cls in self.idle:
            self.heaps.setdefault(cls, [])

    def _list(self, g: GpuWork, free: list[Placement], *, push: bool = False) -> None:
        """Put a GPU's free instances in the heaps (``push``: an idle GPU, counted in ``alive`` already)."""
        keys = self.on_gpu.setdefault(id(g), [])
        for k, p in enumerate(free):
            key = (g.order, k)
            self.free[key] = (g, p)
            keys.append(key)
            if push:
                self._push(key)
            else:
                self.heaps.setdefault((id(g.product), p.profile), []).append(self._entry(key))
                self.alive += 1

    def _entry(self, key: tuple[int, int]) -> tuple:
        g, p = self.free[key]
        return (not g.hard, g.rdma, g.order, p.start, key, self.version.get(id(g), 0))

    def _push(self, key: tuple[int, int]) -> None:
        g, p = self.free[key]
        heapq.heappush(self.heaps.setdefault((id(g.product), p.profile), []), self._entry(key))

    def _head(self, cls: tuple[int, str]) -> tuple | None:
        """The class's best live entry, listing idle GPUs until none unlisted could beat it."""
        heap = self.heaps[cls]
        while True:
            while heap and (heap[0][4] in self.dead or heap[0][5] != self.version.get(id(self.free[heap[0][4]][0]), 0)):
                heapq.heappop(heap)
            waiting, i = self.idle.get(cls, []), self.cursor.get(cls, 0)
            while i < len(waiting) and id(waiting[i]) in self.listed:
                i += 1
            self.cursor[cls] = i
            if i == len(waiting):
                return heap[0] if heap else None
            g = waiting[i]
            if heap and heap[0][:3] < (True, g.rdma, g.order):
                return heap[0]
            self.listed.add(id(g))
            self._list(g, sorted(g.soft), push=True)

    def best(self, cap: Mapping[str, float], rank: Callable[[tuple[GpuWork, Placement]], tuple]
             ) -> tuple[GpuWork, Placement] | None:
        top: tuple | None = None
        for cls in self.heaps:
            if cls[1] not in cap:
                continue
            head = self._head(cls)
            if head is not None:
                key = (*rank(self.free[head[4]]), head[4])
                if top is None or key < top:
                    top = key
        return None if top is None else self.free[top[-1]]

    def take(self, g: GpuWork, p: Placement) -> None:
        self.version[id(g)] = self.version.get(id(g), 0) + 1
        for key in self.on_gpu[id(g)]:
            if key in self.dead:
                continue
            if overlaps(g.product, p, self.free[key][1]):
                self.dead.add(key)
                self.alive -= 1
            else:
                self._push(key)
