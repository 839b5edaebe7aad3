"""The local backend's supervisor thread: readiness, crashes, back-off, infrastructure (act/).

Place in the loop: beside the control loop, never inside it. Every
``interval_s`` (0.2 s) ``supervise_once`` looks at every process the
``LocalCluster`` runs and moves replicas between states; the loop only reads
the result through ``snapshot()``.

Replicas (a multinode group is one replica whose process is a ``ProcessGroup``):

* STARTING and answering ``/v2/health/ready`` -> put into nginx -> READY once
  nginx was reloaded with it (``ready`` means routed by the front door; while
  a started door is down a replica stays STARTING; a cluster run without a
  door marks it READY on its health alone);
* STARTING or READY and dead -> out of nginx and Prometheus, what is left of
  its process group killed at once (Triton's stubs, the group's other ranks),
  then restarted under kubelet's back-off (``backoff.py``): at once the first
  time, else CRASHLOOP -- with its restart count and last error lines --
  until the back-off has passed. A group is recreated whole
  (LeaderWorkerSet's RecreateGroupOnPodRestart);
* DRAINING belongs to its drain thread, and any replica may be drained while
  the supervisor looks at it: every transition is made under the cluster's
  lock after checking, under that lock, that the state is still the one the
  decision was made on. A slow probe or a process start runs outside the lock.

The policy does not count a CRASHLOOP replica and plans a replacement
elsewhere. When that replacement crash-loops too, the fault is the model's
(a missing dependency, a broken model), not the slot's: the model is held
(``crashloop_held``, reported by ``in_flight``) so the planner stops creating
more, and its replicas keep restarting in place under their back-off until
one is ready.

Infrastructure: a dead nginx master is reaped (its orphaned workers die with
its process group) and restarted under the same back-off; so is Prometheus,
on the same port. Every ``ROTATE_EVERY_S`` the logs are cut to size.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autoscaler.act.local.procs import rotate_log
from autoscaler.policy.types import LIVE, ReplicaState

if TYPE_CHECKING:  # pragma: no cover
    from autoscaler.act.local.replicas import LocalReplica

# Logs are checked against their cap, and Prometheus' targets re-synced, this often.
ROTATE_EVERY_S = 10.0
# A crash loop is over once a replica of the model has stayed ready this long. Ready alone is not
# enough: a model that crashes seconds after it starts serving (a dying backend stub, an
# out-of-memory on the first batches) turns ready every time, and each time the hold lifted the
# policy placed a fresh replica with a fresh back-off -- six starts a minute, for good.
CRASHLOOP_STABLE_S = 60.0


class Supervisor:
    """The thread: calls ``tick`` every ``interval_s`` until stopped; keeps the last 20 errors."""

    def __init__(self, tick: Callable[[], None], interval_s: float = 0.2,
                 log: Callable[[str], None] | None = None) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: deque[str] = deque(maxlen=20)
        self.error_count = 0

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="migscale-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - keep supervising; status and the log show it
                self.error_count += 1
                self.errors.append(f"{type(e).__name__}: {e}")
                if self.log is not None:
                    self.log(f"supervisor pass failed:\n{traceback.format_exc().rstrip()}")
            self._stop.wait(self.interval_s)


@dataclass
class InfraState:
    """nginx or Prometheus as the supervisor sees it (shown by ``migscale status``)."""

    name: str
    state: str = "up"  # up | crashloop | down (not started / stopped)
    restarts: int = 0
    exited_s: float | None = None
    next_restart_s: float | None = None
    last_error: list[str] = field(default_factory=list)

    def to_json(self, now_s: float) -> dict:
        wait = None if self.next_restart_s is None else max(0.0, round(self.next_restart_s - now_s, 1))
        return {"state": self.state, "restarts": self.restarts, "next_restart_in_s": wait,
                "last_error": list(self.last_error)}


class SupervisionMixin:
    """``LocalCluster``'s side of supervision: one pass over its processes (see the module doc)."""

    # ------------------------------------------------------------ one pass
    def supervise_once(self) -> None:
        c = self
        now = c.clock.now()
        c._supervise_infra(now)
        c._stop_stuck_starts(now)
        died: list[LocalReplica] = []
        probe: list[tuple[LocalReplica, object]] = []
        due: list[LocalReplica] = []
        with c._lock:
            for r in c._replicas.values():
                if r.state in LIVE and not r.process.alive():
                    c._on_exit(r, now)
                    died.append(r)
                elif r.state is ReplicaState.STARTING and not r.routable:
                    probe.append((r, r.process))
                elif r.state is ReplicaState.STARTING and r.routable:
                    probe.append((r, None))  # ready, waiting for the door
                elif r.state is ReplicaState.CRASHLOOP and r.next_restart_s is not None \
                        and now >= r.next_restart_s:
                    due.append(r)
                elif r.state is ReplicaState.READY and r.model in c._crashloop_since \
                        and now - r.since_s >= CRASHLOOP_STABLE_S:
                    c._crashloop_cleared(r.model)
        for r in died:
            r.process.reap()  # stubs and other ranks of the dead generation, now
        became_ready = [
            r for r, proc in probe if proc is None or proc.is_ready(timeout_s=0.5)  # type: ignore[attr-defined]
        ]
        with c._lock:
            became_ready = [r for r in became_ready if r.state is ReplicaState.STARTING
                            and c._replicas.get(r.id) is r and r.process.alive()]
            for r in became_ready:
                r.routable = True
        if died or became_ready:
            c._publish_routes(became_ready, died)
        if c.auto_replace:
            for r in died:
                if r.state is ReplicaState.FAILED:
                    c.restart_failed(r)
            for r in due:
                c.restart_failed(r)
        if now - c._rotated_s >= ROTATE_EVERY_S:
            c._rotated_s = now
            c.rotate_logs()
            c.sync_targets()  # a no-op unless a write failed (disk full) or was missed
            with c._lock:
                live = set(c._replicas) | set(c.infra)
            c.backoff.retain(live)  # deleted replicas' back-off entries go: the map stays bounded

    def _stop_stuck_starts(self, now: float) -> None:
        """Kill each replica still not ready ``startup_timeout_s`` after its start (a model whose
        ``initialize`` hangs): the pass that follows sees it dead and restarts it under the
        back-off. Left alone it stayed ``starting`` for good, counted as capacity on its way."""
        c = self
        with c._lock:
            stuck = [r for r in c._replicas.values() if r.state is ReplicaState.STARTING and not r.routable
                     and now - r.since_s > c.startup_timeout_s and r.process.alive()]
            for r in stuck:
                r.startup_timed_out = True
        for r in stuck:
            c.log(f"replica {r.id} not ready after {c.startup_timeout_s:.0f}s; stopping it")
            r.process.reap()  # its whole process group, at once

    def _publish_routes(self, became_ready: list[LocalReplica], died: list[LocalReplica]) -> None:
        """nginx first, then READY: whoever waits for READY (WAIT_READY, then a DRAIN of
        the old replica) can rely on the door. A retiring worker may still accept a
        connection for a few ms, so wait for the old workers to exit (they hold at
        most one in-flight batch, ~0.1 s), bounded at 5 s."""
        c = self
        # No front door at all (a cluster driven without one: scripts, the contract suite):
        # ready is ready. A door that was started must be up and reloaded with the replica.
        routed = c.door.alive() or not c.door.started
        try:
            old = c.sync_router()
            c._router_error = None
        except Exception as e:  # noqa: BLE001 - nginx refused the reload (disk full?): nothing is routed
            msg = f"front door reload failed: {type(e).__name__}: {e}"
            if msg != c._router_error:  # once per streak, not every 0.2 s pass
                c.log(msg + "; retrying")
            c._router_error = msg
            routed, old = False, set()
        if routed:
            c.door.wait_retired(old, timeout_s=5.0)
        now = c.clock.now()
        with c._lock:
            for r in became_ready:
                if routed and r.state is ReplicaState.STARTING and r.routable and c._replicas.get(r.id) is r:
                    r.state, r.since_s = ReplicaState.READY, now
                    r.process.ready_at = r.process.ready_at or time.time()
                    r.process.note_stubs()  # from now on, a dead stub is a dead replica
                    c.log(f"ready {r.id} on port {r.port}")
        c.sync_targets()

    # ------------------------------------------------------------ replicas
    def _on_exit(self, r: LocalReplica, now: float) -> None:
        """A live replica's process died (caller holds the lock): FAILED to restart now, or
        CRASHLOOP until its back-off has passed."""
        c = self
        r.routable = False
        r.exited_s = now
        r.exit_code = r.process.proc.returncode if r.process.proc is not None else None
        r.last_error = tuple(r.process.error_lines())
        dead_stub = r.process.dead_stub
        if dead_stub is not None:
            # the server itself still runs: the reap after this ends it with its group
            stub = f"Python backend stub {dead_stub} died: the server answered 500 to every request; stopped"
            r.last_error = (*r.last_error[-4:], stub)
        elif r.startup_timed_out:
            r.startup_timed_out = False
            stopped = f"not ready after {c.startup_timeout_s:.0f}s; stopped (the lines above are where its log stops)"
            r.last_error = (*r.last_error[-4:], stopped)
        elif r.exit_code is not None and r.exit_code < 0:
            # killed, not failed: its log ends wherever it was (often a banner line), so say what ended it
            try:
                name = signal.Signals(-r.exit_code).name
            except ValueError:
                name = f"signal {-r.exit_code}"
            r.last_error = (*r.last_error[-4:], f"killed by {name} (its log shows no error)")
        what = f"group {r.id} lost a member ({', '.join(r.process.exited())})" if r.is_group else \
            f"replica {r.id} died (exit {r.exit_code})"
        if dead_stub is not None:
            what = f"replica {r.id}: its Python backend stub (pid {dead_stub}) died"
        delay = c.backoff.delay_s(r.id, now, now)
        if delay <= 0 or not c.auto_replace:
            r.state, r.since_s, r.next_restart_s = ReplicaState.FAILED, now, None
            c.log(what)
            return
        r.state, r.since_s, r.next_restart_s = ReplicaState.CRASHLOOP, now, now + delay
        first = c._crashloop_since.setdefault(r.model, now)
        if r.created_s is not None and r.created_s > first and r.model not in c._crashloop_held:
            c._crashloop_held.add(r.model)
            c.log(f"model {r.model}: its replacement crash-loops too; no more replacements until one is ready")
        tail = f": {r.last_error[-1]}" if r.last_error else ""
        c.log(f"{what}; crash loop, restart #{r.restarts + 1} in {delay:.0f}s{tail}")

    def _crashloop_cleared(self, model: str) -> None:
        """A replica of ``model`` stayed ready ``CRASHLOOP_STABLE_S`` (caller holds the lock): the
        model is not crash-looping."""
        if model in self._crashloop_since:
            self.log(f"model {model}: a replica stayed ready {CRASHLOOP_STABLE_S:.0f}s; the crash loop is over")
        self._crashloop_since.pop(model, None)
        self._crashloop_held.discard(model)

    def crashloop_held(self) -> frozenset[str]:
        """Models whose every replica tried crash-loops: the planner must not create more.

        A model removed from the configuration is never held: the hold stops new replicas,
        and it would also stop the drains that retire the crash-looping ones."""
        with self._lock:
            live = {r.model for r in self._replicas.values()}
            self._crashloop_held &= live
            for m in [m for m in self._crashloop_since if m not in live]:
                del self._crashloop_since[m]
            held = self._crashloop_held if self.declared is None else self._crashloop_held & self.declared
            return frozenset(held)

    def restart_failed(self, r: LocalReplica) -> None:
        """Start a FAILED or due CRASHLOOP replica again on its instance (same id, same slot).
        A group is recreated whole: every member stopped, then all started again."""
        c = self
        restartable = (ReplicaState.FAILED, ReplicaState.CRASHLOOP)
        with c._lock:
            if c._stopping or c._replicas.get(r.id) is not r or r.state not in restartable:
                return
            old_pids = r.pids()
        if r.is_group:
            r.process.stop(timeout_s=5.0)  # outside the lock: snapshots and status go on
        with c._lock:
            for pid in old_pids:
                c.pids.remove(pid)
            if c._stopping or c._replicas.get(r.id) is not r or r.state not in restartable:
                return
            now = c.clock.now()
            c.backoff.restarted(r.id, r.exited_s if r.exited_s is not None else now, now)
            # Counted before the start: a reader that sees the new generation (bumped inside
            # start(), read without our lock) must not see the old count.
            r.restarts += 1
            if r.is_group:
                r.process.start()
            else:
                r.process = c._relaunch(r)
            c._record(r)
            r.routable = False
            r.last_counters = None
            r.next_restart_s = None
            r.state, r.since_s = ReplicaState.STARTING, now
            c.log(f"restart {r.id} (restart #{r.restarts}, pids {r.pids()})")

    # ------------------------------------------------------------ nginx, Prometheus
    def _supervise_infra(self, now: float) -> None:
        c = self
        if c._stopping:
            return
        door_down = c._check_infra(c.infra["nginx"], c.door.started and not c.door.alive(), now,
                                   c.door.error_lines)
        if door_down:
            c.door.reap()  # its workers, orphaned on the old configuration, die with it
            c.pids.remove(c.door.pid)
        prom_down = c.prom.binary is not None and c._check_infra(
            c.infra["prometheus"], c.prom.started and not c.prom.alive(), now, c.prom.error_lines)
        if prom_down:
            c.prom.reap()
            c.pids.remove(c.prom.pid)
        for st, restart in ((c.infra["nginx"], c._restart_door), (c.infra["prometheus"], c._restart_prom)):
            if st.state in ("failed", "crashloop") and st.next_restart_s is not None and now >= st.next_restart_s:
                c.backoff.restarted(st.name, st.exited_s or now, now)
                st.restarts += 1
                try:
                    restart()
                except Exception as e:  # noqa: BLE001 - a failed start is one more crash
                    st.last_error = [f"{type(e).__name__}: {e}"][-5:]
                    st.exited_s = c.clock.now()
                    delay = c.backoff.delay_s(st.name, st.exited_s, st.exited_s)
                    st.state, st.next_restart_s = "crashloop", st.exited_s + delay
                    c.log(f"{st.name} restart #{st.restarts} failed: {e}; next in {delay:.0f}s")
                else:
                    st.state, st.next_restart_s = "up", None
                    c.log(f"{st.name} restarted (restart #{st.restarts})")

    def _check_infra(self, st: InfraState, dead: bool, now: float, errors: Callable[[], list[str]]) -> bool:
        """Mark a server that just died; True when it did (the caller reaps it)."""
        if not dead or st.state != "up":
            return False
        st.exited_s = now
        st.last_error = errors()
        delay = self.backoff.delay_s(st.name, now, now)
        st.state = "failed" if delay <= 0 else "crashloop"
        st.next_restart_s = now + delay
        self.log(f"{st.name} died; restart in {delay:.0f}s" + (f": {st.last_error[-1]}" if st.last_error else ""))
        return True

    def _restart_door(self) -> None:
        c = self
        c.door.start(c._routes())
        c.pids.add(c.door.pid, "nginx", program=c.door.program)

    def _restart_prom(self) -> None:
        c = self
        c.prom.start()
        c.pids.add(c.prom.pid, "prometheus", program=c.prom.program)

    # ------------------------------------------------------------ logs
    def rotate_logs(self) -> None:
        """Cut every log of ours that passed its cap (copy-and-truncate, one ``.1`` kept)."""
        c = self
        paths = [c.door.prefix / "logs" / n for n in ("error.log", "access.log", "stdout.log")]
        paths.append(c.prom.dir / "prometheus.log")
        for r in c.replicas():
            paths.extend(r.log_paths())
        for p in paths:
            rotate_log(p)
