"""Shared planner types: the per-model working record of one planning pass.

A leaf module: ``core`` creates these records and ``place``, ``rightsize``
and ``urgent`` edit them, so they all import it and none imports another
for it.
"""

from __future__ import annotations

from autoscaler.policy.planner.sizing import ProfileOption, required_min
from autoscaler.policy.types import ModelSpec, Reason, Replica, ReplicaState

# Replicas that count as capacity: serving now or on their way.
HEALTHY = (ReplicaState.READY, ReplicaState.STARTING)


class ModelWork:
    """Per-model bookkeeping for one planning pass: what it keeps, what it adds, and why."""

    def __init__(self, spec: ModelSpec, options: list[ProfileOption], demand: float | None) -> None:
        self.spec = spec
        self.options = options
        self.cap = {o.name: o.cap for o in options}
        self.demand = demand
        self.floor = required_min(spec)
        self.keep: list[Replica] = []
        self.add: dict[str, int] = {}
        self.reasons: list[Reason] = []
        self.create_reason = Reason.SCALE_UP_DEMAND
        self.rebalanced = False
        self.running = 0  # healthy replicas it had when the tick began

    def target_mix(self) -> dict[str, int]:
        out = dict(self.add)
        for r in self.keep:
            out[r.profile] = out.get(r.profile, 0) + 1
        return {p: n for p, n in out.items() if n}

    def why(self, r: Reason) -> None:
        if r not in self.reasons:
            self.reasons.append(r)
