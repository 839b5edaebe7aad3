"""Planner step 1: how many replicas of which MIG profile each model needs.

Pure math used by ``planner.plan`` before anything is placed. A profile is
usable for a model when it is allowed, has a positive entry in the model's
capacity table (a profile whose batch-1 latency already breaks the SLO is left
out of that table, so it is unusable) and is big enough for the model's memory.

``cover`` finds the profile mix with the fewest compute slices whose capacity
meets the demand -- "choose by efficiency (capacity per slice)" made exact.
Why exact and still cheap: let ``b`` be the most efficient profile. Any
``compute(b)`` copies of another profile ``p`` can be swapped for
``compute(p)`` copies of ``b``: same slices, at least as much capacity. So an
optimal mix holds fewer than ``compute(b)`` replicas of every other profile,
and the other profiles together use at most ``6 * (1+2+3+4) = 60`` slices.
A tiny knapsack over those 60 slices plus "fill the rest with ``b``" is exact.
Worked number (ResNet-50 on A100-80GB, docs/profile-throughput.md): 1g=127, 2g=171, 7g=192
req/s. Efficiency 127 > 85.5 > 27 per slice, so 400 req/s -> 4 x 1g (4
slices, 508 req/s) rather than one 7g (7 slices, 192 req/s is not even enough).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from autoscaler.mig.products import Product
from autoscaler.policy.types import ModelSpec

# Demand is met when capacity >= demand - EPS (floating-point slack, req/s).
EPS = 1e-9


@dataclass(frozen=True)
class ProfileOption:
    """One usable profile for one model: its name, req/s per replica and compute slices."""

    name: str
    cap: float
    compute: int
    mem_slots: int

    @property
    def efficiency(self) -> float:
        return self.cap / self.compute


def usable_profiles(spec: ModelSpec, products: Iterable[Product]) -> list[ProfileOption]:
    """The model's usable profiles that exist on at least one of ``products``.

    Sorted by efficiency (best first), then by capacity, then by name so the
    order (and everything planned from it) is deterministic.
    """
    allowed = set(spec.allowed_profiles)
    seen: dict[str, ProfileOption] = {}
    for product in products:
        for name, prof in product.profiles.items():
            if name in seen or name not in allowed:
                continue
            cap = float(spec.capacity.get(name, 0.0) or 0.0)
            if not cap > 0 or math.isinf(cap):
                continue
            if spec.memory_gb is not None and prof.fit_gib + EPS < spec.memory_gb:
                continue
            seen[name] = ProfileOption(name, cap, prof.compute, prof.mem_slots)
    return sorted(seen.values(), key=lambda o: (-o.efficiency, -o.cap, o.name))


def required_min(spec: ModelSpec) -> int:
    """Replica floor: min_replicas, and 2 when the model asks for high availability."""
    floor = max(0, spec.min_replicas)
    if spec.high_availability:
        floor = max(floor, 2)
    return min(floor, max(spec.max_replicas, 0))


@lru_cache(maxsize=4096)
def _others_table(others: tuple[tuple[float, int], ...], limit: int) -> tuple[tuple[float, int, tuple[int, ...]], ...]:
    """For every slice total s, the best (capacity, -replicas) using ``others``.

    Each other profile is used fewer than ``limit`` times (the exchange bound).
    Returns a tuple indexed by s of (cap, replicas, counts) or (-1, 0, ()) when
    s slices cannot be spent exactly.
    """
    max_s = sum((limit - 1) * c for _, c in others)
    # table[s] = (cap, replicas, counts)
    table: list[tuple[float, int, tuple[int, ...]] | None] = [None] * (max_s + 1)
    table[0] = (0.0, 0, tuple(0 for _ in others))
    for i, (cap, comp) in enumerate(others):
        new = list(table)
        for s, entry in enumerate(table):
            if entry is None:
                continue
            for k in range(1, limit):
                s2 = s + k * comp
                if s2 > max_s:
                    break
                counts = list(entry[2])
                counts[i] += k
                cand = (entry[0] + k * cap, entry[1] + k, tuple(counts))
                cur = new[s2]
                if cur is None or (cand[0], -cand[1]) > (cur[0], -cur[1]):
                    new[s2] = cand
        table = new
    return tuple(t if t is not None else (-1.0, 0, ()) for t in table)


def cover(demand: float, options: list[ProfileOption], floor: int = 0, ceiling: int | None = None) -> dict[str, int]:
    """Fewest-slices mix of ``options`` with capacity >= ``demand``.

    Ties: fewer replicas, then more capacity. ``floor``: at least that many
    replicas (extra ones are the cheapest profile). ``ceiling``: at most that
    many; when ``ceiling`` replicas cannot meet the demand the result is the
    biggest-capacity mix of ``ceiling`` replicas (the caller reports the
    shortfall). Empty options -> empty mix.
    """
    if not options:
        return {}
    demand = max(0.0, demand)
    mix = _min_slices(demand, options)
    n = sum(mix.values())
    if ceiling is not None and n > ceiling:
        mix = _bounded(demand, options, ceiling)
        n = sum(mix.values())
    if n < floor:
        # The floor's extra replicas are the smallest profile (1 slice, best capacity)...
        small = min(options, key=lambda o: (o.compute, -o.cap, o.name))
        mix[small.name] = mix.get(small.name, 0) + (floor - n)
        # ...unless another mix with at least ``floor`` replicas is cheaper: HA
        # with 272 req/s on 3g=201/4g=295 is 2 x 3g (6 slices), not 4g + 3g (7);
        # a floor of 2 at 124 req/s on 1g=49/3g=157 is 3 x 1g (3), not 3g + 1g (4).
        alt = _bounded(demand, options, ceiling if ceiling is not None else floor + 7, floor)
        if alt and mix_slices(alt, options) < mix_slices(mix, options):
            mix = alt
    return {k: v for k, v in mix.items() if v > 0}


def _min_slices(demand: float, options: list[ProfileOption]) -> dict[str, int]:
    best = options[0]
    others = options[1:]
    if demand <= EPS:
        return {}
    table = _others_table(tuple((o.cap, o.compute) for o in others), best.compute) if others else ((0.0, 0, ()),)
    choice: tuple[int, int, float, int] | None = None  # (slices, replicas, -cap, s)
    for s, (cap_o, reps_o, _counts) in enumerate(table):
        if cap_o < 0:
            continue
        rest = demand - cap_o
        n_best = 0 if rest <= EPS else math.ceil((rest - EPS) / best.cap)
        key = (s + n_best * best.compute, reps_o + n_best, -(cap_o + n_best * best.cap), s)
        if choice is None or key < choice:
            choice = key
    assert choice is not None
    s = choice[3]
    cap_o, _, counts = table[s]
    mix = {o.name: c for o, c in zip(others, counts) if c}
    rest = demand - cap_o
    n_best = 0 if rest <= EPS else math.ceil((rest - EPS) / best.cap)
    if n_best:
        mix[best.name] = mix.get(best.name, 0) + n_best
    return mix


def _bounded(demand: float, options: list[ProfileOption], ceiling: int, floor: int = 0) -> dict[str, int]:
    """At most ``ceiling`` replicas: fewest slices meeting demand, else most capacity.

    Only used when ``max_replicas`` binds. Branch and bound over the counts
    of each profile (biggest capacity first), pruned by "even all remaining
    replicas on the biggest profile left cannot reach the demand" and by a
    slices lower bound from the best remaining efficiency. Five profiles and
    a ceiling of 16 take a few hundred steps.
    """
    if ceiling <= 0:
        return {}
    opts = sorted(options, key=lambda o: (-o.cap, o.compute, o.name))
    if ceiling * opts[0].cap < demand - EPS:
        # Cannot meet it: the most capacity, on the cheapest of the biggest profiles.
        top = min((o for o in opts if o.cap >= opts[0].cap - EPS), key=lambda o: (o.compute, o.name))
        return {top.name: ceiling}
    best_eff = [max(o.efficiency for o in opts[i:]) for i in range(len(opts))]
    small = min(opts, key=lambda o: (o.compute, -o.cap, o.name))
    best: list = [math.inf, None]
    counts = [0] * len(opts)

    def rec(i: int, left: int, need: float, slices: int) -> None:
        if need <= EPS:
            # Short of the floor: pad with the smallest profile.
            pad = max(0, floor - (ceiling - left))
            if pad <= left and slices + pad * small.compute < best[0]:
                got = list(counts)
                got[opts.index(small)] += pad
                best[0], best[1] = slices + pad * small.compute, got
            return
        if i >= len(opts) or left <= 0 or left * opts[i].cap < need - EPS:
            return
        if slices + need / best_eff[i] >= best[0] - EPS:
            return
        o = opts[i]
        for k in range(min(left, math.ceil((need - EPS) / o.cap)), -1, -1):
            counts[i] = k
            rec(i + 1, left - k, need - k * o.cap, slices + k * o.compute)
        counts[i] = 0

    rec(0, ceiling, demand, 0)
    return {o.name: c for o, c in zip(opts, best[1] or []) if c}


def mix_capacity(mix: Mapping[str, int], options: list[ProfileOption]) -> float:
    caps = {o.name: o.cap for o in options}
    return sum(caps.get(p, 0.0) * n for p, n in mix.items())


def mix_slices(mix: Mapping[str, int], options: list[ProfileOption]) -> int:
    comp = {o.name: o.compute for o in options}
    return sum(comp.get(p, 0) * n for p, n in mix.items())


def alternatives(demand: float, options: list[ProfileOption], floor: int, ceiling: int,
                 *, limit: int = 8, slack: int = 7, budget: int = 4000) -> list[dict[str, int]]:
    """Other minimal mixes that also cover ``demand`` (for the small-cluster search).

    Minimal: no replica can be dropped without breaking the demand or the
    floor. At most ``limit`` mixes within ``slack`` slices of the cheapest,
    cheapest first; the enumeration stops after ``budget`` steps.
    """
    demand = max(0.0, demand)
    opts = sorted(options, key=lambda o: (-o.cap, o.name))
    best = cover(demand, options, floor, ceiling)
    top = mix_slices(best, options) + slack
    found: list[tuple[int, int, dict[str, int]]] = []
    steps = 0

    def rec(i: int, mix: dict[str, int], cap: float, n: int, s: int) -> None:
        nonlocal steps
        steps += 1
        if steps > budget or s > top or n > ceiling:
            return
        if cap >= demand - EPS and n >= floor:
            ok = all(
                not (cap - o.cap >= demand - EPS and n - 1 >= floor) for o in opts if mix.get(o.name)
            )
            if ok:
                found.append((s, n, dict(mix)))
            return
        if i >= len(opts):
            return
        o = opts[i]
        most = ceiling - n
        for k in range(most, -1, -1):
            if s + k * o.compute > top:
                continue
            if k:
                mix[o.name] = k
            else:
                mix.pop(o.name, None)
            rec(i + 1, mix, cap + k * o.cap, n + k, s + k * o.compute)
        mix.pop(o.name, None)

    rec(0, {}, 0.0, 0, 0)
    found.sort(key=lambda t: (t[0], t[1], sorted(t[2].items())))
    out: list[dict[str, int]] = []
    for _s, _n, mix in found:
        if mix not in out:
            out.append(mix)
        if len(out) >= limit:
            break
    return out
