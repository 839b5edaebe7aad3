"""Warm spare slices: how many empty MIG instances to keep carved ahead, and of which profile (pure).

Place in the loop: ``decide`` records each plan's *cold* creates -- CREATEs of
a scale-up that wait for a REPARTITION of their GPU, so their replica serves
only after the repartition (180 s under the GPU operator's mig-manager) plus
its start -- and asks the planner to keep ``wanted`` empty instances carved on
GPUs already in use. A later scale-up then lands on one of them through the
planner's fast path and costs a replica start, not a repartition.

Learning: the events of the last ``window_s`` (4 h) are bucketed into spans of
one reaction horizon (repartition + start); a bucket's count is how many cold
creates one horizon needed. The number kept is the ``quantile`` (0.9) of the
buckets that had any, rounded up, bounded to ``max_spares`` (8), and 0 until
``min_events`` (3) cold creates have been seen -- a fleet that never needs a
repartition to grow carries no spares. The profile is the one cold-created
most often (ties: the smaller one, cheaper to hold). Worked number: in 4 h,
buckets with 1, 1, 2, 1 and 3 cold creates -> 0.9 quantile 2.6 -> 3 spares
of the most frequent profile. The bound only caps a runaway count: spares
cost no GPU-hours (below), and ``benchmarks/generalization.py --max-spares``
chose 8 on the development seeds as the smallest bound within 0.05 points of
the best mean attainment (0, 2, 4, 6, 8 and 16 tried).

Cost: the planner carves spares only on GPUs that already host a replica and
only on a tick with nothing short, so a spare never holds a GPU that would
otherwise be free (no GPU-hours are added by construction) and never delays
an urgent action; its slices are reported by the simulator as spare
slice-hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscaler.policy.forecast import quantile
from autoscaler.policy.types import Action, ActionKind, Reason

# Reasons of a create that adds capacity (a replacement or a move is not growth)
GROWTH = (Reason.SCALE_UP_DEMAND, Reason.PANIC_SCALE_UP, Reason.SHORTFALL, Reason.MIN_REPLICAS,
          Reason.HIGH_AVAILABILITY, Reason.FLEET_SHARE_MIN)


@dataclass(frozen=True)
class SpareConfig:
    max_spares: int = 8
    window_s: float = 4 * 3600.0
    quantile: float = 0.9
    min_events: int = 3

    def __post_init__(self) -> None:
        if not (isinstance(self.max_spares, int) and self.max_spares >= 0):
            raise ValueError(f"max_spares: must be an integer >= 0, got {self.max_spares!r}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s: must be > 0, got {self.window_s!r}")
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile: must be in (0, 1], got {self.quantile!r}")


@dataclass(frozen=True)
class SpareState:
    """Cold creates seen: ``(t_s, profile, count)``, oldest first, within the window."""

    events: tuple[tuple[float, str, int], ...] = ()


def cold_creates(actions: Sequence[Action]) -> dict[str, int]:
    """Per profile, the growth CREATEs of one plan that wait for their GPU's REPARTITION."""
    carved = {a.gpu for a in actions if a.kind is ActionKind.REPARTITION}
    out: dict[str, int] = {}
    for a in actions:
        if a.kind is ActionKind.CREATE and a.gpu in carved and a.profile and a.reason in GROWTH:
            out[a.profile] = out.get(a.profile, 0) + 1
    return out


def record(state: SpareState, now_s: float, cold: Mapping[str, int], cfg: SpareConfig = SpareConfig()
           ) -> SpareState:
    """Add this plan's cold creates; forget what left the window (bounded: one event per
    profile per plan, so at most window / tick x profiles entries)."""
    keep = tuple(e for e in state.events if e[0] > now_s - cfg.window_s)
    new = tuple((now_s, p, int(n)) for p, n in sorted(cold.items()) if n > 0)
    if not new and len(keep) == len(state.events):
        return state
    return SpareState(keep + new)


def wanted(state: SpareState, now_s: float, horizon_s: float, cfg: SpareConfig = SpareConfig()
           ) -> dict[str, int]:
    """profile -> empty instances to keep carved ({} : none)."""
    events = [e for e in state.events if e[0] > now_s - cfg.window_s]
    total = sum(n for _, _, n in events)
    if cfg.max_spares == 0 or total < cfg.min_events:
        return {}
    span = max(horizon_s, 1.0)
    buckets: dict[int, int] = {}
    by_profile: dict[str, int] = {}
    for t, p, n in events:
        k = math.floor((now_s - t) / span)
        buckets[k] = buckets.get(k, 0) + n
        by_profile[p] = by_profile.get(p, 0) + n
    q = quantile(sorted(buckets.values()), cfg.quantile)
    n = min(cfg.max_spares, math.ceil(q - 1e-9))
    if n <= 0:
        return {}
    profile = min(by_profile, key=lambda p: (-by_profile[p], _slices(p), p))
    return {profile: n}


def _slices(profile: str) -> int:
    """Compute slices in a MIG profile name ("3g.40gb" -> 3); unknown shapes sort last."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 99
