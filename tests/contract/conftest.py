"""Harnesses for the actuator conformance suite: one per backend, the same four verbs.

Every test in ``test_actuator_contract.py`` runs against every backend in
``HARNESSES``; a backend that deviates from the contract in
``autoscaler/protocols.py`` fails the same test as the others. A harness
builds the backend on a given world (GPUs with their layouts, READY replicas)
and offers:

- ``act``: the Actuator (``apply``, ``in_flight``, ``take_errors``);
- ``snapshot()``: the backend's ClusterState;
- ``settle()``: let time pass until nothing is queued, starting or draining
  (or a bound passes);
- ``fail_starts(key)``: replicas of that model (or id) fail to start from now on;
- ``scheduler_places``: the backend is one whose scheduler places replicas
  (protocols.py, "Backends whose scheduler places replicas"); the suite then
  checks what the contract allows such a backend instead.

Adding a backend is one function here and one entry in ``HARNESSES``.

The Kubernetes backend runs on the emulated control plane
(``tests/kubernetes/emulated.py``: API server, Deployment/ReplicaSet and
disruption controllers, scheduler, kubelet, device plugin, mig-manager). Each
GPU of a test's world is a one-GPU node of the same name (GPU ``g0`` is
``g0/0`` there), and the suite's replica names are the Kubernetes harness's
own bookkeeping: the ReplicaSet names the pods, so a CREATE's id is bound to
the next new pod of its workload, and the suite's name of a replica is
translated to its pod's name on the way in and back in every answer. The
suite's world of READY replicas is built through the backend itself.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakeproc import FakeLauncher

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.clock import VirtualClock
from autoscaler.fakes import FakeInventory, RecordingActuator
from autoscaler.mig import Placement
from autoscaler.policy.types import (
    Action,
    ActionKind,
    ClusterState,
    GpuState,
    ModelSpec,
    Reason,
    Replica,
)
from autoscaler.sim.cluster import SimCluster, SimConfig

PRODUCT = "A100-SXM4-80GB"
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
MODELS = ("m", "n")
REPO = Path(__file__).resolve().parents[2] / "triton_models"


def spec(name: str) -> ModelSpec:
    return ModelSpec(name, {"1g.10gb": 50.0, "2g.20gb": 90.0, "3g.40gb": 120.0}, PROFILES, min_replicas=0)


@dataclass
class Harness:
    name: str
    act: Any
    snapshot: Callable[[], ClusterState]
    settle: Callable[[], None]
    fail_starts: Callable[[str], None]
    close: Callable[[], None] = lambda: None
    scheduler_places: bool = False
    errors_seen: list[str] = field(default_factory=list)

    def apply(self, actions: Sequence[Action]) -> list[str]:
        errs = self.act.apply(list(actions))
        self.errors_seen += errs
        return errs

    def late_errors(self) -> list[str]:
        errs = self.act.take_errors()
        self.errors_seen += errs
        return errs

    def replica(self, rid: str) -> Replica | None:
        return next((r for r in self.snapshot().replicas if r.id == rid), None)

    def layout(self, gpu: str) -> tuple[Placement, ...]:
        return tuple(sorted(self.snapshot().gpu(gpu).layout))


# ---------------------------------------------------------------- the backends


def _sim(gpus: Sequence[GpuState], replicas: Sequence[Replica], tmp: Path) -> Harness:
    clock = VirtualClock(0.0)
    cfg = SimConfig(start_delay_s=30.0, drain_s=5.0, repartition_delay_s=20.0, wait_ready_timeout_s=120.0)
    c = SimCluster([spec(m) for m in MODELS], {m: 100.0 for m in MODELS},
                   ClusterState(tuple(gpus), tuple(replicas)), clock, cfg)
    zero = np.zeros(len(MODELS))

    def settle() -> None:
        for _ in range(200):  # 1000 simulated seconds at most
            if not c.converging():
                return
            c.advance(zero)

    return Harness("sim", c, c.snapshot, settle, c.fail_starts.add)


def _fake(gpus: Sequence[GpuState], replicas: Sequence[Replica], tmp: Path) -> Harness:
    inv = FakeInventory(ClusterState(tuple(gpus), tuple(replicas)))
    act = RecordingActuator(inv, instant=False)

    def settle() -> None:
        for _ in range(10):
            if not act.converging():
                return
            act.settle()

    return Harness("fake", act, lambda: inv.cluster, settle, act.fail_starts.add)


def _local(gpus: Sequence[GpuState], replicas: Sequence[Replica], tmp: Path) -> Harness:
    launcher = FakeLauncher(ready_after_s=0.05)
    models = {m: ModelRuntime(m, REPO, "resnet") for m in MODELS}
    c = LocalCluster(tmp / "run", models, list(gpus), launcher=launcher, prometheus="off",
                     wait_ready_timeout_s=2.0, drain_timeout_s=0.1, term_timeout_s=0.1, auto_replace=False)
    c.supervisor.start()  # readiness and queued chains; no nginx or Prometheus needed here

    def settle() -> None:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not c.settled():
            time.sleep(0.02)

    first = [Action(ActionKind.CREATE, Reason.MIN_REPLICAS, gpu=r.gpu, model=r.model, profile=r.profile,
                    start=r.start, replica=r.id) for r in replicas]
    assert c.apply_and_wait(first, 10.0) == []
    return Harness("local", c, c.snapshot, settle, launcher.failing.add, close=c.stop)


def _kubernetes(gpus: Sequence[GpuState], replicas: Sequence[Replica], tmp: Path) -> Harness:
    from kube_harness import KubeWorld

    w = KubeWorld([spec(m) for m in MODELS], gpus)
    try:
        w.seed(replicas)
    except BaseException:
        w.close()
        raise
    return Harness("kubernetes", w, w.snapshot, w.settle, w.fail_starts.add, close=w.close, scheduler_places=True)


HARNESSES: dict[str, Callable[[Sequence[GpuState], Sequence[Replica], Path], Harness]] = {
    "sim": _sim,
    "fake": _fake,
    "local": _local,
    "kubernetes": _kubernetes,
}


@pytest.fixture(params=sorted(HARNESSES))
def make(request, tmp_path) -> Iterator[Callable[..., Harness]]:
    """``make(gpus, replicas)``: the parametrized backend on that world."""
    made: list[Harness] = []

    def build(gpus: Sequence[GpuState], replicas: Sequence[Replica] = ()) -> Harness:
        h = HARNESSES[request.param](gpus, replicas, tmp_path)
        made.append(h)
        return h

    try:
        yield build
    finally:
        for h in made:
            h.close()
