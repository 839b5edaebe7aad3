"""Planner step 2: put replicas on MIG instances across GPUs.

Pure placement math used by ``planner.plan``. Each GPU carries, for the
target, the instances that host a replica (``hard``), the instances whose
replica is being removed this tick (``blocked`` -- still serving until its
replacement is ready, so nothing new may go there), and the existing empty
instances (``soft`` -- reused as-is when the profile matches, otherwise they
may be destroyed by a repartition because nothing runs on them).

Speed: GPUs are indexed by their free-space signature (product, hard,
blocked, soft), and "where does profile p go on a GPU with this signature" is
computed once per signature (``fit``). A cluster of 10,000 GPUs has only a
few hundred distinct signatures, so placing one replica scans signatures, not
GPUs.

Order of preference for a new replica (the issue's objective, in order):
an already-used GPU (fullest first -- best fit keeps whole GPUs free), then
a fresh GPU cut with a whole-GPU "pattern" (a multiset of profiles that fits
one GPU) chosen to fill it as much as possible, big instances first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from functools import lru_cache
from itertools import combinations

from autoscaler.mig.layout import Placement, best_start, check_layout, free_starts, maximal_layouts
from autoscaler.mig.products import STANDARD_KINDS, Product

# ---------------------------------------------------------------- geometry caches


@lru_cache(maxsize=65536)
def _best_start(product: Product, layout: tuple[Placement, ...], profile: str) -> int | None:
    return best_start(product, layout, profile)


def _compute(product: Product, layout: Iterable[Placement]) -> int:
    return sum(product.profiles[p.profile].compute for p in layout)


def overlaps(product: Product, a: Placement, b: Placement) -> bool:
    pa, pb = product.profiles[a.profile], product.profiles[b.profile]
    return a.start < b.start + pb.mem_slots and b.start < a.start + pa.mem_slots


@lru_cache(maxsize=65536)
def fit(
    product: Product, occupied: tuple[Placement, ...], soft: tuple[Placement, ...], profile: str
) -> tuple[int, tuple[Placement, ...]] | None:
    """Where one more ``profile`` instance goes, and which empty instances it destroys.

    1. an existing empty instance of exactly that profile (no repartition);
    2. free space beside everything, chosen by ``best_start``;
    3. space taken from empty instances (they are destroyed by a repartition).
    None when it does not fit even with every empty instance gone.
    """
    if profile not in product.profiles:
        return None
    exact = [p.start for p in soft if p.profile == profile]
    if exact:
        return max(exact), ()
    everything = tuple(sorted(occupied + soft))
    s = _best_start(product, everything, profile)
    if s is not None:
        return s, ()
    s = _best_start(product, occupied, profile)
    if s is None:
        return None
    new = Placement(s, profile)
    keep = [p for p in soft if not overlaps(product, p, new)]
    destroyed = [p for p in soft if overlaps(product, p, new)]
    # Compute can still be over budget with non-overlapping empty instances:
    # drop the smallest ones first (they are the cheapest to recreate).
    budget = product.compute_slices - _compute(product, occupied) - product.profiles[profile].compute
    keep.sort(key=lambda p: (product.profiles[p.profile].compute, p.start))
    while keep and _compute(product, keep) > budget:
        destroyed.append(keep.pop(0))
    return s, tuple(sorted(destroyed))


@lru_cache(maxsize=256)
def patterns(product: Product, profiles: tuple[str, ...]) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every multiset of ``profiles`` that fits one empty GPU of ``product``.

    Enumerated from the sub-layouts of the maximal layouts (standard kinds,
    plus the kinds of any non-standard profile asked for), sorted best first:
    most compute used, then bigger instances first.
    """
    kinds = set(STANDARD_KINDS)
    for name in profiles:
        if name in product.profiles:
            kinds.add(product.profiles[name].kind)
    order = tuple(k for k in ("1g", "1g+me", "1g.dbl", "2g", "3g", "4g", "7g") if k in kinds)
    wanted = set(profiles)
    found: set[tuple[tuple[str, int], ...]] = set()
    for layout in maximal_layouts(product, order):
        names = [p.profile for p in layout if p.profile in wanted]
        for r in range(1, len(names) + 1):
            for combo in combinations(names, r):
                counts: dict[str, int] = {}
                for n in combo:
                    counts[n] = counts.get(n, 0) + 1
                found.add(tuple(sorted(counts.items())))

    def score(pat: tuple[tuple[str, int], ...]) -> tuple:
        comp = sum(product.profiles[n].compute * c for n, c in pat)
        big = sum(product.profiles[n].compute ** 2 * c for n, c in pat)
        return (-comp, -big, pat)

    return tuple(sorted(found, key=score))


@lru_cache(maxsize=4096)
def realize(product: Product, pattern: tuple[tuple[str, int], ...]) -> tuple[Placement, ...] | None:
    """A concrete layout for a pattern on an empty GPU (big instances placed first)."""
    items = sorted(
        (n for n, c in pattern for _ in range(c)),
        key=lambda n: (-product.profiles[n].compute, -product.profiles[n].mem_slots, n),
    )
    layout: tuple[Placement, ...] = ()
    for n in items:
        s = _best_start(product, layout, n)
        if s is None:
            return _realize_search(product, items)
        layout = tuple(sorted(layout + (Placement(s, n),)))
    return layout


def _realize_search(product: Product, items: list[str]) -> tuple[Placement, ...] | None:
    def rec(layout: tuple[Placement, ...], rest: list[str]) -> tuple[Placement, ...] | None:
        if not rest:
            return layout
        for s in free_starts(product, layout, rest[0]):
            got = rec(tuple(sorted(layout + (Placement(s, rest[0]),))), rest[1:])
            if got is not None:
                return got
        return None

    return rec((), items)


# ---------------------------------------------------------------- per-GPU work state


class GpuWork:
    """The target of one GPU while the plan is being built (mutable, planner-private)."""

    __slots__ = ("blocked", "current", "fabric", "frozen", "hard", "id", "keep_cut", "node", "order", "product", "rdma",
                 "soft", "whole")

    def __init__(self, gid: str, node: str, product: Product, rdma: bool, fabric: str | None,
                 current: tuple[Placement, ...], order: int) -> None:
        self.id = gid
        self.node = node
        self.product = product
        self.rdma = rdma
        self.fabric = fabric
        self.current = current
        self.order = order
        # start -> (model, profile, replica id or None for new)
        self.hard: dict[int, tuple[str, str, str | None]] = {}
        self.blocked: dict[int, Placement] = {}
        self.soft: set[Placement] = set(current)
        self.whole: str | None = None  # multinode model holding the whole GPU
        self.frozen = False  # GpuState.busy: work in flight, nothing new goes here this tick
        # Hosts a scale-up fast-path replica (``planner.urgent.place_urgent``):
        # its layout stays as cut this tick -- a repartition would hold that
        # replica's start for the whole repartition -- so only its existing
        # empty instances take more replicas.
        self.keep_cut = False

    def hard_layout(self) -> tuple[Placement, ...]:
        return tuple(sorted(Placement(s, v[1]) for s, v in self.hard.items()))

    def occupied(self) -> tuple[Placement, ...]:
        if not self.hard and not self.blocked:
            return ()
        return tuple(sorted([Placement(s, v[1]) for s, v in self.hard.items()] + list(self.blocked.values())))

    def used_compute(self) -> int:
        return sum(self.product.profiles[v[1]].compute for v in self.hard.values())

    def key(self) -> tuple:
        return (self.product.name, self.rdma, self.occupied(), tuple(sorted(self.soft)), bool(self.hard), self.keep_cut)

    def place(self, model: str, profile: str, start: int, destroyed: tuple[Placement, ...], replica: str | None = None) -> None:
        for p in destroyed:
            self.soft.discard(p)
        new = Placement(start, profile)
        # Invariant: empty instances never overlap an occupied one.
        self.soft = {p for p in self.soft if not overlaps(self.product, p, new)}
        self.hard[start] = (model, profile, replica)

    def block(self, p: Placement) -> None:
        """Hold the space of a replica that leaves this tick: occupied, not empty, until
        tier 2 opens the space of leaving replicas (``place._open_tier2``). The empty
        instances it overlaps go (its own; on a group member's GPU, any it is cut into):
        one left among the empty ones would be offered to a new replica at once, and
        opening tier 2 would list it as empty again under whatever took it."""
        self.blocked[p.start] = p
        self.soft = {q for q in self.soft if not overlaps(self.product, q, p)}

    def models(self) -> set[str]:
        return {v[0] for v in self.hard.values()}

    def target_layout(self) -> tuple[Placement, ...]:
        layout = tuple(sorted(set(self.hard_layout()) | self.soft | set(self.blocked.values())))
        return layout


class Index:
    """GPUs bucketed by free-space signature, for fast "where does this fit"."""

    def __init__(self, gpus: Iterable[GpuWork]) -> None:
        self.buckets: dict[tuple, dict[str, GpuWork]] = {}
        self.where: dict[str, tuple] = {}
        for g in gpus:
            self.add(g)

    def add(self, g: GpuWork) -> None:
        if g.whole is not None or g.frozen:
            return  # a whole GPU held by a multinode group (or one still converging) takes no new instance
        k = g.key()
        self.buckets.setdefault(k, {})[g.id] = g
        self.where[g.id] = k

    def remove(self, g: GpuWork) -> None:
        k = self.where.pop(g.id, None)
        if k is None:
            return
        b = self.buckets.get(k)
        if b is not None:
            b.pop(g.id, None)
            if not b:
                del self.buckets[k]

    def update(self, g: GpuWork) -> None:
        self.remove(g)
        self.add(g)

    def find(self, profile: str, *, used_only: bool, exclude: set[str] | frozenset[str] = frozenset(),
             avoid_model: str | None = None, exact_only: bool = False) -> tuple[GpuWork, int, tuple[Placement, ...]] | None:
        """Best GPU for one more ``profile`` instance.

        ``used_only``: only GPUs that already host a replica (fill them first).
        ``exact_only``: only an empty instance of ``profile`` as cut now (no repartition).
        Rank: fullest GPU first (best fit), then no repartition, then non-RDMA
        GPUs (kept free for the multinode backend), then cluster order.
        ``avoid_model``: skip GPUs already hosting that model (high availability).
        """
        best: tuple[GpuWork, int, tuple[Placement, ...]] | None = None
        best_rank: tuple | None = None
        for k, bucket in self.buckets.items():
            _pname, rdma, occupied, soft, used, keep_cut = k
            if used_only and not used:
                continue
            g0 = next(iter(bucket.values()))
            got = fit(g0.product, occupied, soft, profile)
            if got is None:
                continue
            exact = any(p.start == got[0] and p.profile == profile for p in soft)
            if (exact_only or keep_cut) and not exact:
                continue  # would repartition (a GPU whose layout stays as cut this tick, for keep_cut)
            rank = (-_compute(g0.product, occupied), not exact, bool(got[1]), rdma)
            if best_rank is not None and rank > best_rank:
                continue
            # First acceptable GPU of the bucket (insertion order is deterministic).
            cand = next((g for g in bucket.values() if g.id not in exclude
                         and (avoid_model is None or avoid_model not in g.models())), None)
            if cand is None:
                continue
            full = rank + (cand.order,)
            if best_rank is None or full < best_rank:
                best, best_rank = (cand, got[0], got[1]), full
        return best


def interleave(items: dict[str, int]) -> deque[str]:
    """Models round-robin (``{"a": 3, "b": 1}`` -> a b a a) so one model's replicas spread over GPUs."""
    out: deque[str] = deque()
    left = dict(sorted(items.items()))
    while left:
        for m in list(left):
            out.append(m)
            left[m] -= 1
            if not left[m]:
                del left[m]
    return out


# Below this many new replicas, patterns are chosen replica by replica with
# high availability in mind (cheap at that size); above it, the HA repair
# after packing swaps replicas instead (plenty of same-profile partners).
HA_AWARE_MAX_ITEMS = 400


def pack(gpus: list[GpuWork], pools: dict[str, deque[str]], index: Index, *, allow_new: bool = True,
         ha_models: frozenset[str] = frozenset(), reuse_layouts: bool = False,
         reuse_probe: list[bool] | None = None) -> None:
    """Place every replica in ``pools`` (profile -> models, one entry per replica).

    Fills GPUs that already host replicas first (biggest instances first),
    then cuts empty GPUs with whole-GPU patterns. Placed entries are popped;
    what is left in ``pools`` did not fit. ``reuse_probe`` gets whether
    ``reuse_layouts`` would have placed anything here (False: a packing with it
    ends exactly as this one, so the caller need not try it).
    """
    comp_of: dict[str, int] = {}
    for g in gpus:
        for n, p in g.product.profiles.items():
            comp_of.setdefault(n, p.compute)
    order = sorted(pools, key=lambda n: (-comp_of.get(n, 0), n))
    # 1. fill partly-used GPUs
    for prof in order:
        q = pools[prof]
        while q:
            got = index.find(prof, used_only=True)
            if got is None:
                break
            g, start, destroyed = got
            index.remove(g)
            g.place(q.popleft(), prof, start, destroyed)
            index.add(g)
    if not allow_new:
        return
    ha_aware = bool(ha_models) and sum(len(q) for q in pools.values()) <= HA_AWARE_MAX_ITEMS
    placed_ha: set[str] = set()
    if ha_aware:
        placed_ha = {v[0] for g in gpus for v in g.hard.values() if v[0] in ha_models}
    if reuse_probe is not None:
        reuse_probe.append(reuse_layouts or _reusable(gpus, pools))
    if reuse_layouts:
        # 1b. idle GPUs already cut into instances these replicas can use as
        # they are: no repartition (the caller keeps this variant only when it
        # costs no GPU and no slice more than cutting fresh patterns).
        for g in sorted(gpus, key=lambda g: (g.rdma, g.order)):
            if g.hard or g.blocked or g.whole is not None or g.frozen or not g.soft:
                continue
            take = [p for p in sorted(g.soft, key=lambda p: (-g.product.profiles[p.profile].compute, p.start))
                    if pools.get(p.profile)]
            if not take:
                continue
            index.remove(g)
            here: set[str] = set()
            for pl in take:
                if pools[pl.profile]:
                    model = _pop(pools[pl.profile], here, ha_models, placed_ha) if ha_aware \
                        else pools[pl.profile].popleft()
                    here.add(model)
                    g.place(model, pl.profile, pl.start, ())
            placed_ha |= here & ha_models
            index.add(g)
    # 2. open empty GPUs, a whole-GPU pattern at a time
    empties: dict[tuple, list[GpuWork]] = {}
    for g in sorted(gpus, key=lambda g: (g.rdma, g.order)):
        if not g.hard and not g.blocked and g.whole is None and not g.frozen:
            empties.setdefault((g.rdma, g.product.name), []).append(g)
    for (_rdma, _pname), group in sorted(empties.items(), key=lambda kv: (kv[0][0], kv[1][0].order)):
        product = group[0].product
        group.reverse()  # pop() takes GPUs in cluster order
        while group:
            if ha_aware:
                left = _safe_counts(pools, product, ha_models, placed_ha)
            else:
                left = {n: len(q) for n, q in pools.items() if q and n in product.profiles}
            if not left:
                break
            pat = _choose(product, left)
            if pat is None:
                break
            layout = realize(product, pat)
            if layout is None:  # pragma: no cover - patterns come from real layouts
                break
            times = 1 if ha_aware else min(left[n] // c for n, c in pat)
            for _ in range(max(1, times)):
                if not group or any(len(pools[n]) < c for n, c in pat):
                    break
                g = _pick_empty(group, layout)
                index.remove(g)
                here: set[str] = set()
                for pl in sorted(layout, key=lambda p: (-product.profiles[p.profile].compute, p.start)):
                    destroyed = tuple(p for p in g.soft if overlaps(product, p, pl))
                    model = _pop(pools[pl.profile], here, ha_models, placed_ha) if ha_aware \
                        else pools[pl.profile].popleft()
                    here.add(model)
                    g.place(model, pl.profile, pl.start, destroyed)
                placed_ha |= here & ha_models
                # Empty instances left beside the pattern that break the compute
                # budget are destroyed (nothing runs on them).
                _trim_soft(g)
                index.add(g)


def _reusable(gpus: list[GpuWork], pools: dict[str, deque[str]]) -> bool:
    """Is an idle GPU cut with an empty instance a waiting replica can take as it is (step 1b of ``pack``)?"""
    wanted = {n for n, q in pools.items() if q}
    return bool(wanted) and any(not g.hard and not g.blocked and g.whole is None and not g.frozen
                                and any(p.profile in wanted for p in g.soft) for g in gpus)


def _safe_counts(pools: dict[str, deque[str]], product: Product, ha: frozenset[str], placed: set[str]
                 ) -> dict[str, int]:
    """Replicas per profile that one fresh GPU may take without breaking high availability.

    An HA model not placed anywhere yet keeps one replica back for another GPU.
    """
    out: dict[str, int] = {}
    for n, q in pools.items():
        if not q or n not in product.profiles:
            continue
        c = len(q)
        seen: set[str] = set()
        for m in q:
            if m in ha and m not in placed and m not in seen:
                seen.add(m)
                if q.count(m) >= 2:
                    c -= 1
        if c > 0:
            out[n] = c
    return out


def _pop(q: deque[str], here: set[str], ha: frozenset[str], placed: set[str]) -> str:
    """The first model in ``q`` that can go on this GPU without breaking high availability."""
    for i, m in enumerate(q):
        if not (m in ha and m in here and m not in placed):
            del q[i]
            return m
    return q.popleft()


def _choose(product: Product, left: dict[str, int]) -> tuple[tuple[str, int], ...] | None:
    """The fullest pattern that the remaining replicas can fill.

    Among equally full patterns, the one most like the remaining mix (cosine
    similarity, weighted by compute) wins: it leaves a remainder that still
    packs well. Worked example: 3g x2, 2g x2, 1g x4 left -> 3g+2g+1g+1g twice
    (2 GPUs), where "biggest first" takes 3g+2g+2g and strands 3g+1g x4 on two.
    """
    best = None
    best_key = None
    norm_l = sum((product.profiles[n].compute * c) ** 2 for n, c in left.items()) ** 0.5 or 1.0
    for pat in patterns(product, tuple(sorted(left))):
        if not all(left.get(n, 0) >= c for n, c in pat):
            continue
        comp = sum(product.profiles[n].compute * c for n, c in pat)
        if best_key is not None and comp < best_key[0]:
            break  # patterns come sorted by compute, fullest first
        dot = sum(product.profiles[n].compute ** 2 * c * left[n] for n, c in pat)
        norm_p = sum((product.profiles[n].compute * c) ** 2 for n, c in pat) ** 0.5 or 1.0
        key = (comp, dot / (norm_p * norm_l))
        if best_key is None or key > best_key:
            best, best_key = pat, key
    return best


def _pick_empty(group: list[GpuWork], layout: tuple[Placement, ...]) -> GpuWork:
    """An empty GPU for ``layout``: one already cut that way if any (no repartition)."""
    want = set(layout)
    for i in range(len(group) - 1, max(-1, len(group) - 65), -1):
        if want.issubset(group[i].soft):
            return group.pop(i)
    return group.pop()


def _trim_soft(g: GpuWork) -> None:
    hard = g.hard_layout()
    keep = sorted(g.soft, key=lambda p: (-g.product.profiles[p.profile].compute, p.start))
    g.soft = set()
    for p in keep:
        if not check_layout(g.product, hard + tuple(sorted(g.soft | {p}))):
            g.soft.add(p)
