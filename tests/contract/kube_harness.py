"""The Kubernetes backend as a conformance-suite backend, on the emulated control plane.

``KubeWorld`` starts an ``EmulatedCluster`` (``tests/kubernetes/emulated.py``),
gives every GPU of the suite's world a one-GPU node of the same name (GFD
labels and the device plugin's allocatable counts of its layout), and runs a
``KubernetesBackend`` against it. It is the suite's actuator: it translates
the suite's identities into the ones Kubernetes has and back.

- GPUs: the suite's ``g0`` is the backend's ``g0/0`` (node ``g0``, GPU 0).
- Replicas: the ReplicaSet names the pods. A CREATE's id is bound to the next
  new pod of that workload (in creation order); from then on the suite's id
  is that pod's name on the way in (DRAIN, DELETE, a re-applied CREATE) and
  the pod's name is the suite's id in every answer (snapshot, error lines).
  A pod bound to no id (one a controller made by itself) keeps its name.
- ``fail_starts``: pods bound to that id (or of that model) crash at start --
  the emulated kubelet reports ``CrashLoopBackOff`` and never Ready, as a
  container that exits at once does.
- ``settle``: what the controller's ticks do (``snapshot`` then ``advance``)
  until no chain is queued, no node is being repartitioned and no pod is
  starting or terminating, bounded.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kubernetes"))

from emulated import EmulatedCluster
from gpu_operator import gpu_node
from k8s_helpers import caught_up

from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.act.kubernetes.client import KubeRest
from autoscaler.act.kubernetes.render import MODEL_LABEL, PROFILE_LABEL, RenderConfig
from autoscaler.policy.types import (
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    Replica,
    ReplicaState,
)

Obj = dict[str, Any]
NS = "default"
POD_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*-[0-9a-f]{5}\b")


class KubeWorld:
    def __init__(self, models: Sequence[ModelSpec], gpus: Sequence[GpuState]) -> None:
        self.cluster = EmulatedCluster(ready_delay_s=0.2, stop_s=0.1, mig_delay_s=0.3, interval_s=0.02,
                                       bookmark_s=0.1).start()
        self.fake = self.cluster.fake
        self.fail_starts: set[str] = set()
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}  # pod name -> suite id
        self._pending: dict[tuple[str, str], list[str]] = {}  # workload -> suite ids of CREATEs, in order
        self.cluster.kubelet.crashing = self._crashing
        for g in gpus:
            counts: dict[str, int] = {}
            for p in g.layout:
                counts[p.profile] = counts.get(p.profile, 0) + 1
            self.fake.put_object(gpu_node(g.id, counts), manager="kubelet")
        self.rest = KubeRest.connect(self.cluster.url, user_agent="migscale/contract")
        try:
            self.be = KubernetesBackend(self.rest, list(models), RenderConfig(namespace=NS), identity="contract",
                                        watch_timeout_s=5, ready_timeout_s=10.0)
        except BaseException:
            self.rest.close()
            self.cluster.stop()
            raise

    # ------------------------------------------------------------ identities

    def _bind(self, pod: Obj) -> str:
        """The suite's id of a pod (binding a new pod to the oldest CREATE waiting for one)."""
        name = pod["metadata"]["name"]
        with self._lock:
            if name not in self._ids:
                lbls = pod["metadata"].get("labels") or {}
                queue = self._pending.get((lbls.get(MODEL_LABEL, ""), lbls.get(PROFILE_LABEL, "")))
                self._ids[name] = queue.pop(0) if queue else name
            return self._ids[name]

    def _bind_all(self) -> None:
        pods = self.fake.view("Pod")
        for p in sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"])):
            self._bind(p)

    def _crashing(self, pod: Obj) -> bool:
        return self._bind(pod) in self.fail_starts or (pod["metadata"].get("labels") or {}).get(MODEL_LABEL) in self.fail_starts

    def _pod_of(self, rid: str | None) -> str | None:
        with self._lock:
            return next((pod for pod, sid in self._ids.items() if sid == rid), rid)

    def _out(self, line: str) -> str:
        """An error line in the suite's names: pods by their bound ids, ``g0/0`` as ``g0``."""
        with self._lock:
            line = POD_NAME.sub(lambda m: self._ids.get(m.group(0), m.group(0)), line)
        return re.sub(r"\b([A-Za-z0-9-]+)/0\b", r"\1", line)

    @staticmethod
    def _gpu_in(gpu: str | None) -> str | None:
        return f"{gpu}/0" if gpu and "/" not in gpu else gpu

    # ------------------------------------------------------------ the actuator

    def apply(self, actions: Sequence[Action]) -> list[str]:
        self._bind_all()
        out: list[Action] = []
        queued: list[tuple[tuple[str, str], str]] = []
        for a in actions:
            rid = a.replica
            if a.kind is ActionKind.CREATE and rid is not None:
                pod = self._pod_of(rid)
                if pod == rid:  # not yet bound: its pod is the next new one of the workload
                    queued.append(((a.model or "", a.profile or ""), rid))
                rid = pod
            elif rid is not None:
                rid = self._pod_of(rid)
            out.append(replace(a, gpu=self._gpu_in(a.gpu), replica=rid))
        with self._lock:
            for key, rid in queued:
                self._pending.setdefault(key, []).append(rid)
        self.be.snapshot()  # the controller plans from a fresh snapshot every tick
        errs = [self._out(e) for e in self.be.apply(out)]
        with self._lock:  # a CREATE that failed or was skipped makes no pod
            for key, rid in queued:
                if any(re.match(rf"create \S+ \S+ {re.escape(rid)}\b", e) for e in errs):
                    self._pending[key].remove(rid)
        return errs

    def groups(self, actions: Sequence[Action]) -> list[int]:
        self._bind_all()
        return self.be.groups([replace(a, gpu=self._gpu_in(a.gpu), replica=self._pod_of(a.replica)) for a in actions])

    def in_flight(self) -> tuple[frozenset[str], frozenset[str]]:
        self._bind_all()
        gpus, models = self.be.in_flight()
        return frozenset(g.rpartition("/")[0] for g in gpus), models

    def take_errors(self) -> list[str]:
        return [self._out(e) for e in self.be.take_errors()]

    def snapshot(self) -> ClusterState:
        caught_up(self.be, self.fake)
        self._bind_all()
        st = self.be.snapshot()
        with self._lock:
            reps = tuple(replace(r, id=self._ids.get(r.id, r.id), gpu=r.gpu.rpartition("/")[0] or r.gpu)
                         for r in st.replicas)
        gpus = tuple(replace(g, id=g.node) for g in st.gpus)
        return ClusterState(gpus, tuple(sorted(reps, key=lambda r: r.id)))

    # ------------------------------------------------------------ the harness

    def settle(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:  # quiet twice in a row: no write in flight
            caught_up(self.be, self.fake)
            self.be.snapshot()
            self.be.advance()
            time.sleep(0.05)
            caught_up(self.be, self.fake)
            st = self.be.snapshot()
            self._bind_all()
            busy = [r for r in st.replicas if r.state in (ReplicaState.STARTING, ReplicaState.DRAINING)]
            idle = (not self.be.rollout.chains and not self.be.repartitioner.in_progress() and not busy
                    and self._controllers_caught_up())
            quiet = quiet + 1 if idle else 0

    def _controllers_caught_up(self) -> bool:
        """Every Deployment has as many live pods as its spec.replicas (the ReplicaSet acted on the last scale)."""
        live: dict[tuple[str, str], int] = {}
        for p in self.fake.view("Pod"):
            if not p["metadata"].get("deletionTimestamp"):
                lbls = p["metadata"].get("labels") or {}
                key = (lbls.get(MODEL_LABEL, ""), lbls.get(PROFILE_LABEL, ""))
                live[key] = live.get(key, 0) + 1
        for d in self.fake.view("Deployment", "apps"):
            lbls = (((d.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
            key = (lbls.get(MODEL_LABEL, ""), lbls.get(PROFILE_LABEL, ""))
            if live.get(key, 0) != int((d.get("spec") or {}).get("replicas") or 0):
                return False
        return True

    def seed(self, replicas: Sequence[Replica]) -> None:
        """The world's READY replicas, made by the backend itself (pods are the ReplicaSet's)."""
        if not replicas:
            return
        caught_up(self.be, self.fake)
        acts = [Action(ActionKind.CREATE, Reason.MIN_REPLICAS, gpu=r.gpu, model=r.model, profile=r.profile,
                       start=r.start, replica=r.id) for r in replicas]
        assert self.apply(acts) == []
        want = {r.id for r in replicas}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self.settle(2.0)
            ready = {r.id for r in self.snapshot().replicas if r.state is ReplicaState.READY}
            if want <= ready:
                self.take_errors()
                return
        raise AssertionError(f"seeded replicas not READY: {sorted(want - ready)}")

    def close(self) -> None:
        try:
            self.be.close()
            self.rest.close()
        finally:
            self.cluster.stop()
