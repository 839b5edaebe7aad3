"""Recording fakes for the loop's three edges, shipped so tests and the simulator share them.

- ``FakeMetricsSource``: scripted per-model signals, an ``outage`` switch
  (every read raises, as a dead Prometheus does) and a one-shot ``next_error``;
  ``read_calls`` records every read.
- ``FakeInventory``: a ClusterState you can set; the actuator updates it.
- ``RecordingActuator``: records ``apply_calls``, fails once with
  ``next_error``, applies actions to the inventory's ClusterState, and can
  report ``converging()`` for a number of calls after each apply.
- ``stub_planner``: a deliberately naive stand-in for
  ``autoscaler.policy.planner.core.plan`` (one profile per model, no MIG geometry)
  for tests that exercise the loop rather than placement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from autoscaler.policy.types import (
    Action,
    ActionKind,
    ClusterState,
    Cost,
    GpuState,
    ModelSignals,
    ModelSpec,
    Plan,
    Reason,
    Replica,
    ReplicaSignals,
    ReplicaState,
)

Script = Callable[[float], Mapping[str, ModelSignals | None]]


class FakeMetricsSource:
    def __init__(
        self,
        signals: Mapping[str, ModelSignals | None] | None = None,
        script: Script | None = None,
        replicas: Mapping[str, ReplicaSignals] | None = None,
    ) -> None:
        self.signals: dict[str, ModelSignals | None] = dict(signals or {})
        self.script = script
        self.replica_signals: dict[str, ReplicaSignals] = dict(replicas or {})
        self.outage = False
        self.next_error: Exception | None = None
        self.read_calls: list[tuple[tuple[str, ...], tuple[str, ...], float]] = []
        self.last_notes: tuple[str, ...] = ()

    def set_rate(self, model: str, rps: float | None, **fields: float | None) -> None:
        """Script a model's request rate (None: its series is absent)."""
        self.signals[model] = (
            None if rps is None else ModelSignals(model=model, t_s=None, request_rate=rps, **fields)
        )

    def read(self, models: Sequence[str], replicas: Sequence[str], now_s: float):
        self.read_calls.append((tuple(models), tuple(replicas), now_s))
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            raise err
        if self.outage:
            raise ConnectionError("fake metrics source: outage")
        src = self.script(now_s) if self.script is not None else self.signals
        out: dict[str, ModelSignals | None] = {}
        for m in models:
            sig = src.get(m)
            if sig is not None and sig.t_s is None:
                sig = dataclasses.replace(sig, t_s=now_s)  # "just sampled"
            out[m] = sig
        reps = {r: s for r, s in self.replica_signals.items() if r in set(replicas)}
        return out, reps


class FakeInventory:
    def __init__(self, cluster: ClusterState | None = None) -> None:
        self.cluster = cluster or ClusterState()
        self.snapshot_calls = 0
        self.next_error: Exception | None = None

    def snapshot(self) -> ClusterState:
        self.snapshot_calls += 1
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            raise err
        return self.cluster


class RecordingActuator:
    """Records and applies actions to ``inventory.cluster``.

    ``next_error``: an Exception is raised by the next ``apply``; a string is
    returned as that apply's error line (actions are then not applied).
    ``converge_calls``: after an apply, ``converging()`` answers True this many times.
    """

    def __init__(self, inventory: FakeInventory | None = None, converge_calls: int = 0) -> None:
        self.inventory = inventory or FakeInventory()
        self.apply_calls: list[tuple[Action, ...]] = []
        self.next_error: Exception | str | None = None
        self.converge_calls = converge_calls
        self._converging_left = 0
        self._seq = 0
        self.now_s = 0.0  # stamped on created replicas (``since_s``) by the planner's helper

    def apply(self, actions: Sequence[Action]) -> list[str]:
        self.apply_calls.append(tuple(actions))
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            if isinstance(err, Exception):
                raise err
            return [err]
        self.inventory.cluster = self.apply_to(self.inventory.cluster, actions)
        self._converging_left = self.converge_calls
        return []

    def converging(self) -> bool:
        if self._converging_left > 0:
            self._converging_left -= 1
            return True
        return False

    def apply_to(self, cluster: ClusterState, actions: Sequence[Action]) -> ClusterState:
        """Created replicas are READY at once, deletes remove, repartitions set the layout.

        Uses the planner's ``apply_plan_to_cluster`` when the actions carry replica
        ids (the real planner names new replicas); otherwise a minimal version here.
        """
        try:
            from autoscaler.policy.planner.actions import apply_plan_to_cluster
        except ImportError:  # planner not installed alongside: the minimal path below
            apply_plan_to_cluster = None
        if apply_plan_to_cluster is not None and all(
            a.replica for a in actions if a.kind == ActionKind.CREATE
        ):
            shell = Plan(
                t_s=self.now_s,
                desired={},
                assignments=(),
                layouts={},
                actions=tuple(actions),
                shortfall={},
                cost=Cost(),
                reasons={},
            )
            return apply_plan_to_cluster(cluster, shell)
        replicas = list(cluster.replicas)
        gpus = {g.id: g for g in cluster.gpus}
        for a in actions:
            if a.kind == ActionKind.CREATE:
                self._seq += 1
                rid = a.replica or f"{a.model}-{self._seq}"
                replicas.append(
                    Replica(
                        rid, a.model or "", a.profile or "", a.gpu or "", a.start or 0, ReplicaState.READY
                    )
                )
            elif a.kind == ActionKind.DRAIN:
                replicas = [
                    dataclasses.replace(r, state=ReplicaState.DRAINING) if r.id == a.replica else r
                    for r in replicas
                ]
            elif a.kind == ActionKind.DELETE:
                replicas = [r for r in replicas if r.id != a.replica]
            elif a.kind == ActionKind.REPARTITION and a.gpu in gpus and a.layout is not None:
                gpus[a.gpu] = dataclasses.replace(gpus[a.gpu], layout=tuple(a.layout))
        return ClusterState(gpus=tuple(gpus.values()), replicas=tuple(replicas))

    # counts that tests assert on
    def count(self, kind: ActionKind, model: str | None = None) -> int:
        return sum(
            1
            for call in self.apply_calls
            for a in call
            if a.kind == kind and (model is None or a.model == model)
        )


def stub_planner(
    models: Sequence[ModelSpec],
    demand_rps: Mapping[str, float],
    cluster: ClusterState,
    *,
    churn_budget: int | None = None,
    now_s: float = 0.0,
    fast_path: bool = True,  # accepted for the real planner's signature; the stub has no fast path
) -> Plan:
    """Naive planner: replicas of each model's first profile, ceil(demand / capacity),
    within min/max; removes the newest replicas first. No MIG geometry."""
    actions: list[Action] = []
    desired: dict[tuple[str, str], int] = {}
    reasons: dict[str, tuple[Reason, ...]] = {}
    capacity: dict[str, float] = {}
    budget = churn_budget if churn_budget is not None else 10**9
    gpu = cluster.gpus[0].id if cluster.gpus else "gpu-0"
    for spec in models:
        profile = spec.allowed_profiles[0] if spec.allowed_profiles else "whole"
        cap = spec.capacity.get(profile) or spec.group_capacity_rps or 1.0
        want = math.ceil(max(0.0, demand_rps.get(spec.name, 0.0)) / cap - 1e-9)
        want = max(spec.min_replicas, min(spec.max_replicas, want))
        live = [
            r
            for r in cluster.replicas
            if r.model == spec.name and r.state in (ReplicaState.STARTING, ReplicaState.READY)
        ]
        desired[(spec.name, profile)] = want
        capacity[spec.name] = want * cap
        why: tuple[Reason, ...] = (Reason.KEEP,)
        if want > len(live):
            why = (Reason.SCALE_UP_DEMAND,)
            for _ in range(want - len(live)):
                if budget <= 0:
                    why += (Reason.CHURN_BUDGET,)
                    break
                budget -= 1
                actions.append(
                    Action(
                        ActionKind.CREATE,
                        Reason.SCALE_UP_DEMAND,
                        gpu=gpu,
                        model=spec.name,
                        profile=profile,
                        start=0,
                    )
                )
        elif want < len(live):
            why = (Reason.SCALE_DOWN_DEMAND,)
            for r in list(reversed(live))[: len(live) - want]:
                if budget <= 0:
                    why += (Reason.CHURN_BUDGET,)
                    break
                budget -= 1
                actions.append(
                    Action(ActionKind.DRAIN, Reason.SCALE_DOWN_DEMAND, replica=r.id, model=spec.name)
                )
                actions.append(
                    Action(ActionKind.DELETE, Reason.SCALE_DOWN_DEMAND, replica=r.id, model=spec.name)
                )
        reasons[spec.name] = why
    return Plan(
        t_s=now_s,
        desired=desired,
        assignments=(),
        layouts={},
        actions=tuple(actions),
        shortfall={},
        cost=Cost(),
        reasons=reasons,
        capacity_rps=capacity,
        target_rps=dict(demand_rps),
    )


def single_gpu_cluster(product: str = "A100-SXM4-80GB", replicas: Sequence[Replica] = ()) -> ClusterState:
    """A one-GPU cluster for tests: ``node-a/0`` with an empty layout."""
    return ClusterState(gpus=(GpuState("node-a/0", "node-a", product, layout=()),), replicas=tuple(replicas))
