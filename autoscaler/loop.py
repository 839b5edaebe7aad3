"""The control loop: one tick is observe -> decide -> act, on an injected clock.

``ControlLoop.tick()`` reads the inventory and the metrics source, hands an
``Observation`` to the pure ``decide`` and passes the plan's actions to the
actuator. Three rules keep it safe:

- a gate: while the actuator still converges (replicas starting, drains,
  repartitions) the tick only observes -- the policy keeps its windows
  current but issues nothing, so it never acts on a half-applied plan;
- a metrics outage is not an error: the observation is marked
  ``source_ok=False`` and ``decide`` holds every model (no scale-downs);
- any exception inside a tick is caught and reported in the ``TickResult``;
  the next tick is delayed by an exponential back-off (tick_s * 2**k, capped
  at ``max_backoff_s``) and the loop carries on.

Each decision is appended as one JSON line to the decision log, which is
what ``migscale explain`` reads.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from autoscaler.clock import Clock
from autoscaler.policy.decide import PolicyConfig, PolicyState, decide, observe_only
from autoscaler.policy.types import Action, ClusterState, Observation, Plan, Reason
from autoscaler.protocols import Actuator, Inventory, MetricsSource


@dataclass(frozen=True)
class TickResult:
    t_s: float
    ok: bool  # no exception and no actuator error
    gated: bool = False  # actuator converging: observed only
    source_ok: bool = True
    plan: Plan | None = None
    actions: tuple[Action, ...] = ()
    errors: tuple[str, ...] = ()
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
        except Exception as exc:  # noqa: BLE001 - never fatal: report, back off, carry on
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
        result = _with_delay(result, delay)
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
        if self.actuator.converging():
            self.state = observe_only(obs, self.state, self.config, now)
            return TickResult(
                t_s=now,
                ok=True,
                gated=True,
                source_ok=source_ok,
                notes=tuple(notes),
                reasons={n: (Reason.HOLD_CONVERGING,) for n in names},
            )
        prev = self.state
        t0 = time.perf_counter()  # duration only (for /metrics), never a decision input
        plan, new_state = decide(obs, prev, self.config, now, planner=self.planner)
        self.last_decide_s = time.perf_counter() - t0
        # The recommendation stands even if acting fails (HPA records it too), but
        # a scale event that did not happen must not eat the behavior budget.
        self.state = replace(new_state, scale_events=prev.scale_events)
        errors: list[str] = []
        if plan.actions:
            errors = list(self.actuator.apply(plan.actions))
        if not errors:
            self.state = new_state
        return TickResult(
            t_s=now,
            ok=not errors,
            source_ok=source_ok,
            plan=plan,
            actions=plan.actions,
            errors=tuple(errors),
            notes=tuple(notes),
            reasons=dict(plan.reasons),
        )

    # ------------------------------------------------------------------ run

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set; sleeps through the clock in short slices so
        a stop request is honoured within half a second."""
        while not stop.is_set():
            result = self.tick()
            remaining = result.next_delay_s
            while remaining > 0 and not stop.is_set():
                step = min(0.5, remaining)
                self.clock.sleep(step)
                remaining -= step

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


def _with_delay(r: TickResult, delay: float) -> TickResult:
    return replace(r, next_delay_s=delay)


def decision_record(result: TickResult, state: PolicyState) -> dict[str, Any]:
    """One decision-log line: time, per-model inputs, reasons, actions, errors."""
    plan = result.plan
    return {
        "t_s": result.t_s,
        "ok": result.ok,
        "gated": result.gated,
        "source_ok": result.source_ok,
        "errors": list(result.errors),
        "notes": [n for n in result.notes if "Traceback" not in n],
        "reasons": {m: [r.value for r in rs] for m, rs in result.reasons.items()},
        "models": {} if result.gated else {m: d.to_json() for m, d in state.diagnostics.items()},
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
