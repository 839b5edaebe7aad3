"""An emulated cluster: the API server, its controllers and the GPU Operator, running together.

What the end-to-end test, the controller tests and ``benchmarks/k8s_scale.py``
run migscale against. ``EmulatedCluster`` serves ``FakeKube`` on a loopback
port (graceful pod deletion on) and runs, on one thread, the Deployment and
ReplicaSet controllers, the disruption controller, the scheduler/kubelet/
device plugin, mig-manager and, when given migscale's metrics URL, the HPA
controller. Delays are parameters, scaled down for tests (upstream orders of
magnitude: pods Ready in tens of seconds, mig-manager minutes, HPA sync 15 s).
"""

from __future__ import annotations

from typing import Any

from controllers import (
    ControlPlane,
    DeploymentController,
    DisruptionController,
    Kubelet,
    ReplicaSetController,
)
from crdschema import own_admission, validate_crd_object
from fakeapi import FakeKube
from gpu_operator import MigManager, gpu_node
from hpa_emulation import HpaController
from k8s_helpers import wait_until

Obj = dict[str, Any]


class EmulatedCluster:
    def __init__(
        self,
        *,
        ready_delay_s: float = 0.5,
        stop_s: float = 0.3,
        mig_delay_s: float = 1.0,
        interval_s: float = 0.05,
        bookmark_s: float = 1.0,
        validate: bool = True,
    ) -> None:
        self.fake = FakeKube(crd_validator=validate_crd_object if validate else None, bookmark_s=bookmark_s,
                             graceful_pods=True, crds=own_admission() if validate else None)
        self.kubelet = Kubelet(self.fake, ready_delay_s=ready_delay_s, stop_s=stop_s)
        self.mig = MigManager(self.fake, delay_s=mig_delay_s)
        self.hpa: HpaController | None = None
        self.plane = ControlPlane([DeploymentController(self.fake), ReplicaSetController(self.fake),
                                   self.kubelet, DisruptionController(self.fake), self.mig], interval_s=interval_s)
        self.url = ""

    def start(self, nodelay: bool = False) -> EmulatedCluster:
        self.url = self.fake.serve(nodelay=nodelay)
        self.plane.start()
        return self

    def add_hpa_controller(self, metrics_url: str, sync_s: float = 1.0) -> HpaController:
        self.hpa = HpaController(self.fake, metrics_url, sync_s=sync_s)
        self.plane.controllers.append(self.hpa)
        return self.hpa

    def add_nodes(self, n: int, counts: dict[str, int], *, prefix: str = "node", gpus: int = 1) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(n)]
        for name in names:
            self.fake.put_object(gpu_node(name, counts, gpus=gpus), manager="kubelet")
        return names

    def namespace(self, name: str) -> None:
        self.fake.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def wait(self, cond: Any, timeout_s: float = 20.0, what: str = "condition") -> Any:
        return wait_until(cond, timeout_s, f"{what} (controller errors: {self.plane.errors[-5:]})")

    def stop(self) -> None:
        self.plane.stop()
        if self.hpa is not None:
            self.hpa.close()
        self.fake.close()
