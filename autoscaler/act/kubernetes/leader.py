"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two controllers never act at once.

Runs at the top of every Kubernetes "act" step: the backend asks
``LeaseElector.ensure()`` before it writes anything, and a replica that is not
the leader writes nothing. The protocol is client-go's leaderelection:

- no Lease -> create it with ourselves as holder (a 409 means another replica
  won the race);
- we hold it -> renew ``renewTime``;
- another replica holds it and ``renewTime + leaseDurationSeconds`` is in the
  future -> follow;
- it has expired -> take it over (``leaseTransitions`` + 1).

Every write carries the resourceVersion we read, so of two replicas that both
see an expired lease only one replace succeeds; the other gets 409 and follows.
Time comes from an injected Clock; with a 15 s lease and a 5 s tick a dead
leader is replaced within 15-20 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from autoscaler.act.kubernetes.client import KubeError, KubeRest
from autoscaler.act.kubernetes.render import labels
from autoscaler.clock import Clock


def micro_time(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return None


@dataclass
class LeaseStatus:
    leader: bool
    holder: str | None
    reason: str


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
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self.name = name
        self.lease_duration_s = lease_duration_s
        self.last = LeaseStatus(False, None, "not tried yet")

    def _lease(self, now: float, transitions: int, acquire_time: str | None) -> dict:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": labels(component="controller"),
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_duration_s,
                "acquireTime": acquire_time or micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    def ensure(self) -> LeaseStatus:
        """Acquire or renew; returns whether this replica may act now."""
        now = self.clock.now()
        try:
            live = self.rest.get("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
            if live is None:
                try:
                    self.rest.create(self._lease(now, 0, None))
                except KubeError as exc:
                    if exc.status == 409:
                        self.last = LeaseStatus(False, None, "lost the race to create the lease")
                        return self.last
                    raise
                self.last = LeaseStatus(True, self.identity, "created the lease")
                return self.last
            spec = live.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = parse_time(spec.get("renewTime"))
            duration = spec.get("leaseDurationSeconds") or self.lease_duration_s
            expired = renewed is None or now > renewed + duration
            if holder and holder != self.identity and not expired:
                self.last = LeaseStatus(False, holder, f"held by {holder} until {renewed + duration:.1f}")
                return self.last
            mine = holder == self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            new = self._lease(now, transitions, spec.get("acquireTime") if mine else None)
            new["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            try:
                self.rest.replace(new)
            except KubeError as exc:
                if exc.status == 409:  # someone else renewed or took over since our read
                    self.last = LeaseStatus(False, None, "lease changed under us (409); following")
                    return self.last
                raise
            self.last = LeaseStatus(
                True, self.identity, "renewed" if mine else f"took over from {holder or 'nobody'}"
            )
            return self.last
        except KubeError as exc:
            # Cannot reach the API server: we may no longer hold the lease, so do not act.
            self.last = LeaseStatus(False, None, f"lease check failed: {exc}")
            return self.last

    def release(self) -> None:
        """Give the lease up (shutdown), so a follower need not wait for expiry."""
        live = self.rest.get("coordination.k8s.io/v1", "Lease", self.namespace, self.name)
        if live is None or (live.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        live["spec"].pop("holderIdentity", None)
        live["spec"].pop("renewTime", None)
        try:
            self.rest.replace(live)
        except KubeError:
            pass  # it expires on its own
