"""Recording fakes for the loop's three edges, shipped so tests and the simulator share them.

- ``FakeMetricsSource``: scripted per-model signals, an ``outage`` switch
  (every read raises, as a dead Prometheus does) and a one-shot ``next_error``;
  ``read_calls`` records every read.
- ``FakeInventory``: a ClusterState you can set; the actuator updates it.
- ``RecordingActuator``: records ``apply_calls`` and carries them out on the
  inventory's ClusterState under the actuator contract (``protocols.py``);
  fails once with ``next_error``; replicas it starts can be made to fail.
- ``stub_planner``: a deliberately naive stand-in for
  ``autoscaler.policy.planner.core.plan`` (one profile per model, no MIG geometry)
  for tests that exercise the loop rather than placement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from autoscaler.mig import Placement, check_layout, get_product
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
from autoscaler.protocols import WAIT, ActionQueue, Chain, InFlight, action_groups, describe

WHOLE = "whole"  # the planner's profile for a GPU held whole by a multinode group

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
    """An in-memory actuator over ``inventory.cluster`` that follows the contract of ``protocols.py``.

    It records every ``apply`` in ``apply_calls`` and then carries the actions
    out exactly as a backend must (chains, waits, skip-after-error,
    idempotency, ``in_flight``, ``take_errors``), with the world reduced to a
    ``ClusterState``: a repartition is instant, and a created replica is READY
    at once -- or, with ``instant=False``, STARTING until ``settle()`` (which
    also finishes drains and deletes), so queued work can be observed.

    - ``geometry=False``: a CREATE does not check that its MIG instance exists
      and is free. Only for loop tests driven by ``stub_planner``, which places
      without MIG geometry; every other rule still holds.
    - ``fail_starts``: replica ids (or model names) whose start fails: they end
      FAILED instead of READY, as a crash-looping pod does.
    - ``next_error``: an Exception is raised by the next ``apply``; a string is
      returned as that apply's only error line and nothing is applied.
    - ``converging()`` (not part of the contract): anything queued, starting
      or draining -- what a harness waits on before it asserts.
    """

    def __init__(
        self,
        inventory: FakeInventory | None = None,
        *,
        geometry: bool = True,
        instant: bool = True,
        fail_starts: Iterable[str] = (),
    ) -> None:
        self.inventory = inventory or FakeInventory()
        self.apply_calls: list[tuple[Action, ...]] = []
        self.next_error: Exception | str | None = None
        self.geometry = geometry
        self.instant = instant
        self.fail_starts = set(fail_starts)
        self.queue = ActionQueue()
        self._deleting: set[str] = set()  # replicas whose DELETE waits for settle() (instant=False)
        self._seq = 0
        self.now_s = 0.0  # stamped on created replicas (``since_s``) by the planner's helper

    # ------------------------------------------------------------ Actuator
    def apply(self, actions: Sequence[Action]) -> list[str]:
        self.apply_calls.append(tuple(actions))
        if self.next_error is not None:
            err, self.next_error = self.next_error, None
            if isinstance(err, Exception):
                raise err
            return [err]
        self.queue.run(self._step, self.now_s)
        fresh = self.queue.submit(actions, self._owner)
        errors = self.queue.run(self._step, self.now_s, fresh)
        return errors

    def in_flight(self) -> InFlight:
        self.queue.run(self._step, self.now_s)  # chains a DELETE unblocked move on first
        gpus, models = self.queue.busy(self._owner)
        for r in self.inventory.cluster.replicas:
            if r.state is ReplicaState.DRAINING or r.id in self._deleting:
                gpus.add(r.gpu)
        return frozenset(gpus), frozenset(models)

    def take_errors(self) -> list[str]:
        return self.queue.take_errors()

    def groups(self, actions: Sequence[Action]) -> list[int]:
        return action_groups(actions, self._owner)

    def converging(self) -> bool:
        return bool(self.queue) or any(
            r.state in (ReplicaState.STARTING, ReplicaState.DRAINING) for r in self.inventory.cluster.replicas
        )

    def settle(self) -> None:
        """Let time pass (``instant=False``): starts finish, deleted replicas go, queued chains move on."""
        reps = []
        for r in self.inventory.cluster.replicas:
            if r.id in self._deleting:
                continue
            if r.state is ReplicaState.STARTING:
                failed = r.id in self.fail_starts or r.model in self.fail_starts
                r = dataclasses.replace(r, state=ReplicaState.FAILED if failed else ReplicaState.READY)
            reps.append(r)
        self._deleting.clear()
        self._set(replicas=reps)
        self.queue.run(self._step, self.now_s)

    # ------------------------------------------------------------ one action
    def _owner(self, rid: str) -> tuple[str, str] | None:
        r = self._replica(rid)
        return (r.gpu, r.model) if r is not None else None

    def _replica(self, rid: str | None) -> Replica | None:
        return next((r for r in self.inventory.cluster.replicas if r.id == rid), None)

    def _set(self, *, gpus: Sequence[GpuState] | None = None, replicas: Sequence[Replica] | None = None) -> None:
        c = self.inventory.cluster
        self.inventory.cluster = ClusterState(
            gpus=tuple(gpus) if gpus is not None else c.gpus,
            replicas=tuple(replicas) if replicas is not None else c.replicas,
        )

    def _step(self, a: Action, chain: Chain, now: float) -> str | None:
        k = a.kind
        if k is ActionKind.CREATE:
            return self._create(a, chain)
        if k is ActionKind.WAIT_READY:
            targets = [a.replica] if a.replica else list(chain.created)
            if not targets and a.gpu is not None and a.start is not None:
                targets = [r.id for r in self.inventory.cluster.replicas
                           if (r.gpu, r.start) == (a.gpu, a.start) and a.model in (None, r.model)]
            for rid in targets:
                if self.queue.superseded(rid):
                    continue  # a later plan removed it: nothing left to wait for
                r = self._replica(rid)
                if r is None:
                    return f"{describe(a)}: replica {rid} does not exist"
                if r.state is ReplicaState.FAILED:
                    return f"{describe(a)}: replica {rid} failed to start"
                if r.state is not ReplicaState.READY:
                    return WAIT
            return None
        r = self._replica(a.replica)
        if k is ActionKind.DRAIN:
            if r is not None:
                self._draining(r.id)
            return None
        if k is ActionKind.DELETE:
            if r is None:
                return None  # already gone: deleting is idempotent
            if self.instant:
                self._set(replicas=[x for x in self.inventory.cluster.replicas if x.id != r.id])
            else:
                self._deleting.add(r.id)
                self._draining(r.id)
            return None
        if k is ActionKind.REPARTITION:
            return self._repartition(a)
        return f"{describe(a)}: not supported"

    def _draining(self, rid: str) -> None:
        self._set(replicas=[dataclasses.replace(x, state=ReplicaState.DRAINING, since_s=self.now_s)
                            if x.id == rid and x.state is not ReplicaState.DRAINING else x
                            for x in self.inventory.cluster.replicas])

    def _create(self, a: Action, chain: Chain) -> str | None:
        c = self.inventory.cluster
        gpu = next((g for g in c.gpus if g.id == a.gpu), None)
        if a.model is None or a.profile is None or a.start is None:
            return f"{describe(a)}: CREATE needs model, gpu, profile and start"
        existing = self._replica(a.replica)
        if existing is not None:
            same = (existing.gpu, existing.start, existing.model, existing.profile) == (
                a.gpu, a.start, a.model, a.profile)
            if same:
                chain.created.append(existing.id)
                return None  # applied again after it took effect: nothing to do
            return f"{describe(a)}: replica id {a.replica} already exists on {existing.gpu}@{existing.start}"
        if self.geometry:
            if gpu is None:
                return f"{describe(a)}: unknown gpu {a.gpu!r}"
            if a.profile == WHOLE:
                if gpu.mig_enabled:
                    return f"{describe(a)}: {gpu.id} is in MIG mode; a whole-GPU member needs REPARTITION whole first"
            elif not gpu.mig_enabled or Placement(a.start, a.profile) not in gpu.layout:
                return f"{describe(a)}: {gpu.id} has no MIG instance {Placement(a.start, a.profile)} (carve it first)"
            occ = self._occupant(gpu, a.profile, a.start)
            if occ is not None:
                if occ.state is ReplicaState.DRAINING or occ.id in self._deleting:
                    return WAIT
                return f"{describe(a)}: instance taken by {occ.id}"
        self._seq += 1
        rid = a.replica or f"{a.model}-{self._seq}"
        state = ReplicaState.STARTING
        if self.instant:
            failed = rid in self.fail_starts or a.model in self.fail_starts
            state = ReplicaState.FAILED if failed else ReplicaState.READY
        rep = Replica(rid, a.model, a.profile, a.gpu or "", a.start, state, self.now_s)
        self._set(replicas=[*c.replicas, rep])
        chain.created.append(rid)
        return None

    def _occupant(self, gpu: GpuState, profile: str, start: int) -> Replica | None:
        if profile == WHOLE or not gpu.mig_enabled:
            return next((r for r in self.inventory.cluster.replicas if r.gpu == gpu.id), None)
        product = get_product(gpu.product)
        span = set(product.profile(profile).span(start))
        for r in self.inventory.cluster.replicas:
            if r.gpu == gpu.id and r.profile in product.profiles and span & set(product.profile(r.profile).span(r.start)):
                return r
        return None

    def _repartition(self, a: Action) -> str | None:
        c = self.inventory.cluster
        gpu = next((g for g in c.gpus if g.id == a.gpu), None)
        if gpu is None:
            return f"{describe(a)}: unknown gpu {a.gpu!r}"
        whole = a.profile == WHOLE
        target = () if whole else tuple(sorted(a.layout or ()))
        if not whole:
            problems = check_layout(get_product(gpu.product), target)
            if problems:
                return f"{describe(a)}: invalid layout: {'; '.join(problems)}"
            if gpu.mig_enabled and target == tuple(sorted(gpu.layout)):
                return None  # already so
        elif not gpu.mig_enabled and gpu.reserved_by == a.model:
            return None
        for r in c.replicas:
            if r.gpu != gpu.id or (not whole and gpu.mig_enabled and Placement(r.start, r.profile) in target):
                continue
            if r.state is ReplicaState.DRAINING or r.id in self._deleting or self._removal_queued(r.id):
                return WAIT
            return f"{describe(a)}: instance {r.profile}@{r.start} still serves {r.id}"
        new = dataclasses.replace(gpu, layout=target, mig_enabled=not whole,
                                  reserved_by=a.model if whole else None)
        self._set(gpus=[new if g.id == gpu.id else g for g in c.gpus])
        return None

    def _removal_queued(self, rid: str) -> bool:
        return any(x.kind in (ActionKind.DRAIN, ActionKind.DELETE) and x.replica == rid
                   for ch in self.queue.chains for x in ch.actions)

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
