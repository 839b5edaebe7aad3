"""The Kubernetes controller: one process per controller pod that runs the whole loop on a cluster.

``migscale controller MODELS CLUSTER`` runs this. It composes the pieces each
capability ships, and nothing else:

    KubernetesBackend (act/kubernetes/backend.py) -- Inventory + Actuator from
        informers; make-before-break rollouts, node repartitions, Events
    PrometheusSource (observe/) -- MetricsSource (Triton + DCGM series)
    FastScrape (observe/fast.py) -- optional: each Ready Triton pod's /metrics
        every second, straight from its IP, for the burst layer; the wait
        between ticks ends early when a model starts to outrun its Ready pods
    ControlLoop (loop.py) -- observe -> decide (policy/) -> act
    Driver (driver.py) -- the one run loop: cadence, back-off, hooks, health
    ApiState + create_app (api/) -- custom/external metrics, /metrics,
        /v1/plan, /v1/status (with each model's condition), /ui; ready while
        the driver's health says the picture is current
    LeaseElector (act/kubernetes/leader.py) -- who may act, renewed on its own thread
    IdleCollector (gcpacing.py) -- full garbage collections between ticks, not in them

The Driver's hooks carry the Kubernetes specifics: ``before_tick`` refreshes
the model set (a ``ModelSource`` is asked every tick, so models can come and
go at run time), reads the elector's verdict (no I/O: the elector renews on
its own thread every ``retry_period_s``, so however long a tick takes, the
lease does not lapse) and, while leading, moves every rollout and
repartition one step (``backend.advance``); ``after_tick`` publishes.

Leader election. Every replica of the controller Deployment runs the same
loop; only the holder of the ``migscale-controller`` Lease *acts*. A follower
observes and decides exactly like the leader but its actuator is a shadow
that writes nothing (``LeaderGate``), and it publishes what it saw to its own
metrics API: the APIService's Service spreads the aggregator's requests over
every ready replica, and a follower that served nothing would answer half of
them with 404. It also keeps a follower's windows and stabilization history
warm, so on takeover the first decision sees an unbroken history. The
decision log records only the ticks in which this replica led. Losing the
lease mid-tick stops writes at once: the backend's client refuses every
write the elector cannot vouch for (fencing, ``leader.py``). On losing it, the
queued rollout chains are dropped (the next leader re-plans from the cluster);
repartitions live on the Nodes and the next leader carries them on.
``close()`` (SIGTERM) releases the Lease, so a follower takes over at its
next retry instead of after the lease duration.

Time comes from an injected Clock (a VirtualClock in tests).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.act.kubernetes.render import OwnerRef
from autoscaler.api.app import create_app
from autoscaler.api.server import ServerHandle, serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.api.tls import TlsSettings
from autoscaler.clock import Clock, WallClock
from autoscaler.config import policy_config
from autoscaler.driver import Driver, Hooks, TickOutcome
from autoscaler.loop import ControlLoop, TickResult, action_json
from autoscaler.observe.fast import FastScrape, WithFast
from autoscaler.policy.burst import WakeOnBurst, outrun_models
from autoscaler.policy.capacity import ready_capacity
from autoscaler.policy.types import Action, ModelSpec, Plan, RepartitionScope
from autoscaler.protocols import MetricsSource
from autoscaler.runtime.gcpacing import IdleCollector

log = logging.getLogger("migscale.controller")


_NO_MODELS = SimpleNamespace(models=())


@dataclass(frozen=True)
class ModelSet:
    specs: tuple[ModelSpec, ...]
    slo_p99_ms: Mapping[str, float]
    namespaces: Mapping[str, str] = field(default_factory=dict)  # model -> its namespace (else cluster.yaml's)
    owners: Mapping[str, OwnerRef] = field(default_factory=dict)  # model -> the object owning its workloads


class ModelSource(Protocol):
    """Where the controller learns which models to serve; asked once per tick."""

    def current(self) -> ModelSet: ...


class StaticModels:
    """The models of models.yaml, fixed for the life of the process."""

    def __init__(self, models: ModelSet) -> None:
        self.models = models

    def current(self) -> ModelSet:
        return self.models


class LeaderGate:
    """The actuator the loop sees: the backend while this replica leads, a shadow otherwise.

    ``in_flight()`` always asks the backend (reads: the repartitions in the
    Node annotations, terminating pods, and -- while leading -- the queued
    rollout chains; a follower has none), so leader and followers hold the
    same GPUs and models, per GPU and per model. A shadow
    ``apply`` writes nothing and reports no error, so the follower's policy
    state records the scale events the leader is making from the same
    observation -- the history it needs if it takes over.
    """

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self.leading = False
        self.shadow_calls: deque[tuple[Action, ...]] = deque(maxlen=100)  # what a follower would have done

    def apply(self, actions: Sequence[Action]) -> list[str]:
        if self.leading:
            return self.backend.apply(actions)
        self.shadow_calls.append(tuple(actions))
        return []

    def in_flight(self) -> tuple[frozenset[str], frozenset[str]]:
        return self.backend.in_flight()

    def groups(self, actions: Sequence[Action]) -> list[int]:
        return self.backend.groups(actions)

    def take_errors(self) -> list[str]:
        # only a leader queues work; what a deposed leader had queued was dropped with it
        return self.backend.take_errors() if self.leading else []


@dataclass(frozen=True)
class Role:
    leader: bool
    holder: str | None
    reason: str


class KubernetesController:
    """Owns the loop, the driver, the leader gate and the metrics API around a KubernetesBackend."""

    def __init__(
        self,
        backend: KubernetesBackend,
        source: MetricsSource,
        models_cfg: Any,
        cluster_cfg: Any,
        *,
        clock: Clock | None = None,
        identity: str | None = None,
        decision_log: str | Path | None = None,
        on_result: Callable[[TickResult], None] | None = None,
        dry_run: bool = False,
        model_source: ModelSource | None = None,
        collector: IdleCollector | None = None,
        fast: FastScrape | None = None,
    ) -> None:
        self.backend = backend
        # the burst layer's 1 s scrape of the pods, beside Prometheus (None: Prometheus alone)
        self.fast = fast
        if fast is not None:
            source = WithFast(source, fast, fresh_each_read=False)  # the idle hook's rounds serve the tick
        # full garbage collections between ticks (installed by ``run``: a process-wide setting)
        self.collector = collector
        self.dry_run = dry_run  # observe and decide, never write (the client refuses every write too)
        if dry_run:
            backend.elector = None
        self.elector = backend.elector
        self.source = source
        self.clock = clock or WallClock()
        self.identity = identity or (self.elector.identity if self.elector is not None else "migscale")
        # models_cfg None: every model comes from model_source (MigModels), none from models.yaml
        # mig-manager re-applies a node's whole config on a drained node: a repartition's scope is the node
        self.policy = policy_config(models_cfg if models_cfg is not None else _NO_MODELS, cluster_cfg,
                                    repartition_scope=RepartitionScope.NODE)
        self.model_source = model_source or StaticModels(
            ModelSet(tuple(self.policy.models), dict(self.policy.slo_p99_ms)))
        self.models: ModelSet | None = None
        self.gate = LeaderGate(backend)
        self.decision_log = Path(decision_log) if decision_log is not None else None
        self.loop = ControlLoop(source, backend, self.gate, self.policy, self.clock, decision_log=None)
        # three missed ticks: one slow or failed tick is still current, a stuck loop is not
        max_age_s = 3.0 * self.policy.tick_s
        self.wake = WakeOnBurst(self.policy.tick_s)
        self._wake_capacity: tuple[object, dict[str, float]] | None = None  # (the tick's observation, its ready capacity)
        self.driver = Driver(self.loop, self.clock, tick_s=self.policy.tick_s, max_snapshot_age_s=max_age_s,
                             hooks=Hooks(before_tick=self.before_tick, after_tick=self.after_tick, idle=self.idle,
                                         wake=self.burst_began if fast is not None else None))
        self.api_state = ApiState(cluster_cfg.namespace, max_age_s=max_age_s, clock=self.clock,
                                  health=self.driver.health)
        self.on_result = on_result
        self.role = Role(False, None, "not tried")
        self.leader_ticks = 0
        self.follower_ticks = 0
        self.api: ServerHandle | None = None
        self._last_plan: Plan | None = None
        self._tick_started = 0.0
        self._was_leader = False
        self.close_error: str | None = None
        self.released = False  # close() gave the Lease back
        self._refresh_models()

    @property
    def specs(self) -> list[ModelSpec]:
        return list(self.models.specs) if self.models else []

    @property
    def slo_p99_ms(self) -> dict[str, float]:
        return dict(self.models.slo_p99_ms) if self.models else {}

    # ------------------------------------------------------------ leadership

    def check_role(self) -> Role:
        """The elector's verdict, read (no request): the elector renews on its own thread."""
        if self.dry_run:
            self.role = Role(False, None, "dry run: deciding only, writing nothing")
        elif self.elector is None:
            self.role = Role(True, self.identity, "leader election off")
        else:
            st = self.elector.last
            leading = self.elector.holds()
            self.role = Role(leading, self.identity if leading else st.holder,
                             st.reason if leading or not st.leader else "renewal overdue")
        self.gate.leading = self.role.leader
        return self.role

    def check_lease(self) -> Role:
        """One acquire/renew attempt now (``--once`` and tests), then the verdict."""
        if self.elector is not None and not self.dry_run:
            self.elector.step()
        return self.check_role()

    # ------------------------------------------------------------ the driver's hooks

    def _refresh_models(self) -> None:
        ms = self.model_source.current()
        if ms == self.models:
            return
        self.models = ms
        self.loop.config = replace(self.loop.config, models=tuple(ms.specs), slo_p99_ms=dict(ms.slo_p99_ms))
        self.backend.set_models(ms.specs, ms.namespaces, ms.owners)
        log.info("serving %d model%s: %s", len(ms.specs), "" if len(ms.specs) == 1 else "s", ", ".join(m.name for m in ms.specs))

    def before_tick(self) -> None:
        self._tick_started = time.perf_counter()
        self.wake.ticked(self.clock.now())
        self._refresh_models()
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None:
            # the tick's queries go out now: their round trips overlap the writes of
            # ``advance`` below instead of following them (``observe/prometheus.py``)
            prefetch(self.clock.now())
        role = self.check_role()
        # only a leader's decisions are carried out, so only they go in the log
        self.loop.decision_log = self.decision_log if role.leader else None
        if role.leader:
            self.leader_ticks += 1
            if not self._was_leader:
                self.backend.start_leading()
            self.backend.advance()  # what fails is reported by take_errors() in this tick's result
        else:
            self.follower_ticks += 1
            if self._was_leader:
                self.backend.stop_leading()
        self._was_leader = role.leader

    def after_tick(self, result: TickOutcome) -> None:
        if not isinstance(result, TickResult):
            return
        if result.plan is not None:
            self._last_plan = result.plan
        self.publish(result)
        after = getattr(self.model_source, "after_tick", None)
        if after is not None:  # a source that reports back on its objects (MigModel status)
            after(self, result)
        if self.on_result is not None:
            self.on_result(result)

    def idle(self) -> None:
        """Between ticks (the driver's wait, in half-second slices): the fast scrape once a
        second, and a due full garbage collection, here rather than in a tick."""
        if self.fast is not None:
            # a round at 1,000 pods takes about a second: none that would make the next tick late
            self.fast.sample_if_due(self.clock.now(), free_s=self.driver.time_to_tick_s)
        if self.collector is not None:
            self.collector.idle()

    def burst_began(self) -> bool:
        """The driver's wake hook: a model's arrivals (the last 1 s scrapes) outrun the
        Ready pods of the last tick's snapshot (``burst.WakeOnBurst``). The snapshot is the
        tick's, not a fresh one: a pod Ready since then is missed until the next tick,
        which this very hook then starts early -- no new read of the caches each second."""
        obs = self.loop.last_observation
        if self.fast is None or obs is None:
            return False
        now = self.clock.now()
        # both inputs change only with a round or a tick: computed once for each
        if self._wake_capacity is None or self._wake_capacity[0] is not obs:
            self._wake_capacity = (obs, ready_capacity(self.specs, obs.cluster.replicas))
        short = outrun_models(self.fast.round_signals(), now, self._wake_capacity[1])
        return self.wake.began(short, now)

    def tick(self) -> TickResult:
        """One control tick through the driver: hooks, observe -> decide -> act (or shadow), publish."""
        self.driver.step()
        assert self.loop.last_result is not None
        return self.loop.last_result

    # ------------------------------------------------------------ publishing

    def status(self, result: TickResult | None) -> dict[str, Any]:
        """What /v1/status serves: who leads, what the last tick did, why each model is where it is."""
        r = result
        return {
            "mode": "kubernetes",
            "identity": self.identity,
            "leader": self.role.leader,
            "holder": self.role.holder,
            "lease": self.role.reason,
            "ticks": {"leader": self.leader_ticks, "follower": self.follower_ticks},
            "health": self.driver.health().to_json(),
            "last_tick": None
            if r is None
            else {
                "t_s": r.t_s,
                "ok": r.ok,
                "held": list(r.held),
                "source_ok": r.source_ok,
                # a leader's tick with actions wrote them; a follower's never did
                "acted": self.role.leader and bool(r.actions),
                "actions": [action_json(a) for a in r.actions],
                "errors": list(r.errors),
                "late_errors": list(r.late_errors),
                "notes": [n for n in r.notes if "Traceback" not in n],
                "next_delay_s": r.next_delay_s,
            },
            "conditions": self.backend.conditions(self._last_plan),
            "apply_calls": list(self.backend.apply_calls)[-50:],
            "backend": self.backend.stats(),
            # the last round of the pods' direct scrape: targets, failures, the first failure
            "fast_scrape": dict(self.fast.last) if self.fast is not None else None,
            "gc": self.collector.to_json() if self.collector is not None else None,
            "models": [{"name": m, "slo_p99_ms": v} for m, v in sorted(self.slo_p99_ms.items())],
        }

    def publish(self, result: TickResult | None = None) -> None:
        """Push the tick's picture to the metrics API (HPA readers, /ui).

        A tick that failed before observing (caches not synced, API server
        unreachable) has no observation: the previous snapshot stays up.
        """
        obs = self.loop.last_observation
        if obs is None or (result is not None and result.t_s != obs.t_s):
            return
        self.api_state.update(
            obs,
            self._last_plan,
            obs.cluster,
            self.specs,
            status=self.status(result),
            slo_p99_ms=self.slo_p99_ms,
            tick_duration_s=time.perf_counter() - self._tick_started,
            t_s=obs.t_s,
        )

    # ------------------------------------------------------------ serving and running

    def start_api(self, host: str = "127.0.0.1", port: int = 0, tls: TlsSettings | None = None) -> ServerHandle:
        # TlsSettings carries the client CA and allowed names; serve_in_thread enforces them
        self.api = serve_in_thread(create_app(self.api_state), host, port, tls)
        return self.api

    def run(self, stop: Any) -> None:
        """Renew the lease on its own thread and tick until ``stop`` is set (SIGTERM); then :meth:`close`."""
        if self.elector is not None and not self.dry_run:
            self.elector.start()
        if self.collector is not None:
            self.collector.install()  # the caches are synced: what lives now lives long
        self.driver.run(stop)

    def close(self) -> None:
        """Stop renewing, release the Lease (if held), stop the API server and the informers."""
        try:
            self.backend.recorder.close()  # queued Events go out while the lease still fences them in
            if self.elector is not None:
                self.elector.stop()
                self.released = self.elector.release()
        except Exception as exc:  # noqa: BLE001 - the lease then expires on its own
            self.close_error = f"lease release failed: {type(exc).__name__}: {exc}"
        finally:
            self.role = Role(False, None, "released on shutdown")
            self.gate.leading = False
            if self.api is not None:
                self.api.stop()
                self.api = None
            closer = getattr(self.model_source, "close", None)
            if closer is not None:  # a watching source (MigModels) stops its informers
                closer()
            self.backend.close()
            self.backend.rest.close()
            if self.fast is not None:
                self.fast.close()
            if self.collector is not None:
                self.collector.uninstall()
