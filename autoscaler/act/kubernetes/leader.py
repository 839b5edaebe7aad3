"""Leader election on a ``coordination.k8s.io/v1`` Lease, renewed from its own thread, with fencing.

Place in the loop: beside it. ``LeaseElector.run`` tries to acquire or renew
every ``retry_period_s`` on a thread of its own, so a tick that takes a
minute (a slow plan, a slow API server) never lets the lease lapse; the tick
only reads the outcome. The protocol is client-go's leaderelection
(docs/kubernetes.md):

- no Lease: create it with ourselves as holder (409: someone else won);
- a Lease held by another replica is **expired only when this process has
  seen the same record, unchanged, for ``leaseDurationSeconds`` of its own
  clock** (``observed_at`` is when the record last changed as we saw it).
  The holder's ``renewTime`` is written by another machine's clock and is
  never compared with ours, so clock skew between nodes cannot hand the
  lease over early;
- a leader that cannot renew for ``renew_deadline_s`` stops leading.

Fencing: ``holds()`` is true only while this replica leads *and* its last
successful renewal is younger than ``renew_deadline_s``; ``check_write``
raises ``Fenced`` otherwise, and ``KubeRest.guard`` calls it before every
write. Because ``renew_deadline_s`` < ``lease_duration_s`` (15 s / 10 s /
2 s by default, client-go's), a deposed leader has stopped writing before
any follower can consider the lease expired: the follower waits a full
lease duration from when *it* saw the last renewal, which came after the
leader's own clock started its renew deadline.

Every Lease write carries the resourceVersion we read, so of two replicas
that both see an expired lease only one update succeeds.

Why not the ``kubernetes`` package's own ``leaderelection``: it measures with
the wall clock (``time.time``), takes no injected clock (tests could not
jump time), runs the leader's work in a callback and returns for good once
leadership is lost (a follower that keeps deciding and serving the metrics
API does not fit), and offers no check a write can ask before it leaves.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from autoscaler.act.kubernetes.client import Fenced, KubeError, KubeRest
from autoscaler.act.kubernetes.render import labels
from autoscaler.clock import Clock, WallClock

log = logging.getLogger("migscale.leader")
LEASE = ("coordination.k8s.io/v1", "Lease")
JITTER = 1.2  # client-go: a follower retries after retry_period * [1, 2.2)


def micro_time(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseStatus:
    leader: bool
    holder: str | None
    reason: str


def check_timings(lease_duration_s: float, renew_deadline_s: float, retry_period_s: float) -> list[str]:
    """client-go's rules, one line per violation naming the option: lease > renew > retry * 1.2 > 0."""
    out = []
    if retry_period_s <= 0:
        out.append(f"--retry-period: must be > 0, got {retry_period_s:g}")
    if renew_deadline_s <= JITTER * retry_period_s:
        out.append(f"--renew-deadline: must be > 1.2 x --retry-period ({JITTER * retry_period_s:g}s), got {renew_deadline_s:g}")
    if lease_duration_s <= renew_deadline_s:
        out.append(f"--lease-duration: must be > --renew-deadline ({renew_deadline_s:g}s), got {lease_duration_s:g}")
    if lease_duration_s != int(lease_duration_s) or lease_duration_s < 1:
        out.append(f"--lease-duration: whole seconds >= 1 (leaseDurationSeconds is an integer), got {lease_duration_s:g}")
    return out


class LeaseElector:
    def __init__(
        self,
        rest: KubeRest,
        *,
        namespace: str,
        identity: str,
        clock: Clock,
        name: str = "migscale-controller",
        lease_duration_s: int = 15,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        elapsed: Callable[[], float] | None = None,
    ) -> None:
        problems = check_timings(lease_duration_s, renew_deadline_s, retry_period_s)
        if problems:
            raise ValueError("; ".join(problems))
        self.rest = rest
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self.name = name
        self.lease_duration_s = int(lease_duration_s)
        self.renew_deadline_s = float(renew_deadline_s)
        self.retry_period_s = float(retry_period_s)
        # local elapsed time for expiry and fencing: monotonic on a real clock, the clock itself in tests
        self.elapsed = elapsed or (time.monotonic if isinstance(clock, WallClock) else clock.now)
        self._lock = threading.Lock()
        self._observed_raw: str | None = None
        self._observed_spec: dict[str, Any] = {}
        self._observed_at: float | None = None
        self._observed_rv: str | None = None
        self._leading = False
        self._renewed_at: float | None = None  # elapsed() when the last successful acquire/renew was sent
        self.last = LeaseStatus(False, None, "not tried yet")
        self.became_leader = 0
        self.lost_leadership = 0
        self.renew_failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ what the tick and the writes ask

    def holds(self) -> bool:
        with self._lock:
            return (
                self._leading
                and self._renewed_at is not None
                and self.elapsed() - self._renewed_at < self.renew_deadline_s
            )

    def check_write(self, method: str, path: str) -> None:
        if not self.holds():
            raise Fenced(0, f"{method} {path}: refused, {self.identity} does not hold lease {self.name} ({self.last.reason})")

    # ------------------------------------------------------------ one attempt

    def _record(self, now: float, transitions: int, acquired: str | None) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": acquired or micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        }

    def _lease(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace, "labels": labels(component="controller")}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": LEASE[0], "kind": LEASE[1], "metadata": meta, "spec": spec}

    def _observe(self, spec: dict[str, Any], rv: str | None) -> None:
        raw = json.dumps(spec, sort_keys=True)
        with self._lock:
            if raw != self._observed_raw:
                self._observed_raw = raw
                self._observed_spec = dict(spec)
                self._observed_at = self.elapsed()
            self._observed_rv = rv

    def _valid_for_others(self) -> bool:
        """The observed record has not expired by our clock (client-go's isLeaseValid)."""
        with self._lock:
            if self._observed_at is None:
                return False
            duration = int(self._observed_spec.get("leaseDurationSeconds") or self.lease_duration_s)
            return self._observed_at + duration > self.elapsed()

    def try_acquire_or_renew(self) -> tuple[bool, str]:
        now = self.clock.now()
        live = self.rest.get(*LEASE, self.namespace, self.name)
        if live is None:
            spec = self._record(now, 0, None)
            try:
                created = self.rest.create(self._lease(spec, None))
            except KubeError as exc:
                if exc.status == 409:
                    return False, "lost the race to create the lease"
                raise
            self._observe(spec, (created.get("metadata") or {}).get("resourceVersion"))
            return True, "created the lease"
        spec = live.get("spec") or {}
        rv = (live.get("metadata") or {}).get("resourceVersion")
        self._observe(spec, rv)
        holder = spec.get("holderIdentity") or None
        mine = holder == self.identity
        if holder and not mine and self._valid_for_others():
            return False, f"held by {holder}"
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        new = self._record(now, transitions, spec.get("acquireTime") if mine else None)
        try:
            updated = self.rest.replace(self._lease(new, rv))
        except KubeError as exc:
            if exc.status == 409:
                return False, "lease changed under us (409)"
            raise
        self._observe(new, (updated.get("metadata") or {}).get("resourceVersion"))
        return True, "renewed" if mine else f"took over from {holder or 'nobody'}"

    def step(self) -> LeaseStatus:
        """One acquire-or-renew attempt and the leadership that follows from it.

        A renewal counts from when it was sent, not from its reply: the record
        carries the time it was written with, and a follower that saw it commit
        starts its wait then. Timed from a late reply, the fence would outlast
        the follower's wait by as long as the reply took."""
        sent = self.elapsed()
        try:
            ok, why = self.try_acquire_or_renew()
        except KubeError as exc:
            ok, why = False, f"lease request failed: {exc}"
        now = self.elapsed()
        with self._lock:
            was = self._leading
            if ok:
                self._leading, self._renewed_at = True, sent
            elif was:
                self.renew_failures += 1
                if self._renewed_at is None or now - self._renewed_at >= self.renew_deadline_s:
                    self._leading = False  # could not renew within the deadline: stop acting
                    why = f"lost the lease: no renewal for {self.renew_deadline_s:g}s ({why})"
            leading = self._leading
            holder = self._observed_spec.get("holderIdentity") or None
        if leading and not was:
            self.became_leader += 1
            log.info("%s: leading (%s)", self.identity, why)
        elif was and not leading:
            self.lost_leadership += 1
            log.warning("%s: %s", self.identity, why)
        self.last = LeaseStatus(leading, self.identity if leading else holder, why)
        return self.last

    # ------------------------------------------------------------ the renew thread

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        while not stop.is_set():
            st = self.step()
            wait = self.retry_period_s if st.leader else self.retry_period_s * (1 + random.random() * JITTER)
            stop.wait(wait)

    def start(self) -> LeaseElector:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self.run, name="lease-elector", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_period_s + 35)
            self._thread = None

    def release(self) -> bool:
        """Give the lease up (shutdown) so a follower need not wait for expiry; True if released."""
        with self._lock:
            leading = self._leading
            self._leading = False
        if not leading:
            return False
        live = self.rest.get(*LEASE, self.namespace, self.name)
        if live is None or (live.get("spec") or {}).get("holderIdentity") != self.identity:
            return False
        spec = dict(live.get("spec") or {})
        spec.pop("holderIdentity", None)
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = micro_time(self.clock.now())
        try:
            self.rest.replace(self._lease(spec, (live.get("metadata") or {}).get("resourceVersion")))
        except KubeError:
            return False  # it expires on its own
        self.last = LeaseStatus(False, None, "released")
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "leader": self.holds(),
            "holder": self.last.holder,
            "reason": self.last.reason,
            "became_leader": self.became_leader,
            "lost_leadership": self.lost_leadership,
            "renew_failures": self.renew_failures,
            "lease_duration_s": self.lease_duration_s,
            "renew_deadline_s": self.renew_deadline_s,
            "retry_period_s": self.retry_period_s,
        }
