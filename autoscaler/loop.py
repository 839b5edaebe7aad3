"""The control loop: one tick is observe -> decide -> act, on an injected clock.

``ControlLoop.tick()`` reads the inventory and the metrics source, hands an
``Observation`` to the pure ``decide`` and passes the plan's actions to the
actuator (under the contract in ``protocols.py``). ``driver.Driver`` runs the
ticks; this module is one tick. Three rules keep it safe:

- a gate per GPU and per model: what is still in flight (the actuator's
  ``in_flight()``: repartitions, drains, queued actions) is only observed,
  never acted on again. The loop decides every tick and drops only the
  actions that touch a busy GPU or model, together with every action the
  actuator links to them (``Actuator.groups``, ``hold_in_flight``); those models
  report ``HOLD_CONVERGING``, and the planner leaves busy GPUs alone. Worked
  number: a 180 s repartition of one GPU holds only the models on that GPU for
  its 12 ticks of 15 s; the other models keep scaling. Every actuator answers
  ``in_flight()``; there is no global "wait while anything converges";
- a metrics outage is not an error: the observation is marked
  ``source_ok=False`` and ``decide`` holds every model (no scale-downs);
- any exception inside a tick is caught and reported in the ``TickResult``;
  the next tick is delayed by an exponential back-off (tick_s * 2**k, capped
  at ``max_backoff_s``) and the loop carries on.

Errors of actions an earlier tick queued (``take_errors()``) are reported in
``TickResult.late_errors``: they belong to a decision already made, so they
neither fail this tick nor back it off -- the plan of this tick starts from
what the failure left behind, as a level-triggered controller does.

Each decision is appended as one JSON line to the decision log, which is
what ``migscale explain`` reads.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from autoscaler.clock import Clock
from autoscaler.policy.decide import decide
from autoscaler.policy.state import PolicyConfig, PolicyState
from autoscaler.policy.types import Action, ClusterState, Observation, Plan, Reason
from autoscaler.protocols import Actuator, Inventory, MetricsSource, action_groups, action_keys

__all__ = ["ControlLoop", "TickResult", "action_groups", "action_json", "decision_record", "hold_in_flight"]

log = logging.getLogger("migscale.loop")


@dataclass(frozen=True)
class TickResult:
    t_s: float
    ok: bool  # no exception and no actuator error
    held: tuple[str, ...] = ()  # models held by the per-GPU/per-model gate this tick
    source_ok: bool = True
    plan: Plan | None = None
    actions: tuple[Action, ...] = ()
    errors: tuple[str, ...] = ()
    late_errors: tuple[str, ...] = ()  # queued actions of earlier ticks that failed since (never fail this tick)
    notes: tuple[str, ...] = ()
    reasons: Mapping[str, tuple[Reason, ...]] = field(default_factory=dict)
    next_delay_s: float = 0.0


class ControlLoop:
    def __init__(
        self,
        source: MetricsSource,
        inventory: Inventory,
        actuator: Actuator,
        config: PolicyConfig,
        clock: Clock,
        decision_log: str | Path | None = None,
        on_tick: Callable[[TickResult], None] | None = None,
        *,
        planner: Callable[..., Plan] | None = None,
        max_backoff_s: float = 300.0,
        state: PolicyState | None = None,
        max_log_bytes: int = 50_000_000,
    ) -> None:
        self.source = source
        self.inventory = inventory
        self.actuator = actuator
        self.config = config
        self.clock = clock
        self.decision_log = Path(decision_log) if decision_log is not None else None
        self.on_tick = on_tick
        self.planner = planner
        self.max_backoff_s = max_backoff_s
        # ~2 KB a line every 5 s is ~35 MB a day: keep one rotated generation
        self.max_log_bytes = max_log_bytes
        self.state = state or PolicyState()
        self.failures = 0  # consecutive failed ticks
        self.ticks = 0
        self.tick_errors = 0  # ticks that raised (migscale_tick_errors_total)
        self.last_result: TickResult | None = None
        self.last_decide_s: float | None = None  # how long the last decide + plan took
        self.last_observation: Observation | None = None  # what the last tick saw (for the API/UI)
        self.last_log_error: str | None = None  # the decision log could not be written
        self.last_on_tick_error: str | None = None  # the on_tick observer raised

    # ------------------------------------------------------------------ tick

    def tick(self) -> TickResult:
        now = self.clock.now()
        self.ticks += 1
        try:
            result = self._tick(now)
        except Exception as exc:  # never fatal: logged, reported, backed off
            self.tick_errors += 1
            log.exception("tick %d raised", self.ticks)  # the whole traceback, in the controller log
            result = TickResult(
                t_s=now,
                ok=False,
                errors=(f"{type(exc).__name__}: {exc}",),
                notes=(traceback.format_exc(limit=3),),
            )
        if result.ok:
            self.failures = 0
            delay = self.config.tick_s
        else:
            self.failures += 1
            # 5 s tick: 10, 20, 40 ... s after 1, 2, 3 failures in a row, at most max_backoff_s
            delay = min(self.max_backoff_s, self.config.tick_s * (2**self.failures))
        result = replace(result, next_delay_s=delay, late_errors=self._late_errors())
        self.last_result = result
        self._log(result)
        if self.on_tick is not None:
            try:
                self.on_tick(result)
            except Exception as exc:  # noqa: BLE001 - a broken observer must not stop the loop
                self.last_on_tick_error = f"{type(exc).__name__}: {exc}"
        return result

    def _tick(self, now: float) -> TickResult:
        cluster: ClusterState = self.inventory.snapshot()
        busy = self._in_flight()
        if busy[0]:
            # the planner leaves busy GPUs as they are and places elsewhere
            cluster = replace(
                cluster, gpus=tuple(replace(g, busy=True) if g.id in busy[0] else g for g in cluster.gpus)
            )
        names = [m.name for m in self.config.models]
        replica_ids = [r.id for r in cluster.replicas]
        notes: list[str] = []
        source_ok = True
        try:
            models, replicas = self.source.read(names, replica_ids, now)
        except Exception as exc:  # noqa: BLE001 - any source failure is an outage
            # total outage: decide sees no signals and holds every model
            source_ok = False
            models, replicas = {}, {}
            notes.append(
                f"{Reason.HOLD_MISSING_METRICS.value}: metrics source failed: {type(exc).__name__}: {exc}"
            )
        notes.extend(getattr(self.source, "last_notes", ()) or ())
        obs = Observation(
            t_s=now,
            cluster=cluster,
            models=dict(models),
            replicas=dict(replicas),
            source_ok=source_ok,
            notes=tuple(notes),
        )
        self.last_observation = obs
        prev = self.state
        t0 = time.perf_counter()  # duration only (for /metrics), never a decision input
        plan, new_state = decide(obs, prev, self.config, now, planner=self.planner)
        self.last_decide_s = time.perf_counter() - t0
        reasons = dict(plan.reasons)
        actions, held = hold_in_flight(plan.actions, cluster, busy[0], busy[1],
                                       self.actuator.groups(plan.actions) if plan.actions else [])
        for m in held:
            rs = tuple(r for r in reasons.get(m, ()) if r is not Reason.KEEP)
            reasons[m] = (Reason.HOLD_CONVERGING, *rs)
        if held:
            # A held model did not scale: its scale event must not eat the
            # behavior budget (the recommendation stands, as in HPA).
            events = dict(new_state.scale_events)
            for m in held:
                if m in prev.scale_events:
                    events[m] = prev.scale_events[m]
                else:
                    events.pop(m, None)
            new_state = replace(new_state, scale_events=events)
        # The recommendation stands even if acting fails (HPA records it too), but
        # a scale event that did not happen must not eat the behavior budget.
        self.state = replace(new_state, scale_events=prev.scale_events)
        errors: list[str] = []
        if actions:
            errors = list(self.actuator.apply(actions))
        if not errors:
            self.state = new_state
        return TickResult(
            t_s=now,
            ok=not errors,
            held=tuple(sorted(held)),
            source_ok=source_ok,
            plan=plan,
            actions=actions,
            errors=tuple(errors),
            notes=tuple(notes),
            reasons=reasons,
        )

    def _in_flight(self) -> tuple[frozenset[str], frozenset[str]]:
        """(busy GPUs, busy models), as the actuator reports them."""
        gpus, models = self.actuator.in_flight()
        return frozenset(gpus), frozenset(models)

    def _late_errors(self) -> tuple[str, ...]:
        try:
            return tuple(self.actuator.take_errors())
        except Exception as exc:  # noqa: BLE001 - a report that cannot be read must not fail the tick
            return (f"take_errors: {type(exc).__name__}: {exc}",)

    # ------------------------------------------------------------------ log

    def _log(self, result: TickResult) -> None:
        if self.decision_log is None:
            return
        try:
            self.decision_log.parent.mkdir(parents=True, exist_ok=True)
            if self.decision_log.exists() and self.decision_log.stat().st_size >= self.max_log_bytes:
                self.decision_log.replace(self.decision_log.with_name(self.decision_log.name + ".1"))
            with self.decision_log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(decision_record(result, self.state), default=_json_default) + "\n")
        except OSError as exc:
            # losing a log line must not stop scaling; keep the error visible
            self.last_log_error = str(exc)


def hold_in_flight(
    actions: Sequence[Action],
    cluster: ClusterState,
    busy_gpus: frozenset[str] | set[str],
    busy_models: frozenset[str] | set[str],
    groups: Sequence[int] | None = None,
) -> tuple[tuple[Action, ...], frozenset[str]]:
    """The per-GPU/per-model gate: (actions to issue now, models held).

    ``groups`` is the chain of each action as the actuator links them
    (``Actuator.groups``); without it, actions sharing a GPU or a model are
    linked (``action_groups``: a REPARTITION and the CREATEs it makes room
    for; a replacement CREATE and the DRAIN of the replica it replaces). A
    chain that touches a busy GPU (being repartitioned, draining, with queued
    actions) or a busy model (actions still queued) is dropped whole, so
    make-before-break is never split: the planner re-plans it next tick from
    what then runs. Order is kept. The gate must link as the actuator does:
    on Kubernetes, where sharing a GPU links nothing, GPU links made one chain
    of a consolidation's 500 actions over 105 models, and one busy GPU held
    them all.
    """
    reps = {r.id: r for r in cluster.replicas}

    def owner(rid: str) -> tuple[str, str] | None:
        r = reps.get(rid)
        return (r.gpu, r.model) if r is not None else None

    if groups is None:
        groups = action_groups(actions, owner)
    if len(groups) != len(actions):
        raise ValueError(f"hold_in_flight: {len(groups)} groups for {len(actions)} actions")
    bad: set[int] = set()
    for a, g in zip(actions, groups):
        gpu, model = action_keys(a, owner)
        if gpu in busy_gpus or model in busy_models:
            bad.add(g)
    kept: list[Action] = []
    held: set[str] = set()
    for a, g in zip(actions, groups):
        if g not in bad:
            kept.append(a)
            continue
        where = owner(a.replica) if a.replica is not None else None
        for m in (a.model, where[1] if where else None):
            if m is not None:
                held.add(m)
    return tuple(kept), frozenset(held)


def decision_record(result: TickResult, state: PolicyState) -> dict[str, Any]:
    """One decision-log line: time, per-model inputs, reasons, actions, errors."""
    plan = result.plan
    return {
        "t_s": result.t_s,
        "ok": result.ok,
        "held": list(result.held),
        # whether this tick called the planner, and why (replan.Replan; same/hold: it did not)
        "replan": state.replan.value if state.replan is not None else None,
        "source_ok": result.source_ok,
        "errors": list(result.errors),
        "late_errors": list(result.late_errors),
        "notes": [n for n in result.notes if "Traceback" not in n],
        "reasons": {m: [r.value for r in rs] for m, rs in result.reasons.items()},
        "models": {m: d.to_json() for m, d in state.diagnostics.items()},
        "target_rps": dict(plan.target_rps) if plan else {},
        "capacity_rps": dict(plan.capacity_rps) if plan else {},
        "shortfall": dict(plan.shortfall) if plan else {},
        "desired": {f"{m}/{p}": n for (m, p), n in plan.desired.items()} if plan else {},
        "actions": [action_json(a) for a in result.actions],
        "next_delay_s": result.next_delay_s,
    }


def action_json(a: Action) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": a.kind.value, "reason": a.reason.value}
    for k in ("gpu", "model", "profile", "start", "replica"):
        v = getattr(a, k)
        if v is not None:
            d[k] = v
    if a.layout is not None:
        d["layout"] = [str(p) for p in a.layout]
    return d


def _json_default(o: Any) -> Any:
    if isinstance(o, Enum):
        return o.value
    if isinstance(o, float):
        return o
    return str(o)
