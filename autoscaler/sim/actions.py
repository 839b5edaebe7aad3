"""``SimActions``: the Actuator side of ``SimCluster`` (what the loop's actions do).

Place in the loop: the simulator's stand-in for a backend's apply path. It
follows the actuator contract of ``autoscaler/protocols.py`` with the
simulator's delays: a replica is READY ``start_delay_s`` after its CREATE (or
after the repartition of its GPU), a drain takes ``drain_s``, a repartition
``repartition_delay_s``. Actions are split into chains (``ActionQueue``); a
WAIT_READY, a CREATE on an instance still draining and a REPARTITION of one
make the rest of their chain wait, and ``SimCluster._timers`` moves the queued
chains on as simulated time passes. A DELETE of a draining replica does not
make its chain wait: the replica goes when its drain ends.

Faults: ``fail_starts`` (replica ids or model names) makes a replica's start
fail -- it turns FAILED where it would have turned READY, as a crash-looping
pod does -- so the contract suite can exercise a WAIT_READY that never
succeeds. The benchmarks never set it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from autoscaler.mig import Placement, check_layout, get_product
from autoscaler.policy.types import Action, ActionKind, GpuState, ModelSpec, ReplicaState
from autoscaler.protocols import WAIT, ActionQueue, Chain, InFlight, action_groups, describe
from autoscaler.sim.records import Repartition, SimConfig, SimReplica

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.clock import VirtualClock


class SimActions:
    """Mixed into ``SimCluster``; uses its ``config``, ``clock``, ``gpus``, ``specs``,
    ``_reps``, ``_repart``, ``_add``, ``_remove`` and ``_timers``."""

    config: SimConfig
    clock: VirtualClock
    gpus: dict[str, GpuState]
    specs: dict[str, ModelSpec]
    _reps: dict[str, SimReplica]
    _repart: dict[str, Repartition]
    queue: ActionQueue
    late_errors: list[str]
    fail_starts: set[str]
    apply_calls: list[tuple[float, tuple[Action, ...]]]
    creates: int
    reconfigurations: int
    _add: Callable[..., str]  # SimCluster._add: a new replica record, its id
    _remove: Callable[[SimReplica], None]
    _timers: Callable[[float], None]  # due repartitions, starts and drains, then the queued chains

    # ------------------------------------------------------------ Actuator

    def apply(self, actions: Sequence[Action]) -> list[str]:
        now = self.clock.now()
        self._timers(now)
        self.apply_calls.append((now, tuple(actions)))
        fresh = self.queue.submit(actions, self._owner)
        return self._run_queue(now, fresh)

    def converging(self) -> bool:
        self._timers(self.clock.now())
        return bool(
            self.queue
            or self._repart
            or any(r.state in (ReplicaState.STARTING, ReplicaState.DRAINING) for r in self._reps.values())
        )

    def in_flight(self) -> InFlight:
        """(GPUs, models) with work under way: a repartition, a drain, or actions still queued.

        A replica that is merely STARTING is not listed, and nor is a queued
        WAIT_READY on it: it is capacity on its way, which the snapshot shows
        and the policy already counts. What the snapshot cannot show yet --
        a queued CREATE, DRAIN, DELETE or REPARTITION -- makes its GPU and
        model busy. A FAILED replica is not: nothing here restarts it, so it
        is the planner's to replace.
        """
        if not self.config.in_flight_hook:
            if not self.converging():
                return frozenset(), frozenset()
            return frozenset(self.gpus), frozenset(self.models)
        self._timers(self.clock.now())
        gpus, models = self.queue.busy(self._owner)
        gpus |= set(self._repart) | {r.gpu for r in self._reps.values() if r.state == ReplicaState.DRAINING}
        return frozenset(gpus), frozenset(models)

    def take_errors(self) -> list[str]:
        self._timers(self.clock.now())
        return self.queue.take_errors()

    def groups(self, actions: Sequence[Action]) -> list[int]:
        return action_groups(actions, self._owner)

    def _run_queue(self, now: float, fresh: Sequence[Chain] = ()) -> list[str]:
        errors = self.queue.run(self._step, now, fresh)
        self.late_errors.extend(self.queue.last_late)
        return errors

    def _owner(self, rid: str) -> tuple[str, str] | None:
        r = self._reps.get(rid)
        return (r.gpu, r.model) if r is not None else None

    # ------------------------------------------------------------ one action

    def _find(self, a: Action) -> SimReplica | None:
        if a.replica is not None:
            return self._reps.get(a.replica)
        for r in self._reps.values():
            if r.gpu == a.gpu and r.start == a.start and (a.model is None or r.model == a.model):
                return r
        return None

    def _layout(self, gpu: str) -> tuple[Placement, ...]:
        rp = self._repart.get(gpu)
        return rp.target if rp else tuple(self.gpus[gpu].layout)

    def _occupant(self, gpu: str, start: int, profile: str) -> SimReplica | None:
        prof = get_product(self.gpus[gpu].product).profile(profile)
        span = set(prof.span(start))
        for r in self._reps.values():
            if r.gpu != gpu:
                continue
            other = get_product(self.gpus[gpu].product).profile(r.profile)
            if span.intersection(other.span(r.start)):
                return r
        return None

    def _step(self, a: Action, chain: Chain, now: float) -> str | None:
        k = a.kind
        if k == ActionKind.CREATE:
            return self._create(a, chain, now)
        if k == ActionKind.WAIT_READY:
            return self._wait_ready(a, chain, now)
        if k == ActionKind.DRAIN:
            r = self._find(a)
            if r is None:
                return None  # already gone: nothing left to route to it
            if r.state == ReplicaState.STARTING:
                self._remove(r)  # holds no request yet: it goes at once
            elif r.state != ReplicaState.DRAINING:
                r.state, r.since_s, r.drained_at = ReplicaState.DRAINING, now, now + self.config.drain_s
            return None
        if k == ActionKind.DELETE:
            r = self._find(a)
            if r is None:
                return None  # already gone: deleting is idempotent
            if r.state == ReplicaState.DRAINING and r.drained_at is not None and r.drained_at > now:
                r.delete_when_drained = True  # removed by _timers once drained; later actions need not wait
                return None
            self._remove(r)
            return None
        if k == ActionKind.REPARTITION:
            return self._repartition(a, chain, now)
        return f"{describe(a)}: not supported by the simulator"

    def _create(self, a: Action, chain: Chain, now: float) -> str | None:
        if a.gpu not in self.gpus:
            return f"create: unknown gpu {a.gpu!r}"
        spec = self.specs.get(a.model or "")
        if spec is None:
            return f"create: unknown model {a.model!r}"
        if a.profile not in spec.capacity:
            return f"create {a.model}: no capacity for profile {a.profile!r}"
        pl = Placement(a.start if a.start is not None else -1, a.profile or "")
        known = self._reps.get(a.replica) if a.replica is not None else None
        if known is not None:
            if (known.gpu, known.start, known.profile, known.model) == (a.gpu, pl.start, pl.profile, a.model):
                chain.created.append(known.id)
                return None  # applied again after it took effect
            return f"create {a.model}: replica id {a.replica} already exists on {known.gpu}@{known.start}"
        if pl not in self._layout(a.gpu):
            return f"create {a.model}: gpu {a.gpu} has no instance {pl} (layout {list(map(str, self._layout(a.gpu)))})"
        occ = self._occupant(a.gpu, pl.start, pl.profile)
        if occ is not None:
            if occ.state == ReplicaState.DRAINING:
                return WAIT
            return f"create {a.model}: instance {pl} on {a.gpu} is taken by {occ.id}"
        ready_at = None if a.gpu in self._repart else now + self.config.start_delay_s
        rid = self._add(a.model or "", pl.profile, a.gpu, pl.start, ready_at=ready_at, rid=a.replica)
        chain.created.append(rid)
        self.creates += 1
        return None

    def _wait_ready(self, a: Action, chain: Chain, now: float) -> str | None:
        if a.replica is not None:
            if self.queue.superseded(a.replica):
                return None  # a later plan removed it: nothing left to wait for
            r = self._reps.get(a.replica)
            if r is None:
                return f"{describe(a)}: replica does not exist"
            waiting = [r]
        else:
            r = self._find(a) if a.gpu is not None else None
            waiting = [r] if r is not None else [self._reps[i] for i in chain.created if i in self._reps]
        failed = [w.id for w in waiting if w.state == ReplicaState.FAILED]
        if failed:
            return f"{describe(a)}: replica {', '.join(failed)} failed to start"
        if any(w.state == ReplicaState.STARTING for w in waiting):
            since = chain.head_since if chain.head_since is not None else now
            if now - since > self.config.wait_ready_timeout_s:
                return f"{describe(a)}: not ready after {self.config.wait_ready_timeout_s:.0f}s"
            return WAIT
        return None

    def _repartition(self, a: Action, chain: Chain, now: float) -> str | None:
        if a.gpu not in self.gpus or a.layout is None:
            return f"repartition: unknown gpu {a.gpu!r} or no layout"
        g = self.gpus[a.gpu]
        target = tuple(sorted(a.layout))
        probs = check_layout(get_product(g.product), target)
        if probs:
            return f"repartition {a.gpu}: " + "; ".join(probs)
        if a.gpu in self._repart:
            return WAIT
        if target == tuple(sorted(g.layout)):
            return None
        removed = set(g.layout) - set(target)
        for pl in removed:
            occ = self._occupant(a.gpu, pl.start, pl.profile)
            if occ is None:
                continue
            if occ.state == ReplicaState.DRAINING or self._queued_removal(occ, chain):
                return WAIT  # make-before-break: the drain finishes first
            return f"repartition {a.gpu}: instance {pl} still serves {occ.id}"
        self._repart[a.gpu] = Repartition(target, now + self.config.repartition_delay_s)
        self.gpus[a.gpu] = replace(g, layout=target)
        self.reconfigurations += 1
        return None

    def _queued_removal(self, r: SimReplica, chain: Chain) -> bool:
        return any(
            x.kind in (ActionKind.DRAIN, ActionKind.DELETE) and self._find(x) is r
            for c in self.queue.chains for x in (c.actions[1:] if c is chain else c.actions)
        )

