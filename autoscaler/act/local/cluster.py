"""``LocalCluster``: the local backend's Inventory and Actuator (act/).

It owns, on one machine: the GPUs (emulated ones from cluster.yaml, real ones
from NVML), one tritonserver per replica pinned to one MIG instance, the
nginx front door and Prometheus (or the direct-scrape fallback). The loop
reads ``snapshot()`` and hands ``apply(actions)`` the plan's actions, which
``apply.py`` carries out under the actuator contract of ``protocols.py``
without ever blocking; the supervisor thread (``supervisor.py``) marks
replicas READY, FAILED or CRASHLOOP every 0.2 s and moves queued action
chains on.

A replica whose process dies is restarted on the same instance (same id, new
ports) under kubelet's back-off, CRASHLOOP while it waits (act/local/supervisor.py).
Every PID started is in ``run_dir/pids.json``; every process is in a process
group we created and dies with the controller (act/local/procs.py).

Multinode models (``backend: multinode``): the planner CREATEs one member per
whole GPU (ids ``"<model>-g<k>-<rank>"``, profile ``"whole"``); the CREATEs of
one group are collected and start ONE ``ProcessGroup`` (rank 0 = tritonserver,
the others ``worker.py``), held here as one replica with ``members``
(``groups.py``). nginx and Prometheus see only the leader; the group is READY
only when every member is; losing any member fails the group and the
supervisor recreates all of it (LeaderWorkerSet's RecreateGroupOnPodRestart).
DRAIN/DELETE of any member stop the whole group.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Self

from autoscaler.act.local.apply import ApplyMixin, ProcessLauncher, ReplicaLauncher
from autoscaler.act.local.backoff import BackoffPolicy, RestartBackoff
from autoscaler.act.local.groups import GroupsMixin
from autoscaler.act.local.nginx import NginxFrontDoor, Route
from autoscaler.act.local.pids import PidRegistry, mark_run_dir, sweep
from autoscaler.act.local.probe import ReplicaLoad, load_between, scrape
from autoscaler.act.local.prometheus import PrometheusServer, ScrapeTarget
from autoscaler.act.local.replicas import LocalReplica, ModelRuntime, replica_env
from autoscaler.act.local.supervisor import InfraState, SupervisionMixin, Supervisor
from autoscaler.act.local.triton import free_ports
from autoscaler.clock import Clock, WallClock
from autoscaler.policy.types import ClusterState, GpuState, ReplicaState
from autoscaler.protocols import ActionQueue
from autoscaler.status import ReplicaEndpoint, ReplicaHealth, ReplicaNumbers, build_status

_log = logging.getLogger("migscale.local")


class LocalCluster(ApplyMixin, GroupsMixin, SupervisionMixin):
    def __init__(
        self,
        run_dir: str | os.PathLike,
        models: Mapping[str, ModelRuntime],
        gpus: Sequence[GpuState],
        *,
        frontdoor_port: int = 0,
        api_port: int = 0,
        prometheus: str = "auto",
        tritonserver: str | None = None,
        mig_uuids: Mapping[tuple[str, int], str] | None = None,
        clock: Clock | None = None,
        wait_ready_timeout_s: float = 60.0,
        drain_timeout_s: float = 30.0,
        term_timeout_s: float = 10.0,
        auto_replace: bool = True,
        emulate: bool = True,
        launcher: ReplicaLauncher | None = None,
        restart_backoff: BackoffPolicy | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        """``launcher``: where replica processes come from (default: real ``tritonserver``
        processes); the contract suite injects fast fake ones. ``startup_timeout_s``: a replica
        not ready this long after its start is stopped and restarted under the back-off, as
        the kubelet does on a failed startup probe (the Kubernetes render allows the same 600 s)."""
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        mark_run_dir(self.run_dir)
        self.models = dict(models)
        self.clock = clock or WallClock()
        self.tritonserver = tritonserver
        self.mig_uuids = dict(mig_uuids or {})
        self.wait_ready_timeout_s = wait_ready_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.term_timeout_s = term_timeout_s
        self.auto_replace = auto_replace
        self.emulate = emulate
        self.launcher: ReplicaLauncher = launcher or ProcessLauncher()
        # The ports left to us are chosen in one call: one free_port() per port may hand
        # the same port out twice (the kernel reuses a port freed a moment ago), and nginx
        # then holds the port Prometheus was given.
        auto = iter(free_ports(3, exclude={p for p in (api_port, frontdoor_port) if p}))
        self.api_port = api_port or next(auto)
        self.door = NginxFrontDoor(self.run_dir, frontdoor_port or next(auto))
        self.prom = PrometheusServer(self.run_dir, prometheus, port=next(auto))
        self.pids = PidRegistry(self.run_dir)
        self._gpus: dict[str, GpuState] = {g.id: g for g in gpus}
        self._replicas: dict[str, LocalReplica] = {}
        self._lock = threading.RLock()
        self._router_lock = threading.Lock()
        self._drains: dict[str, threading.Thread] = {}
        self._deleting: set[str] = set()  # replicas a DELETE asked to go (their drain removes them)
        self.queue = ActionQueue()  # action chains waiting for the world (apply.py)
        self._apply_lock = threading.RLock()  # one chain runner at a time: the loop's apply, the supervisor
        self._seq = 0
        # multinode: member CREATEs seen in this apply(), per group id: rank -> GPU id
        self._pending: dict[str, dict[int, str]] = {}
        self._member_of: dict[str, str] = {}  # planner member id -> group id (our replica id)
        self._loads: dict[str, ReplicaLoad] = {}
        # human-readable lifecycle log (also printed by `up`): the last 200, and how many ever
        self.events: deque[str] = deque(maxlen=200)
        self.events_total = 0
        self.backoff = RestartBackoff(restart_backoff)
        self.infra = {"nginx": InfraState("nginx"), "prometheus": InfraState("prometheus")}
        self._crashloop_since: dict[str, float] = {}  # model -> when its first replica began crash-looping
        self._crashloop_held: set[str] = set()  # models whose replacements crash-loop too
        # the models the configuration declares (None: every model); set by a live config change
        self.declared: frozenset[str] | None = None
        self._rotated_s = float("-inf")
        self._router_error: str | None = None  # the last nginx reload failure, logged once per streak
        self.supervisor = Supervisor(self._supervise, log=self.log)
        self.started = False
        self._stopping = False  # set by stop(): no more starts or restarts

    # ------------------------------------------------------------ urls
    @property
    def frontdoor_url(self) -> str:
        return self.door.url

    @property
    def metrics_api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def prometheus_url(self) -> str | None:
        return self.prom.url

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start nginx (no model ready yet: 503s), Prometheus (or note the fallback), the supervisor."""
        self.door.start(self._routes())
        self.pids.add(self.door.pid, "nginx", program=self.door.program)
        try:
            self.prom.start()
            self.pids.add(self.prom.pid, "prometheus", program=self.prom.program)
            self.supervisor.start()
        except Exception:
            self.stop()
            raise
        self.started = True

    def stop(self) -> None:
        """Stop everything we started, in order: the door (finishes in-flight requests),
        every replica (in parallel), then Prometheus."""
        with self._lock:
            self._stopping = True
        self.supervisor.stop()
        with self._apply_lock:
            self.queue.chains.clear()  # nothing queued outlives the processes it was for
        self.door.stop()
        self.pids.remove(self.door.pid)
        with self._lock:
            reps = list(self._replicas.values())
        threads = [threading.Thread(target=self._stop_process, args=(r,), daemon=True) for r in reps]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.term_timeout_s + 10)
        with self._lock:
            self._replicas.clear()
        self.prom.stop()
        self.pids.remove(self.prom.pid)
        # Whatever a crash left behind (a stub of a generation killed mid-start):
        # every process marked with this run dir or in a group we created.
        sweep(self.run_dir, self.pids.records(), term_timeout_s=2.0)
        self.started = False
        self._stopping = False

    def _stop_process(self, r: LocalReplica) -> None:
        pids = r.pids()
        r.process.stop(timeout_s=self.term_timeout_s)
        for pid in pids:
            self.pids.remove(pid)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _supervise(self) -> None:
        """One supervisor pass: readiness and crashes, then the queued action chains move on."""
        self.supervise_once()
        self.advance()

    def log(self, msg: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {msg}")
        self.events_total += 1
        _log.info(msg)

    def events_since(self, seen: int) -> tuple[list[str], int]:
        """Events logged after the first ``seen`` (those still kept), and the new total."""
        total, kept = self.events_total, list(self.events)
        return kept[max(0, len(kept) - (total - seen)):], total

    # ------------------------------------------------------------ Inventory
    def snapshot(self) -> ClusterState:
        with self._lock:
            held = {g: r.model for r in self._replicas.values() if r.is_group for g in r.gpus}
            return ClusterState(
                gpus=tuple(replace(g, reserved_by=held.get(g.id)) for g in self._gpus.values()),
                replicas=tuple(x for r in self._replicas.values() for x in r.to_replicas()),
            )

    def replica(self, replica_id: str) -> LocalReplica | None:
        """By our id, or by a planner member id of a group (``llm-g0-1`` -> group ``llm-g0``)."""
        with self._lock:
            r = self._replicas.get(replica_id)
            if r is None and replica_id in self._member_of:
                r = self._replicas.get(self._member_of[replica_id])
            return r

    def replicas(self) -> list[LocalReplica]:
        with self._lock:
            return list(self._replicas.values())

    def _relaunch(self, r: LocalReplica):
        """A fresh tritonserver for ``r`` on its instance (new ports); the supervisor restarts with it."""
        gpu = self._gpus[r.gpu]
        uuid = self.mig_uuids.get((gpu.id, r.start)) if not gpu.emulated else None
        env = replica_env(gpu.product, r.profile, gpu.id, r.start, r.model, uuid, self.emulate)
        return self.launcher.replica(self.models[r.model], r.id, self.run_dir, env, self.tritonserver)

    # ------------------------------------------------------------ router + targets
    def _routes(self) -> list[Route]:
        with self._lock:
            return [
                Route(
                    name,
                    tuple(
                        sorted(r.backend for r in self._replicas.values() if r.model == name and r.routable)
                    ),
                    rt.triton_name if rt.triton_name != name else None,
                )
                # a group's backend is its leader: the only member serving HTTP
                for name, rt in sorted(self.models.items())
            ]

    def sync_router(self) -> set[int]:
        """Point nginx at the READY replicas; returns the retiring workers' PIDs."""
        with self._router_lock:
            if not self.door.alive():
                return set()
            return self.door.update(self._routes())

    def sync_targets(self) -> None:
        with self._lock:
            targets = [
                ScrapeTarget(f"127.0.0.1:{r.process.ports.metrics}", r.id, r.model, r.profile, r.gpu, r.start)
                for r in self._replicas.values()
                if r.state in (ReplicaState.READY, ReplicaState.DRAINING)
            ]
        self.prom.write_targets(targets)

    # ------------------------------------------------------------ load (for status)
    def refresh_loads(self) -> dict[str, ReplicaLoad]:
        """Scrape each serving replica once; req/s from the previous sample."""
        now = self.clock.now()
        for r in self.replicas():
            if r.state not in (ReplicaState.READY, ReplicaState.DRAINING):
                self._loads.pop(r.id, None)  # not serving: no numbers, not the last ones before a crash
                continue
            cur = scrape(r.process.url_metrics, now, timeout_s=0.5)
            self._loads[r.id] = load_between(r.last_counters, cur)
            if cur is not None:
                r.last_counters = cur
        return dict(self._loads)

    def loads(self) -> dict[str, ReplicaLoad]:
        return dict(self._loads)

    def status(self, controller_pid: int | None = None) -> dict:
        """The ``migscale status --json`` document from the latest snapshot and loads."""
        reps = self.replicas()
        groups = self._group_views(reps)
        now = self.clock.now()
        health = {
            r.id: ReplicaHealth(
                r.restarts,
                None if r.next_restart_s is None else max(0.0, r.next_restart_s - now),
                r.last_error,
                r.exit_code,
            )
            for r in reps
        }
        return build_status(
            self.snapshot(),
            frontdoor=self.frontdoor_url,
            metrics_api=self.metrics_api_url,
            prometheus=self.prometheus_url,
            endpoints={r.id: ReplicaEndpoint(r.port, r.process.pid) for r in reps},
            numbers={rid: ReplicaNumbers(x.req_s, x.p99_ms) for rid, x in self.loads().items()},
            groups=groups,
            metrics_mode=self.prom.mode,
            controller_pid=controller_pid,
            t_s=now,
            health=health,
            infrastructure={k: v.to_json(now) for k, v in self.infra.items()},
            crashloop_held=tuple(self.crashloop_held()),
        )
