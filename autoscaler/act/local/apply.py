"""The local backend's apply path: ``LocalCluster``'s Actuator half (act/).

Place in the loop: the loop hands ``apply(actions)`` the plan's actions; this
module carries them out under the actuator contract of
``autoscaler/protocols.py``, on real processes. ``apply`` never waits for a
process: chains that must wait stay in the cluster's ``ActionQueue`` and the
supervisor thread (every 0.2 s) moves them on, as do later ``apply`` and
``in_flight`` calls.

* CREATE starts the process on an instance that exists in the GPU's layout
  (an emulated GPU is carved by REPARTITION, never by a CREATE) and returns;
  the supervisor marks it READY once ``/v2/health/ready`` answers, and only
  then adds it to nginx and Prometheus' targets.
* WAIT_READY keeps the rest of its chain queued until the replica is READY;
  a replica that fails for good (no ``auto_replace``), disappears, or is not
  READY within ``wait_ready_timeout_s`` fails it and drops the rest of the
  chain (its DRAIN of the replaced replica never runs).
* DRAIN takes the replica out of nginx (graceful reload), waits until the
  retired nginx workers have finished their requests and the replica reports
  nothing pending and no request completing, then stops it (SIGTERM, SIGKILL
  after a timeout) and forgets it: a drained process is retired, as a
  terminating pod is. DELETE starts that drain if nobody did and returns;
  deleting a replica that is gone is done.
* REPARTITION rewrites an emulated GPU's layout at once; an instance it
  removes must be empty (it waits for a replica being drained or deleted, and
  refuses one that still serves).

Processes come from a ``ReplicaLauncher`` (``ProcessLauncher``: real
``tritonserver`` processes), injected so the contract suite can run the same
state machine on fast fake processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autoscaler.act.local.nginx import NginxError
from autoscaler.act.local.probe import ReplicaLoad, scrape
from autoscaler.act.local.replicas import WHOLE, LocalReplica, ModelRuntime, launch, launch_group, replica_env
from autoscaler.mig.layout import Placement, check_layout
from autoscaler.mig.products import get_product
from autoscaler.policy.types import Action, ActionKind, GpuState, ReplicaState
from autoscaler.protocols import WAIT, ActionQueue, Chain, InFlight, action_groups

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.act.local.nginx import NginxFrontDoor
    from autoscaler.act.local.pids import PidRegistry
    from autoscaler.clock import Clock


class ReplicaLauncher(Protocol):
    """Starts (never waits for) the processes of one replica or one multinode group."""

    def replica(self, rt: ModelRuntime, replica_id: str, run_dir: Path, env: dict[str, str],
                tritonserver: str | None) -> Any: ...

    def group(self, rt: ModelRuntime, group_id: str, run_dir: Path, member_env: list[dict[str, str]],
              tritonserver: str | None) -> Any: ...


class ProcessLauncher:
    """Real processes: a ``tritonserver`` per replica, a ``ProcessGroup`` per multinode group."""

    def replica(self, rt, replica_id, run_dir, env, tritonserver):
        return launch(rt, replica_id, run_dir, env, tritonserver)

    def group(self, rt, group_id, run_dir, member_env, tritonserver):
        return launch_group(rt, group_id, run_dir, member_env, tritonserver)


_ERRORS = (ValueError, KeyError, RuntimeError, OSError)  # what a step turns into an error line


class ApplyMixin:
    """Mixed into ``LocalCluster``; uses its processes, lock, router and PID registry."""

    # provided by LocalCluster
    run_dir: Path
    models: dict[str, ModelRuntime]
    clock: Clock
    tritonserver: str | None
    mig_uuids: dict[tuple[str, int], str]
    wait_ready_timeout_s: float
    drain_timeout_s: float
    term_timeout_s: float
    auto_replace: bool
    emulate: bool
    launcher: ReplicaLauncher
    door: NginxFrontDoor
    pids: PidRegistry
    queue: ActionQueue
    _gpus: dict[str, GpuState]
    _replicas: dict[str, LocalReplica]
    _lock: threading.RLock
    _apply_lock: threading.RLock
    _drains: dict[str, threading.Thread]
    _deleting: set[str]
    _pending: dict[str, dict[int, str]]
    _member_of: dict[str, str]
    _loads: dict[str, ReplicaLoad]
    _stopping: bool
    _seq: int
    log: Callable[[str], None]
    replica: Callable[[str], LocalReplica | None]
    replicas: Callable[[], list[LocalReplica]]
    sync_router: Callable[[], set[int]]
    sync_targets: Callable[[], None]
    _record: Callable[[LocalReplica], None]
    _create_member: Callable[[Action, ModelRuntime], str | None]
    crashloop_held: Callable[[], frozenset[str]]

    # ------------------------------------------------------------ Actuator
    def apply(self, actions: Sequence[Action]) -> list[str]:
        with self._apply_lock:
            now = self.clock.now()
            self.queue.run(self._step, now)
            fresh = self.queue.submit(actions, self._owner)
            errors = self.queue.run(self._step, now, fresh)
            errors += self._partial_groups()
            return errors

    def advance(self) -> None:
        """Move queued chains on (the supervisor calls this every pass); errors go to ``take_errors``."""
        with self._apply_lock:
            if self.queue or self._pending:
                self.queue.run(self._step, self.clock.now())
                self.queue.report(self._partial_groups())

    def take_errors(self) -> list[str]:
        with self._apply_lock:
            return self.queue.take_errors()

    def groups(self, actions: Sequence[Action]) -> list[int]:
        return action_groups(actions, self._owner)

    def in_flight(self) -> InFlight:
        """(GPUs, models) with work under way (the contract in ``protocols.py``).

        Queued actions other than WAIT_READY make their GPU and model busy;
        a replica draining or being deleted makes its GPU busy; a failed
        replica the supervisor will restart (``auto_replace``) makes its GPU
        and model busy -- the snapshot will count it again once it is back,
        so planning a replacement would double it. A replica that is only
        starting is capacity on its way: its GPU and model may keep changing.
        A CRASHLOOP replica is neither: the policy counts it as missing and
        places a replacement elsewhere -- unless that replacement crash-loops
        too, then the model is held (``crashloop_held``, supervisor.py): the
        fault is the model's, and more replicas would only loop as well.
        """
        self.advance()
        held = self.crashloop_held()
        with self._apply_lock, self._lock:
            gpus, models = self.queue.busy(self._owner)
            for r in self._replicas.values():
                if r.state is ReplicaState.DRAINING or r.id in self._deleting:
                    gpus.update(r.gpus)
                elif r.state is ReplicaState.FAILED and self.auto_replace:
                    gpus.update(r.gpus)
                    models.add(r.model)
            return frozenset(gpus), frozenset(models | held)

    def settled(self) -> bool:
        """Nothing queued, no replica starting, no drain running (queued chains moved on first)."""
        self.advance()
        with self._apply_lock, self._lock:
            return not (self.queue or self._drains or self._pending or any(
                r.state is ReplicaState.STARTING for r in self._replicas.values()))

    def wait_settled(self, timeout_s: float = 120.0) -> list[str]:
        """Block until ``settled()`` (scripts, tests, benchmarks; never the loop); returns the
        errors of queued actions, plus one if it timed out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.settled():
                return self.take_errors()
            if time.monotonic() > deadline:
                return [*self.take_errors(), f"not settled after {timeout_s:.0f}s"]
            time.sleep(0.05)

    def apply_and_wait(self, actions: Sequence[Action], timeout_s: float = 120.0) -> list[str]:
        """``apply`` then ``wait_settled``: every error, at once or later (scripts and tests)."""
        return self.apply(actions) + self.wait_settled(timeout_s)

    def _owner(self, rid: str) -> tuple[str, str] | None:
        r = self.replica(rid)
        return (r.gpu, r.model) if r is not None else None

    def _partial_groups(self) -> list[str]:
        """A group starts only with all its members: members left over once no queued CREATE
        can complete the group are an error, not a half group."""
        with self._lock:
            queued = {x.replica.rpartition("-")[0] for c in self.queue.chains for x in c.actions
                      if x.kind is ActionKind.CREATE and x.replica}
            errors = [f"create {gid}: only members {sorted(ranks)} of the group were created; none started"
                      for gid, ranks in self._pending.items() if gid not in queued]
            for gid in [g for g in self._pending if g not in queued]:
                del self._pending[gid]
            return errors

    # ------------------------------------------------------------ one action
    def _step(self, a: Action, chain: Chain, now: float) -> str | None:
        try:
            if a.kind is ActionKind.CREATE:
                return self._create(a, chain)
            if a.kind is ActionKind.WAIT_READY:
                return self._wait_ready(a, chain, now)
            if a.kind is ActionKind.DRAIN:
                r = self._target(a)
                if r is not None:
                    self._drain(r)
                return None
            if a.kind is ActionKind.DELETE:
                r = self._target(a)
                if r is not None:  # gone already: deleting is idempotent
                    with self._lock:
                        self._deleting.add(r.id)
                    self._drain(r)
                return None
            if a.kind is ActionKind.REPARTITION:
                return self._repartition(a, chain)
            return f"{a.kind}: not supported by the local backend"  # pragma: no cover - new enum members
        except _ERRORS as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            return f"{a.kind.value} {a.model or ''} {a.gpu or ''}@{a.start}: {msg}".replace("  ", " ")

    def _target(self, a: Action) -> LocalReplica | None:
        with self._lock:
            if a.replica:
                return self.replica(a.replica)
            for r in self._replicas.values():
                if a.gpu in r.gpus and r.start == a.start and (a.model is None or r.model == a.model):
                    return r
        return None

    def _leaving(self, r: LocalReplica) -> bool:
        """Draining, being deleted, or with a DRAIN/DELETE of it still queued (caller holds ``_lock``)."""
        if r.state is ReplicaState.DRAINING or r.id in self._deleting:
            return True
        ids = {r.id, *(mid for mid, _ in r.members)}
        return any(x.kind in (ActionKind.DRAIN, ActionKind.DELETE) and x.replica in ids
                   for c in self.queue.chains for x in c.actions)

    # -- CREATE
    def _create(self, a: Action, chain: Chain) -> str | None:
        if a.model is None or a.gpu is None or a.profile is None or a.start is None:
            raise ValueError("CREATE needs model, gpu, profile and start")
        rt = self.models.get(a.model)
        if rt is None:
            raise ValueError(f"unknown model {a.model!r}; known: {', '.join(self.models)}")
        with self._lock:
            if self._stopping:
                raise RuntimeError("the local cluster is stopping")
            known = self.replica(a.replica) if a.replica else None
            if known is not None:
                if (a.gpu in known.gpus and known.model == a.model and known.profile == a.profile
                        and (known.is_group or known.start == a.start)):
                    chain.created.append(a.replica)
                    return None  # applied again after it took effect
                raise ValueError(f"replica id {a.replica!r} already exists on {known.gpu}@{known.start}")
            gpu = self._gpus.get(a.gpu)
            if gpu is None:
                raise ValueError(f"unknown GPU {a.gpu!r}; known: {', '.join(self._gpus)}")
            occupants = self._occupants(gpu, a.profile, a.start)
            if occupants and all(self._leaving(r) for r in occupants):
                return WAIT  # the instance is being freed: make-before-break inside the chain
        if rt.backend == "multinode":
            rid = self._create_member(a, rt)
            chain.created.append(a.replica or rid or "")
            return None
        if rt.backend != "mig":
            raise ValueError(f"model {a.model!r} uses backend {rt.backend!r}, not MIG replicas")
        with self._lock:
            if not gpu.mig_enabled:
                raise ValueError(f"{gpu.id} is held whole (MIG disabled); model {a.model!r} needs a MIG slice")
            get_product(gpu.product).profile(a.profile)
            pl = Placement(a.start, a.profile)
            if pl not in gpu.layout:
                how = "repartition with nvidia-smi" if not gpu.emulated else "carve it with a REPARTITION first"
                raise ValueError(f"{gpu.id} has no MIG instance {pl} ({how}); layout "
                                 f"{[str(p) for p in gpu.layout]}")
            if occupants:
                raise ValueError(f"instance {pl} on {gpu.id} already hosts replica {occupants[0].id}")
            self._seq += 1
            rid = a.replica or f"{a.model}-{gpu.id.replace('/', '-')}-s{a.start}-{self._seq}"
            uuid = self.mig_uuids.get((gpu.id, a.start)) if not gpu.emulated else None
            env = replica_env(gpu.product, a.profile, gpu.id, a.start, a.model, uuid, self.emulate)
            proc = self.launcher.replica(rt, rid, self.run_dir, env, self.tritonserver)
            r = LocalReplica(rid, a.model, a.profile, gpu.id, a.start, proc, ReplicaState.STARTING, self.clock.now())
            self._record(r)
            self._replicas[rid] = r
            chain.created.append(rid)
            self.log(f"create {rid} ({a.profile} on {gpu.id} slot {a.start}, pid {proc.pid})")
            return None

    def _occupants(self, gpu: GpuState, profile: str, start: int) -> list[LocalReplica]:
        """Replicas on an instance overlapping ``profile@start`` (any replica for a whole GPU)."""
        out = []
        product = get_product(gpu.product)
        for r in self._replicas.values():
            if gpu.id not in r.gpus:
                continue
            unsliced = (profile == WHOLE or r.is_group or r.profile not in product.profiles
                        or profile not in product.profiles)
            if unsliced or set(product.profile(profile).span(start)) & set(product.profile(r.profile).span(r.start)):
                out.append(r)
        return out

    # -- WAIT_READY
    def _wait_ready(self, a: Action, chain: Chain, now: float) -> str | None:
        named = [a.replica] if a.replica else chain.created
        # a later plan removed it: nothing left to wait for
        named = [x for x in named if not self.queue.superseded(x)]
        if a.replica or chain.created:
            ids = [self._member_of.get(x, x) for x in named]
        else:
            ids = [r.id for r in self.replicas()
                   if r.state is not ReplicaState.DRAINING
                   and (a.model is None or r.model == a.model)
                   and (a.gpu is None or a.gpu in r.gpus)
                   and (a.start is None or r.start == a.start)]
        for rid in dict.fromkeys(ids):
            if self.queue.superseded(rid):
                continue
            r = self.replica(rid)
            if r is None:
                return f"wait_ready {rid}: replica does not exist"
            if r.state is ReplicaState.READY:
                continue
            if r.state is ReplicaState.FAILED and not self.auto_replace:
                return f"wait_ready {rid}: replica failed ({r.process.tail_log(3)})"
            if r.state is ReplicaState.DRAINING:
                return f"wait_ready {rid}: replica is draining"
            if r.state is ReplicaState.CRASHLOOP:
                last = r.last_error[-1] if r.last_error else f"exit {r.exit_code}"
                return f"wait_ready {rid}: crash-looping ({last})"
            since = chain.head_since if chain.head_since is not None else now
            if now - since > self.wait_ready_timeout_s:
                return f"wait_ready {rid}: not ready after {self.wait_ready_timeout_s:.0f}s"
            return WAIT
        return None

    # -- DRAIN / DELETE
    def _drain(self, r: LocalReplica) -> None:
        with self._lock:
            if r.id in self._drains or self._replicas.get(r.id) is not r:
                return
            r.state, r.since_s = ReplicaState.DRAINING, self.clock.now()
            r.routable = False
            t = threading.Thread(target=self._drain_worker, args=(r,), name=f"drain-{r.id}", daemon=True)
            self._drains[r.id] = t
        self.log(f"drain {r.id}")
        t.start()

    def _drain_worker(self, r: LocalReplica) -> None:
        try:
            try:
                old_workers = self.sync_router()
            except NginxError as e:
                # The door died or refused the reload: it routes nothing to this replica once
                # it is restarted or reloaded from the routes, which no longer name it.
                self.log(f"drain {r.id}: front door not reloaded ({e})")
                old_workers = set()
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
                    for mid, _ in r.members:
                        self._member_of.pop(mid, None)
                self._drains.pop(r.id, None)
                self._deleting.discard(r.id)
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
    def _repartition(self, a: Action, chain: Chain) -> str | None:
        if a.gpu is None or (a.layout is None and a.profile != WHOLE):
            raise ValueError("REPARTITION needs gpu and layout")
        with self._lock:
            gpu = self._gpus.get(a.gpu)
            if gpu is None:
                raise ValueError(f"unknown GPU {a.gpu!r}")
            if not gpu.emulated:
                raise ValueError(f"{gpu.id} is a real GPU: repartition it with nvidia-smi/mig-parted, then restart")
            whole = a.profile == WHOLE
            layout = () if whole else tuple(sorted(a.layout or ()))
            if not whole:
                problems = check_layout(get_product(gpu.product), layout)
                if problems:
                    raise ValueError(f"layout for {gpu.id} is invalid: {'; '.join(problems)}")
            if (whole and not gpu.mig_enabled) or (not whole and gpu.mig_enabled and layout == gpu.layout):
                return None  # already so
            affected = [r for r in self._replicas.values() if gpu.id in r.gpus and (
                whole or r.is_group or not gpu.mig_enabled or Placement(r.start, r.profile) not in layout)]
            if affected and all(self._leaving(r) for r in affected):
                return WAIT  # the drains finish first: make-before-break
            if affected:
                if any(r.is_group for r in affected):
                    raise ValueError(f"refusing to repartition {gpu.id}: it is held by group "
                                     f"{next(r.id for r in affected if r.is_group)}")
                busy = ", ".join(f"{r.id} on {r.profile}@{r.start}" for r in affected)
                if whole:
                    raise ValueError(f"refusing to take {gpu.id} whole: it still hosts {busy}")
                raise ValueError(f"refusing to repartition {gpu.id}: affected instances still host {busy}")
            self._gpus[gpu.id] = replace(gpu, layout=layout, mig_enabled=not whole)
            self.log(f"repartition {gpu.id}: " + (
                "whole GPU (MIG disabled)" if whole else ",".join(str(p) for p in layout)))
            return None
