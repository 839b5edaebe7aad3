"""``LocalCluster``: the local backend's Inventory and Actuator (act/).

It owns, on one machine: the GPUs (emulated ones from cluster.yaml, real ones
from NVML), one tritonserver per replica pinned to one MIG instance, the
nginx front door and Prometheus (or the direct-scrape fallback). The loop
reads ``snapshot()`` and hands ``apply(actions)`` the plan's actions:

* CREATE starts the process and returns at once; the supervisor thread polls
  ``/v2/health/ready``, marks it READY and only then adds it to nginx and to
  Prometheus' targets.
* WAIT_READY blocks until the named (or just created) replicas are READY; if
  one fails, the DRAIN/DELETE/REPARTITION actions after it are skipped, so a
  scale change is make-before-break even when the new replica never comes up.
* DRAIN removes the replica from nginx (graceful reload), waits until the
  retired nginx workers have finished their requests and the replica reports
  nothing pending and no request completing, then SIGTERM (SIGKILL after a
  timeout). DELETE waits for that (or drains first if nobody asked).
* REPARTITION rewrites an emulated GPU's layout; it refuses while an affected
  instance still hosts a replica.

A replica whose process dies is restarted on the same instance (same id, new
ports) under kubelet's back-off, CRASHLOOP while it waits (act/local/supervisor.py).
Every PID started is in ``run_dir/pids.json``; every process is in a process
group we created and dies with the controller (act/local/procs.py).

Multinode models (``backend: multinode``): the planner CREATEs one member per
whole GPU (ids ``"<model>-g<k>-<rank>"``, profile ``"whole"``); the CREATEs of
one group are collected and start ONE ``ProcessGroup`` (rank 0 = tritonserver,
the others ``worker.py``), held here as one replica with ``members``. nginx and
Prometheus see only the leader; the group is READY only when every member is;
losing any member fails the group and the supervisor recreates all of it
(LeaderWorkerSet's RecreateGroupOnPodRestart). DRAIN/DELETE of any member
stop the whole group.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Self

from autoscaler.act.local.backoff import BackoffPolicy, RestartBackoff
from autoscaler.act.local.groups import GroupsMixin
from autoscaler.act.local.nginx import NginxFrontDoor, Route
from autoscaler.act.local.pids import PidRegistry, sweep
from autoscaler.act.local.probe import ReplicaLoad, load_between, scrape
from autoscaler.act.local.prometheus import PrometheusServer, ScrapeTarget
from autoscaler.act.local.replicas import WHOLE, LocalReplica, ModelRuntime, launch, replica_env
from autoscaler.act.local.supervisor import InfraState, SupervisionMixin, Supervisor
from autoscaler.act.local.triton import free_port
from autoscaler.clock import Clock, WallClock
from autoscaler.mig.layout import Placement, check_layout, free_starts
from autoscaler.mig.products import get_product
from autoscaler.policy.types import Action, ActionKind, ClusterState, GpuState, ReplicaState
from autoscaler.status import ReplicaEndpoint, ReplicaHealth, ReplicaNumbers, build_status

_log = logging.getLogger("migscale.local")


class LocalCluster(GroupsMixin, SupervisionMixin):
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
        restart_backoff: BackoffPolicy | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.models = dict(models)
        self.clock = clock or WallClock()
        self.tritonserver = tritonserver
        self.mig_uuids = dict(mig_uuids or {})
        self.wait_ready_timeout_s = wait_ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.term_timeout_s = term_timeout_s
        self.auto_replace = auto_replace
        self.emulate = emulate
        self.api_port = api_port or free_port()
        self.door = NginxFrontDoor(self.run_dir, frontdoor_port or free_port())
        self.prom = PrometheusServer(self.run_dir, prometheus)
        self.pids = PidRegistry(self.run_dir)
        self._gpus: dict[str, GpuState] = {g.id: g for g in gpus}
        self._replicas: dict[str, LocalReplica] = {}
        self._lock = threading.RLock()
        self._router_lock = threading.Lock()
        self._drains: dict[str, threading.Thread] = {}
        # Replicas our drains removed: a later DELETE of one is done. Bounded: a
        # DELETE follows its DRAIN within a tick or two, 1,000 ids is hours of churn.
        self._gone: _BoundedSet = _BoundedSet(1000)
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
        self._rotated_s = float("-inf")
        self._router_error: str | None = None  # the last nginx reload failure, logged once per streak
        self.supervisor = Supervisor(self.supervise_once, log=self.log)
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

    # ------------------------------------------------------------ Actuator
    def converging(self) -> bool:
        with self._lock:
            return any(
                r.state in (ReplicaState.STARTING, ReplicaState.DRAINING, ReplicaState.FAILED)
                for r in self._replicas.values()
            )

    def in_flight(self) -> tuple[frozenset[str], frozenset[str]]:
        """(GPUs, models) still converging, for the loop's per-GPU/per-model gate.

        ``apply`` is synchronous here (WAIT_READY blocks inside it), so no action
        is ever queued: what is in flight is a replica starting, draining or
        failed (the supervisor restarts it). Their GPUs are busy; so are the
        models of draining and failed replicas -- the snapshot still counts the
        one and will recount the other once restarted, so planning on top of
        them would double up. A replica that is only starting is capacity on
        its way, which the policy counts: its model may keep scaling.
        """
        with self._lock:
            gpus: set[str] = set()
            models: set[str] = set()
            for r in self._replicas.values():
                if r.state in (ReplicaState.STARTING, ReplicaState.DRAINING, ReplicaState.FAILED):
                    gpus.update(r.gpus)
                if r.state in (ReplicaState.DRAINING, ReplicaState.FAILED):
                    models.add(r.model)
        # A model whose replacements crash-loop too: no more creates (supervisor.py).
        return frozenset(gpus), frozenset(models | self.crashloop_held())

    def apply(self, actions: Sequence[Action]) -> list[str]:
        errors: list[str] = []
        created: list[str] = []
        blocked: str | None = None  # set when a WAIT_READY failed: no break before make
        for a in actions:
            if blocked and a.kind in (ActionKind.DRAIN, ActionKind.DELETE, ActionKind.REPARTITION):
                errors.append(f"{a.kind.value} {a.replica or a.gpu}: skipped, {blocked}")
                continue
            try:
                if a.kind is ActionKind.CREATE:
                    rid = self._create(a)
                    if rid is not None:
                        created.append(rid)
                elif a.kind is ActionKind.WAIT_READY:
                    err = self._wait_ready(a, created)
                    if err:
                        errors.append(err)
                        blocked = "an earlier WAIT_READY failed"
                elif a.kind is ActionKind.DRAIN:
                    self._drain(self._target(a))
                elif a.kind is ActionKind.DELETE:
                    if a.replica and a.replica in self._gone and self.replica(a.replica) is None:
                        continue  # its DRAIN already finished (the drain stops the process)
                    err = self._delete(self._target(a))
                    if err:
                        errors.append(err)
                elif a.kind is ActionKind.REPARTITION:
                    self._repartition(a)
                else:  # pragma: no cover - new enum members
                    errors.append(f"{a.kind}: not supported by the local backend")
            except (ValueError, KeyError, RuntimeError, OSError) as e:
                msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
                errors.append(
                    f"{a.kind.value} {a.model or ''} {a.gpu or ''}@{a.start}: {msg}".replace("  ", " ")
                )
        with self._lock:
            # A group starts only with all its members: a partial set is an error, not a half group.
            for gid, ranks in self._pending.items():
                errors.append(f"create {gid}: only members {sorted(ranks)} of the group were created; none started")
            self._pending.clear()
        return errors

    # -- CREATE
    def _create(self, a: Action) -> str | None:
        if a.model is None or a.gpu is None or a.profile is None or a.start is None:
            raise ValueError("CREATE needs model, gpu, profile and start")
        rt = self.models.get(a.model)
        if rt is None:
            raise ValueError(f"unknown model {a.model!r}; known: {', '.join(self.models)}")
        if rt.backend == "multinode":
            return self._create_member(a, rt)
        if rt.backend != "mig":
            raise ValueError(f"model {a.model!r} uses backend {rt.backend!r}, not MIG replicas")
        with self._lock:
            if self._stopping:
                raise RuntimeError("the local cluster is stopping")
            gpu = self._gpus.get(a.gpu)
            if gpu is None:
                raise ValueError(f"unknown GPU {a.gpu!r}; known: {', '.join(self._gpus)}")
            if not gpu.mig_enabled:
                raise ValueError(f"{gpu.id} is held whole (MIG disabled); model {a.model!r} needs a MIG slice")
            product = get_product(gpu.product)
            product.profile(a.profile)
            pl = Placement(a.start, a.profile)
            if pl not in gpu.layout:
                if not gpu.emulated:
                    raise ValueError(
                        f"{gpu.id} has no MIG instance {pl} (real GPU: repartition with nvidia-smi)"
                    )
                if a.start not in free_starts(product, gpu.layout, a.profile):
                    raise ValueError(f"{pl} does not fit beside {[str(p) for p in gpu.layout]} on {gpu.id}")
                # Creating a replica on a free slot of an emulated GPU creates the instance.
                self._gpus[gpu.id] = replace(gpu, layout=tuple(sorted(gpu.layout + (pl,))))
            busy = [r.id for r in self._replicas.values() if r.gpu == gpu.id and r.start == a.start]
            if busy:
                raise ValueError(f"instance {pl} on {gpu.id} already hosts replica {busy[0]}")
            self._seq += 1
            rid = a.replica or f"{a.model}-{gpu.id.replace('/', '-')}-s{a.start}-{self._seq}"
            if rid in self._replicas:
                raise ValueError(f"replica id {rid!r} already exists")
            self._gone.discard(rid)
            uuid = self.mig_uuids.get((gpu.id, a.start)) if not gpu.emulated else None
            env = replica_env(gpu.product, a.profile, gpu.id, a.start, a.model, uuid, self.emulate)
            proc = launch(rt, rid, self.run_dir, env, self.tritonserver)
            r = LocalReplica(rid, a.model, a.profile, gpu.id, a.start, proc, ReplicaState.STARTING, self.clock.now())
            self._record(r)
            self._replicas[rid] = r
            self.log(f"create {rid} ({a.profile} on {gpu.id} slot {a.start}, pid {proc.pid})")
            return rid

    def _relaunch(self, r: LocalReplica):
        """A fresh tritonserver for ``r`` on its instance (new ports); the supervisor restarts with it."""
        gpu = self._gpus[r.gpu]
        uuid = self.mig_uuids.get((gpu.id, r.start)) if not gpu.emulated else None
        env = replica_env(gpu.product, r.profile, gpu.id, r.start, r.model, uuid, self.emulate)
        return launch(self.models[r.model], r.id, self.run_dir, env, self.tritonserver)

    # -- WAIT_READY
    def _wait_ready(self, a: Action, created: list[str]) -> str | None:
        if a.replica:
            ids = [self._member_of.get(a.replica, a.replica)]
        else:
            # The replicas CREATEd earlier in this call; when the CREATE came in an
            # earlier call, every replica still starting (that matches the filters).
            pool = created or [r.id for r in self.replicas() if r.state is not ReplicaState.READY]
            ids = [
                rid
                for rid in pool
                if (r := self.replica(rid)) is not None
                and r.state is not ReplicaState.DRAINING
                and (a.model is None or r.model == a.model)
                and (a.gpu is None or a.gpu in r.gpus)
                and (a.start is None or r.start == a.start)
            ]
            ids = list(dict.fromkeys(ids))
        deadline = time.monotonic() + self.wait_ready_timeout_s
        pending = set(ids)
        while pending:
            for rid in list(pending):
                r = self.replica(rid)
                if r is None:
                    return f"wait_ready {rid}: replica does not exist"
                if r.state is ReplicaState.READY:
                    pending.discard(rid)
                elif r.state is ReplicaState.FAILED and not self.auto_replace:
                    return f"wait_ready {rid}: replica failed ({r.process.tail_log(3)})"
                elif r.state is ReplicaState.CRASHLOOP:
                    last = r.last_error[-1] if r.last_error else f"exit {r.exit_code}"
                    return f"wait_ready {rid}: crash-looping ({last})"
            if pending and time.monotonic() > deadline:
                waited = f"{self.wait_ready_timeout_s:.0f}s"
                return f"wait_ready {', '.join(sorted(pending))}: not ready after {waited}"
            if pending:
                time.sleep(0.05)
        return None

    # -- DRAIN / DELETE
    def _target(self, a: Action) -> LocalReplica:
        with self._lock:
            if a.replica:
                r = self.replica(a.replica)
                if r is None:
                    raise ValueError(f"unknown replica {a.replica!r}")
                return r
            for r in self._replicas.values():
                if a.gpu in r.gpus and r.start == a.start and (a.model is None or r.model == a.model):
                    return r
        raise ValueError(f"no replica at {a.gpu}@{a.start}")

    def _drain(self, r: LocalReplica) -> threading.Thread:
        with self._lock:
            t = self._drains.get(r.id)
            if t is not None:
                return t
            r.state, r.since_s = ReplicaState.DRAINING, self.clock.now()
            r.routable = False
            t = threading.Thread(target=self._drain_worker, args=(r,), name=f"drain-{r.id}", daemon=True)
            self._drains[r.id] = t
        self.log(f"drain {r.id}")
        t.start()
        return t

    def _delete(self, r: LocalReplica) -> str | None:
        t = self._drain(r)
        t.join(self.drain_timeout_s + self.term_timeout_s + 60)
        if t.is_alive():
            return f"delete {r.id}: drain still running"
        return None

    def _drain_worker(self, r: LocalReplica) -> None:
        try:
            old_workers = self.sync_router()
            # Once the workers of the old config have exited, every request nginx
            # sent to this replica has been answered and no new one can arrive.
            self.door.wait_retired(old_workers)
            self._wait_idle(r)
        finally:
            pids = r.pids()
            r.process.stop(timeout_s=self.term_timeout_s)
            for pid in pids:
                self.pids.remove(pid)
            with self._lock:
                if self._replicas.get(r.id) is r:
                    del self._replicas[r.id]
                    self._gone.add(r.id)
                    for mid, _ in r.members:
                        self._gone.add(mid)  # the DELETE of every other member is then done too
                        self._member_of.pop(mid, None)
                self._drains.pop(r.id, None)
                self._loads.pop(r.id, None)
            self.sync_targets()
            self.log(f"deleted {r.id}")

    def _wait_idle(self, r: LocalReplica) -> None:
        """Nothing queued and the completed-count stable for 2 polls 0.2 s apart (direct clients too)."""
        deadline = time.monotonic() + self.drain_timeout_s
        prev = None
        while time.monotonic() < deadline and r.process.alive():
            cur = scrape(r.process.url_metrics, self.clock.now())
            if cur is not None and cur.pending == 0 and prev is not None and cur.completed == prev.completed:
                return
            prev = cur
            time.sleep(0.2)

    # -- REPARTITION
    def _repartition(self, a: Action) -> None:
        if a.gpu is None or a.layout is None:
            raise ValueError("REPARTITION needs gpu and layout")
        with self._lock:
            gpu = self._gpus.get(a.gpu)
            if gpu is None:
                raise ValueError(f"unknown GPU {a.gpu!r}")
            if not gpu.emulated:
                raise ValueError(
                    f"{gpu.id} is a real GPU: repartition it with nvidia-smi/mig-parted, then restart"
                )
            busy_group = [r.id for r in self._replicas.values() if r.is_group and gpu.id in r.gpus]
            if busy_group:
                raise ValueError(f"refusing to repartition {gpu.id}: it is held by group {busy_group[0]}")
            if a.profile == WHOLE:
                # Whole-GPU mode for a multinode group: MIG off, no instances.
                busy = [r.id for r in self._replicas.values() if r.gpu == gpu.id]
                if busy:
                    raise ValueError(f"refusing to take {gpu.id} whole: it still hosts {', '.join(busy)}")
                self._gpus[gpu.id] = replace(gpu, layout=(), mig_enabled=False)
                self.log(f"repartition {gpu.id}: whole GPU (MIG disabled)")
                return
            problems = check_layout(get_product(gpu.product), a.layout)
            if problems:
                raise ValueError(f"layout for {gpu.id} is invalid: {'; '.join(problems)}")
            new = set(a.layout)
            busy = [
                f"{r.id} on {r.profile}@{r.start}"
                for r in self._replicas.values()
                if r.gpu == gpu.id and Placement(r.start, r.profile) not in new
            ]
            if busy:
                raise ValueError(
                    f"refusing to repartition {gpu.id}: affected instances still host {', '.join(busy)}"
                )
            self._gpus[gpu.id] = replace(gpu, layout=tuple(sorted(a.layout)), mig_enabled=True)
            self.log(f"repartition {gpu.id}: {','.join(str(p) for p in sorted(a.layout))}")

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


class _BoundedSet:
    """A set that forgets its oldest members past ``limit`` (insertion order)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._d[key] = None
        self._d.move_to_end(key)
        while len(self._d) > self.limit:
            self._d.popitem(last=False)

    def discard(self, key: str) -> None:
        self._d.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
