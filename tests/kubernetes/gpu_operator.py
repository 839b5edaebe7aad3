"""Emulated GPU Operator on the emulated API server: mig-manager, GPU feature discovery, the device plugin.

From NVIDIA's documented behaviour (docs/kubernetes.md): a node's MIG layout
changes when ``nvidia.com/mig.config`` names a config of the mig-parted
ConfigMap. ``MigManager.step``:

- a label naming the config already applied: ``nvidia.com/mig.config.state``
  stays/becomes ``success`` at once;
- a new config: ``state=pending``, and the GPU clients are stopped -- the
  device plugin's allocatable ``nvidia.com/mig-*`` drops to 0, so nothing new
  is scheduled there;
- ``delay_s`` later: if a running pod on the node still holds a MIG device,
  reconfiguration fails (``state=failed``; the old layout and allocatable
  come back), as mig-parted refuses to destroy instances in use; an unknown
  config name fails too. Otherwise GFD rewrites ``nvidia.com/mig-<p>.count``,
  the device plugin advertises the new ``nvidia.com/mig-<p>`` counts, and
  ``state=success``.

``gpu_node`` builds a node as GFD and the device plugin describe it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml
from controllers import requests_of
from fakeapi import ApiError, FakeKube

Obj = dict[str, Any]
CONFIG, STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
MIG = "nvidia.com/mig-"


def dp(profile: str) -> str:
    """A profile as NVIDIA's device plugin and GFD write it in a resource or label key: no ``+``."""
    return profile.replace("+", ".")


def gpu_node(name: str, counts: dict[str, int], *, gpus: int = 1, config: str = "initial",
             product: str = "NVIDIA-A100-SXM4-80GB") -> Obj:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus), "nvidia.com/mig.strategy": "mixed",
              CONFIG: config, STATE: "success", "kubernetes.io/hostname": name}
    labels.update({f"{MIG}{dp(p)}.count": str(n) for p, n in counts.items() if n})
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "0"}
    alloc.update({f"{MIG}{dp(p)}": str(n) for p, n in counts.items() if n})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def entry_counts(entry: list[Obj]) -> Counter[str]:
    out: Counter[str] = Counter()
    for dev in entry:
        if dev.get("mig-enabled"):
            for prof, n in (dev.get("mig-devices") or {}).items():
                out[prof] += int(n) * len(dev.get("devices") or [])
    return out


class MigManager:
    manager = "nvidia-mig-manager"

    def __init__(self, fake: FakeKube, *, delay_s: float = 2.0, namespace: str = "gpu-operator",
                 configmap: str = "migscale-mig-parted-config") -> None:
        self.fake = fake
        self.delay_s = delay_s
        self.namespace = namespace
        self.configmap = configmap
        self.applied: dict[str, str] = {}  # node -> config name in effect
        self.working: dict[str, tuple[str, float, dict[str, str]]] = {}  # node -> (config, since, saved allocatable)
        self.reconfigurations = 0
        self.failures = 0

    def _entry(self, name: str) -> list[Obj] | None:
        cm = self.fake.get("ConfigMap", self.configmap, self.namespace)
        doc = yaml.safe_load(((cm or {}).get("data") or {}).get("config.yaml") or "") or {}
        return (doc.get("mig-configs") or {}).get(name)

    def _write(self, node: Obj, labels: dict[str, str], alloc: dict[str, str] | None) -> None:
        """``labels`` as a change to what this step read from ``node``, applied to the node as it is
        now: mig-manager labels a node one key at a time, so a label someone else wrote since the
        step read it (a new ``nvidia.com/mig.config``) is never put back."""
        old = node["metadata"].get("labels") or {}
        with self.fake.lock:
            new = self.fake.get("Node", node["metadata"]["name"], None)
            if new is None:
                return
            cur = dict(new["metadata"].get("labels") or {})
            for k in old.keys() - labels.keys():
                cur.pop(k, None)
            cur.update({k: v for k, v in labels.items() if old.get(k) != v})
            new["metadata"]["labels"] = cur
            try:
                new = self.fake.update_obj(new, self.manager, check_rv=False, validate=False)
                if alloc is not None:
                    new["status"] = {**(new.get("status") or {}), "allocatable": alloc, "capacity": dict(alloc)}
                    self.fake.update_obj(new, self.manager, sub="status", check_rv=False, validate=False)
            except ApiError:
                pass

    def step(self, now: float) -> None:
        pods = self.fake.view("Pod")
        for node in self.fake.view("Node"):
            name = node["metadata"]["name"]
            lbls = dict(node["metadata"].get("labels") or {})
            want = lbls.get(CONFIG)
            if name not in self.applied and lbls.get(STATE) == "success":
                self.applied[name] = want or ""
            alloc = dict((node.get("status") or {}).get("allocatable") or {})
            if name in self.working:
                self._finish(node, lbls, alloc, pods, now)
                continue
            if not want or want == self.applied.get(name):
                if want and lbls.get(STATE) != "success":
                    self._write(node, {**lbls, STATE: "success"}, None)
                continue
            paused = {k: ("0" if k.startswith(MIG) else v) for k, v in alloc.items()}
            self.working[name] = (want, now, alloc)
            self._write(node, {**lbls, STATE: "pending"}, paused)

    def _finish(self, node: Obj, lbls: dict[str, str], alloc: dict[str, str], pods: list[Obj], now: float) -> None:
        name = node["metadata"]["name"]
        want, since, saved = self.working[name]
        if lbls.get(CONFIG) != want:  # changed again meanwhile: start over from the saved state
            del self.working[name]
            self._write(node, lbls, saved)
            return
        if now - since < self.delay_s:
            return
        del self.working[name]
        entry = self._entry(want)
        busy = [p["metadata"]["name"] for p in pods if (p.get("spec") or {}).get("nodeName") == name
                and (p.get("status") or {}).get("phase") == "Running" and any(k.startswith(MIG) for k in requests_of(p))]
        if entry is None or busy:
            self.failures += 1
            self._write(node, {**lbls, STATE: "failed"}, saved)
            return
        counts = entry_counts(entry)
        labels = {k: v for k, v in lbls.items() if not (k.startswith(MIG) and k.endswith(".count"))}
        labels.update({f"{MIG}{dp(p)}.count": str(n) for p, n in counts.items()})
        labels[STATE] = "success"
        new_alloc = {k: v for k, v in saved.items() if not k.startswith(MIG)}
        new_alloc.update({f"{MIG}{dp(p)}": str(n) for p, n in counts.items()})
        new_alloc["nvidia.com/gpu"] = "0" if counts else labels.get("nvidia.com/gpu.count", "1")
        self.applied[name] = want
        self.reconfigurations += 1
        self._write(node, labels, new_alloc)
