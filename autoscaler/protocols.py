"""Small adapter protocols at the edges of the loop: read metrics, read inventory, act.

Each has one implementation per backend (local processes, Kubernetes, the
simulator) plus a recording fake (``autoscaler.fakes``). The pure core never
imports this module; ``loop.py`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from autoscaler.policy.types import Action, ClusterState, ModelSignals, ReplicaSignals


class MetricsSource(Protocol):
    def read(
        self, models: Sequence[str], replicas: Sequence[str], now_s: float
    ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        """Signals per model and replica; raises on a total outage (the loop then holds)."""
        ...


class Inventory(Protocol):
    def snapshot(self) -> ClusterState: ...


class Actuator(Protocol):
    def apply(self, actions: Sequence[Action]) -> list[str]:
        """Carry out actions in order; returns one line per action that failed."""
        ...

    def converging(self) -> bool:
        """True while earlier actions (starts, drains, repartitions) are still in flight."""
        ...
