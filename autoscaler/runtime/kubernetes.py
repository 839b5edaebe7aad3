"""The Kubernetes controller: one process per controller pod that runs the whole loop on a cluster.

``migscale controller MODELS CLUSTER --backend kubernetes`` runs this. It
composes the pieces each capability ships, and nothing else:

    KubernetesBackend (act/kubernetes/backend.py) -- Inventory + Actuator: Nodes and
        Triton pods in, Deployments/HPAs/PDBs and MIG repartitions out
    PrometheusSource (observe/) -- MetricsSource (Triton + DCGM series)
    ControlLoop (loop.py) -- observe -> decide (policy/) -> act, every policy.tick_s
    ApiState + create_app (api/) -- custom/external metrics for the HPA
        (behind the APIService registrations), /metrics, /v1/plan, /v1/status, /ui
    LeaseElector (act/kubernetes/leader.py) -- who may act

Leader election. Every replica of the controller Deployment runs the same
loop; only the holder of the ``migscale-controller`` Lease *acts*. A follower
observes and decides exactly like the leader but its actuator is a shadow
that writes nothing (``LeaderGate``), and it publishes what it saw to its own
metrics API. We chose that over "followers serve readiness only" because the
APIService's Service spreads the aggregator's requests over every ready
replica: a follower that served nothing would answer half the HPA's queries
with 404 and the HPA would flap between "metric missing" and a value. It also
keeps a follower's windows and stabilization history warm, so on takeover the
first decision sees an unbroken 60 s history instead of starting blind.
Followers are ready (``/readyz``) after their first tick, so rolling updates
do not stall on a never-ready follower. The decision log records only the
ticks in which this replica led (a follower's "actions" were never taken).

The Lease (15 s) is checked at the top of every tick and renewed every
``lease_duration_s / 3`` while waiting for the next one, so a 30 s tick does
not let the lease lapse between ticks (5 s renewals, three chances per
lease). The backend re-checks the Lease right before it writes, so a replica
that lost it mid-tick writes nothing. ``close()`` (SIGTERM) releases the
Lease, so a follower takes over at its next renewal (<= 5 s) instead of after
the 15 s expiry.

Time comes from an injected Clock (a VirtualClock in tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.act.kubernetes.leader import LeaseElector
from autoscaler.api.app import create_app
from autoscaler.api.server import ServerHandle, serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.api.tls import TlsSettings
from autoscaler.clock import Clock, WallClock
from autoscaler.config import policy_config
from autoscaler.loop import ControlLoop, TickResult, action_json
from autoscaler.policy.types import Action, Plan
from autoscaler.protocols import MetricsSource


class LeaderGate:
    """The actuator the loop sees: the backend while this replica leads, a shadow otherwise.

    ``converging()`` always asks the backend (a read), so leader and
    followers gate their decisions on the same cluster state. A shadow
    ``apply`` writes nothing and reports no error, so the follower's policy
    state records the scale events the leader is making from the same
    observation -- the history it needs if it takes over.
    """

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self.leading = False
        self.shadow_calls: list[tuple[Action, ...]] = []  # what a follower would have done

    def apply(self, actions: Sequence[Action]) -> list[str]:
        if self.leading:
            return self.backend.apply(actions)
        self.shadow_calls.append(tuple(actions))
        return []

    def converging(self) -> bool:
        return self.backend.converging()

    def in_flight(self) -> None:
        # The backend cannot say what is in flight per GPU and model yet: None
        # keeps the loop's global converging() gate for it.
        return None

    def take_errors(self) -> list[str]:
        return []  # the backend queues nothing: every error is returned by apply


@dataclass(frozen=True)
class Role:
    leader: bool
    holder: str | None
    reason: str


class KubernetesController:
    """Owns the loop, the leader gate and the metrics API around a KubernetesBackend."""

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
    ) -> None:
        self.backend = backend
        self.dry_run = dry_run  # observe and decide, never write (not even the Lease)
        if dry_run:
            backend.elector = None
        self.elector: LeaseElector | None = backend.elector
        self.source = source
        self.clock = clock or WallClock()
        self.identity = identity or (self.elector.identity if self.elector is not None else "migscale")
        self.policy = policy_config(models_cfg, cluster_cfg)
        self.specs = list(self.policy.models)
        self.slo_p99_ms = dict(self.policy.slo_p99_ms)
        self.api_state = ApiState(cluster_cfg.namespace)
        self.gate = LeaderGate(backend)
        self.decision_log = Path(decision_log) if decision_log is not None else None
        self.loop = ControlLoop(
            source,
            backend,
            self.gate,
            self.policy,
            self.clock,
            decision_log=None,
            on_tick=self._published,
        )
        self.on_result = on_result
        self.role = Role(False, None, "not tried")
        self.leader_ticks = 0
        self.follower_ticks = 0
        self.api: ServerHandle | None = None
        self._last_plan: Plan | None = None
        self._last_renew: float | None = None
        self._tick_started: float = 0.0
        self._lock = threading.Lock()
        self.close_error: str | None = None
        self.released = False  # close() gave the Lease back

    # ------------------------------------------------------------ leadership
    @property
    def renew_every_s(self) -> float:
        # 15 s lease -> renew every 5 s: two renewals can fail before it lapses
        return (self.elector.lease_duration_s / 3.0) if self.elector is not None else float("inf")

    def check_lease(self) -> Role:
        """Acquire/renew the Lease (or follow) and point the gate at the result."""
        if self.dry_run:
            self.role = Role(False, None, "dry run: deciding only, writing nothing")
        elif self.elector is None:
            self.role = Role(True, self.identity, "leader election off")
        else:
            st = self.elector.ensure()
            self.role = Role(st.leader, st.holder, st.reason)
            self._last_renew = self.clock.now()
        self.gate.leading = self.role.leader
        return self.role

    # ------------------------------------------------------------ one tick
    def tick(self) -> TickResult:
        """One control tick: check the lease, then observe -> decide -> act (or shadow)."""
        with self._lock:
            self._tick_started = time.perf_counter()
            role = self.check_lease()
            # only a leader's decisions were carried out, so only they go in the log
            self.loop.decision_log = self.decision_log if role.leader else None
            if role.leader:
                self.leader_ticks += 1
            else:
                self.follower_ticks += 1
            return self.loop.tick()

    def _published(self, result: TickResult) -> None:
        if result.plan is not None:
            self._last_plan = result.plan
        self.publish(result)
        if self.on_result is not None:
            self.on_result(result)

    def status(self, result: TickResult | None) -> dict[str, Any]:
        """What /v1/status serves: who leads, what the last tick did."""
        r = result
        return {
            "mode": "kubernetes",
            "identity": self.identity,
            "leader": self.role.leader,
            "holder": self.role.holder,
            "lease": self.role.reason,
            "ticks": {"leader": self.leader_ticks, "follower": self.follower_ticks},
            "last_tick": None
            if r is None
            else {
                "t_s": r.t_s,
                "ok": r.ok,
                "gated": r.gated,
                "source_ok": r.source_ok,
                # a leader's ungated tick with actions wrote them; a follower's never did
                "acted": self.role.leader and not r.gated and bool(r.actions),
                "actions": [action_json(a) for a in r.actions],
                "errors": list(r.errors),
                "notes": [n for n in r.notes if "Traceback" not in n],
                "next_delay_s": r.next_delay_s,
            },
            "apply_calls": self.backend.apply_calls[-50:],
            "models": [{"name": m, "slo_p99_ms": v} for m, v in sorted(self.slo_p99_ms.items())],
        }

    def publish(self, result: TickResult | None = None) -> None:
        """Push the tick's picture to the metrics API (HPA readers, /ui).

        A tick that failed before observing (API server unreachable) has no
        observation: the previous snapshot stays up -- the HPA keeps its last
        value rather than reading a picture we do not have.
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

    # ------------------------------------------------------------ serving
    def start_api(
        self, host: str = "127.0.0.1", port: int = 0, tls: TlsSettings | None = None
    ) -> ServerHandle:
        # TlsSettings carries the client CA and allowed names; serve_in_thread enforces them
        self.api = serve_in_thread(create_app(self.api_state), host, port, tls)
        return self.api

    # ------------------------------------------------------------ running
    def _wait(self, delay_s: float, stop: threading.Event) -> None:
        """Sleep ``delay_s`` on the clock in <= 0.5 s slices, renewing the Lease on the way."""
        remaining = delay_s
        while remaining > 0 and not stop.is_set():
            step = min(0.5, remaining)
            self.clock.sleep(step)
            remaining -= step
            if (
                self.elector is not None
                and not stop.is_set()
                and (self._last_renew is None or self.clock.now() - self._last_renew >= self.renew_every_s)
            ):
                with self._lock:
                    self.check_lease()

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set (SIGTERM); the caller then calls :meth:`close`."""
        while not stop.is_set():
            result = self.tick()
            self._wait(result.next_delay_s, stop)

    def close(self) -> None:
        """Release the Lease (if held), stop the API server, close the client."""
        try:
            if self.elector is not None and self.role.leader:
                self.elector.release()
                self.released = True
        except Exception as exc:  # noqa: BLE001 - the lease then expires on its own in 15 s
            self.close_error = f"lease release failed: {type(exc).__name__}: {exc}"
        finally:
            self.role = Role(False, None, "released on shutdown")
            self.gate.leading = False
            if self.api is not None:
                self.api.stop()
                self.api = None
            self.backend.rest.close()
