"""The local backend's supervisor thread: readiness and crash detection (act/).

Every ``interval_s`` (0.2 s) it looks at each replica process:
STARTING and answering ``/v2/health/ready`` -> READY, then nginx and the
Prometheus targets are updated; a dead process (STARTING or READY) -> FAILED,
taken out of nginx, and restarted on the same instance. 0.2 s polling plus a
~2 s cold start keeps a killed replica's replacement well inside 10 s.

A multinode group is one replica whose ``process`` is a ``ProcessGroup``: it
is "alive" only while every member runs and "ready" only when the leader is
ready and every worker has joined; a dead member makes the whole group
FAILED and ``restart_failed`` recreates all of it (RecreateGroupOnPodRestart).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from autoscaler.policy.types import ReplicaState


class Supervisor:
    """The thread: calls ``tick`` every ``interval_s`` until stopped; keeps the last errors."""

    def __init__(self, tick: Callable[[], None], interval_s: float = 0.2) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="migscale-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - keep supervising; `migscale status` shows the error
                self.errors.append(f"{type(e).__name__}: {e}")
                del self.errors[:-20]
            self._stop.wait(self.interval_s)


class SupervisionMixin:
    """``LocalCluster``'s side of supervision: one pass over its replicas (see the module doc)."""

    def supervise_once(self) -> None:
        c = self
        failed = []
        became_ready = []
        for r in c.replicas():
            if r.state in (ReplicaState.STARTING, ReplicaState.READY) and not r.process.alive():
                with c._lock:
                    r.state, r.since_s, r.routable = ReplicaState.FAILED, c.clock.now(), False
                if r.is_group:
                    c.log(f"group {r.id} lost a member: {r.process.members()}")
                else:
                    c.log(f"replica {r.id} died (exit {r.process.proc.returncode if r.process.proc else '?'})")
                failed.append(r)
            elif r.state is ReplicaState.STARTING and r.process.is_ready(timeout_s=0.5):
                with c._lock:
                    if r.state is ReplicaState.STARTING:
                        r.routable = True
                        became_ready.append(r)
        if failed or became_ready:
            # Publish READY only once nginx routes to it: whoever waits for READY
            # (WAIT_READY, then a DRAIN of the old replica) can rely on the door.
            # A retiring worker may still accept a connection for a few ms after
            # the new one starts, so wait for the old workers to exit (they hold
            # at most one in-flight batch, ~0.1 s), bounded at 5 s.
            old = c.sync_router()
            c.door.wait_retired(old, timeout_s=5.0)
            with c._lock:
                for r in became_ready:
                    if r.state is ReplicaState.STARTING and r.routable:
                        r.state, r.since_s = ReplicaState.READY, c.clock.now()
                        r.process.ready_at = r.process.ready_at or time.time()
                        c.log(f"ready {r.id} on port {r.port}")
            c.sync_targets()
        if c.auto_replace:
            for r in failed:
                c.restart_failed(r)
