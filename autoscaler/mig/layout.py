"""MIG layouts: validity, maximal layouts, and where to put one more instance.

Pure math on the geometry in ``products.py``. A layout is a tuple of
``Placement(profile, start)``; it is valid when every start is allowed for its
profile, no two instances share a memory slot, total compute fits the GPU, and
at most one ``+me`` instance exists. With the five standard kinds an
A100/H100 has exactly 19 maximal layouts (docs/mig-geometry.md); a test pins that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

from autoscaler.mig.products import STANDARD_KINDS, Product, Profile


class LayoutError(ValueError):
    """A layout that breaks a placement rule; the message says which."""


class Placement(NamedTuple):
    """One MIG instance of a layout. A named tuple, not a dataclass: planning 8,000 GPUs
    sorts, hashes and compares millions of these, and a tuple does that in C."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def to_json(self) -> dict:
        return {"profile": self.profile, "start": self.start}


def parse_layout(text: str) -> tuple[Placement, ...]:
    """Parse ``"3g.40gb@0,3g.40gb@4"``; raises LayoutError on bad syntax."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, start = part.rpartition("@")
        if not sep or not name or not start.strip().isdigit():
            raise LayoutError(f"{part!r}: expected PROFILE@START, e.g. 3g.40gb@4")
        out.append(Placement(int(start), name.strip()))
    return tuple(sorted(out))


def check_layout(product: Product, layout: Iterable[Placement]) -> list[str]:
    """Every rule the layout breaks, as human-readable strings (empty when valid)."""
    problems: list[str] = []
    used: dict[int, Placement] = {}
    compute = 0
    me = 0
    for pl in sorted(layout):
        prof = product.profiles.get(pl.profile)
        if prof is None:
            problems.append(f"{pl}: profile {pl.profile!r} is not valid for {product.name}")
            continue
        if pl.start not in prof.starts:
            problems.append(
                f"{pl}: {pl.profile} may start only at slots {list(prof.starts)}, got {pl.start}"
            )
            continue
        for slot in prof.span(pl.start):
            if slot in used:
                problems.append(f"{pl}: overlaps {used[slot]} at memory slot {slot}")
                break
            used[slot] = pl
        compute += prof.compute
        me += prof.kind == "1g+me"
    if compute > product.compute_slices:
        problems.append(f"uses {compute} compute slices, {product.name} has {product.compute_slices}")
    if me > 1:
        problems.append(f"{me} '+me' instances, at most one per GPU")
    return problems


def _occupied(product: Product, layout: Iterable[Placement]) -> tuple[frozenset[int], int, int]:
    slots: set[int] = set()
    compute = 0
    me = 0
    for pl in layout:
        prof = product.profiles[pl.profile]
        slots.update(prof.span(pl.start))
        compute += prof.compute
        me += prof.kind == "1g+me"
    return frozenset(slots), compute, me


def free_starts(product: Product, layout: Sequence[Placement], profile: str) -> list[int]:
    """Starts at which one more ``profile`` instance fits beside ``layout``."""
    prof = product.profile(profile)
    slots, compute, me = _occupied(product, layout)
    if compute + prof.compute > product.compute_slices or (prof.kind == "1g+me" and me):
        return []
    return [s for s in prof.starts if not slots.intersection(prof.span(s))]


def _kinds_profiles(product: Product, kinds: Sequence[str]) -> tuple[Profile, ...]:
    return tuple(p for k in kinds if (p := product.by_kind(k)) is not None)


def is_maximal(product: Product, layout: Sequence[Placement], kinds: Sequence[str] = STANDARD_KINDS) -> bool:
    return all(not free_starts(product, layout, p.name) for p in _kinds_profiles(product, kinds))


@lru_cache(maxsize=64)
def maximal_layouts(product: Product, kinds: tuple[str, ...] = STANDARD_KINDS) -> tuple[tuple[Placement, ...], ...]:
    """All maximal layouts built from ``kinds``, sorted, without duplicates."""
    profiles = _kinds_profiles(product, kinds)
    found: set[tuple[Placement, ...]] = set()

    def extend(layout: tuple[Placement, ...], min_slot: int) -> None:
        grew = False
        for prof in profiles:
            for s in free_starts(product, layout, prof.name):
                grew = True
                # Canonical order: only add instances at or after the last start so
                # each layout is generated from one path, not every permutation.
                if s >= min_slot:
                    extend(tuple(sorted(layout + (Placement(s, prof.name),))), s)
        if not grew:
            found.add(layout)

    extend((), 0)
    # The canonical-order pruning can stop a branch that could still grow at an
    # earlier slot; such a layout is not maximal, so filter by the definition.
    return tuple(sorted(l for l in found if is_maximal(product, l, kinds)))


def best_start(product: Product, layout: Sequence[Placement], profile: str) -> int | None:
    """Where to put one more ``profile`` instance so the most future options stay open.

    "Options" is the number of maximal layouts (over the standard kinds) that
    still contain the result; ties go to the highest start, so small instances
    pack from the top and leave slot 0 free for the big 4g/7g placements.
    None when it does not fit at all.
    """
    starts = free_starts(product, layout, profile)
    if not starts:
        return None
    universe = maximal_layouts(product)

    def options(start: int) -> int:
        cand = set(layout) | {Placement(start, profile)}
        return sum(1 for m in universe if cand.issubset(m))

    return max(starts, key=lambda s: (options(s), s))
