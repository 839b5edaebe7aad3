"""The baselines' drivers: what ``sim.run`` ticks in place of the ``ControlLoop``.

Place in the loop: ``driver.Driver`` calls a driver's ``tick`` on simulated time,
as it calls ``ControlLoop.tick`` for migscale. A driver observes the simulated
cluster exactly as the loop's sources would, runs one baseline's sizing rule
(``baselines.hpa_decide`` or ``windowed.targets`` with the production planner)
and applies the actions through the simulated actuator. The rules themselves are
pure and live in ``baselines.py`` and ``windowed.py``; this module only wires
them to ``SimCluster``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autoscaler.policy.types import ModelSpec
from autoscaler.sim import baselines as bl
from autoscaler.sim.cluster import SimCluster


@dataclass
class TickOut:
    t_s: float
    errors: tuple[str, ...]
    next_delay_s: float
    ok: bool = True


class BaselineDriver:
    """What a baseline's driver shares: the simulated cluster, and one observation of it."""

    def __init__(self, specs: Sequence[ModelSpec]) -> None:
        self.specs = list(specs)
        self.cluster: SimCluster | None = None

    def bind(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def _observe(self, busy_gpus: frozenset[str] = frozenset()) -> Any:
        """An ``Observation`` of now; GPUs in ``busy_gpus`` marked busy, as the control loop does
        (the planner leaves GPUs with work under way alone)."""
        from autoscaler.policy.types import Observation

        c = self.cluster
        assert c is not None
        now = c.clock.now()
        snap = c.snapshot()
        if busy_gpus:
            snap = replace(snap, gpus=tuple(replace(g, busy=True) if g.id in busy_gpus else g for g in snap.gpus))
        models, reps = c.read([s.name for s in self.specs], [r.id for r in snap.replicas], now)
        return Observation(t_s=now, cluster=snap, models=dict(models), replicas=dict(reps))


class HpaDriver(BaselineDriver):
    """Observe -> ``baselines.hpa_decide`` -> act, every HPA sync period."""

    def __init__(self, specs: Sequence[ModelSpec], cfg: bl.HpaBaselineConfig) -> None:
        super().__init__(specs)
        self.cfg = cfg
        self.state = bl.HpaBaselineState()

    def tick(self) -> TickOut:
        obs = self._observe()
        actions, self.state = bl.hpa_decide(obs, self.state, self.specs, self.cfg, obs.t_s)
        assert self.cluster is not None
        errors = tuple(self.cluster.apply(actions)) if actions else ()
        return TickOut(obs.t_s, errors, self.cfg.sync_s)


class WindowedMaxDriver(BaselineDriver):
    """Observe -> ``windowed.targets`` -> the production planner -> the loop's gate -> act.

    The planner is called when migscale's ``decide`` would call it (``windowed.replan``):
    a model short of a higher target than the last call saw, or the last call
    ``replan_s`` old. Called every tick, a jittery target would start replicas and
    delete them again before they are ready."""

    def __init__(self, specs: Sequence[ModelSpec], cfg: Any, repartition_s: float, planner: Any = None) -> None:
        from autoscaler.sim.windowed import WindowedMaxState

        super().__init__(specs)
        self.cfg, self.repartition_s, self.planner = cfg, repartition_s, planner
        self.state = WindowedMaxState()
        self.last: Any = None  # windowed.LastCall: the last planner call

    def tick(self) -> TickOut:
        from autoscaler.loop import hold_in_flight
        from autoscaler.policy.capacity import failed_replicas
        from autoscaler.policy.decide import FAST_PATH_MIN_REPARTITION_S
        from autoscaler.policy.planner import plan
        from autoscaler.sim import windowed

        c = self.cluster
        assert c is not None
        busy_gpus, busy_models = c.in_flight()
        obs = self._observe(frozenset(busy_gpus))
        now, cluster = obs.t_s, obs.cluster
        want, self.state = windowed.targets(obs, self.state, self.specs, self.cfg, now)
        if not windowed.replan(self.last, want, cluster, self.specs, now, self.cfg):
            return TickOut(now, (), self.cfg.tick_s)
        self.last = windowed.LastCall(now, want, failed_replicas(cluster))
        p = (self.planner or plan)(tuple(self.specs), want, cluster, churn_budget=self.cfg.churn_budget, now_s=now,
                                   fast_path=self.repartition_s >= FAST_PATH_MIN_REPARTITION_S)
        actions, _ = hold_in_flight(p.actions, cluster, busy_gpus, busy_models,
                                    c.groups(p.actions) if p.actions else [])
        errors = tuple(c.apply(actions)) if actions else ()
        return TickOut(now, errors, self.cfg.tick_s)
