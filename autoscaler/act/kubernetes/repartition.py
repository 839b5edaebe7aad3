"""Repartition a GPU through the GPU Operator's mig-manager (the backend's slowest action).

Called by ``act/kubernetes/backend.py`` for a REPARTITION action. mig-manager
reconfigures every GPU of a node at once and restarts the node's GPU pods, so
the node is emptied of migscale's GPU pods first:

1. write the node's new config (all its GPUs) into the mig-parted ConfigMap,
   under a content-addressed name (``migscale-<sha>``);
2. cordon the node (remembering whether it was cordoned already);
3. evict migscale's GPU pods there and wait until they are gone (their
   Deployments recreate them elsewhere; the PDB keeps one at a time);
4. set ``nvidia.com/mig.config=<name>``;
5. wait for ``nvidia.com/mig.config.state=success`` -- after having seen it
   leave ``success`` (so a stale success from the previous config does not
   count) or once the GFD count labels match the target;
6. uncordon.

On a timeout or ``failed`` the label is set back to its previous value (or
removed), the node is uncordoned, and the error is returned for the report.
GPU pods that migscale does not own make it refuse before touching anything:
mig-manager would kill them. Secondary sources put a mig-manager repartition at
3-5 minutes (docs/gpu-operator.md), hence the 600 s default timeout. Waits use the
injected Clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import yaml

from autoscaler.act.kubernetes.client import KubeError, KubeRest, owned
from autoscaler.act.kubernetes.inventory import mig_counts
from autoscaler.act.kubernetes.migparted import mig_config_entry, mig_config_name, mig_parted_configmap
from autoscaler.act.kubernetes.render import (
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    RenderConfig,
)
from autoscaler.clock import Clock
from autoscaler.mig.layout import Placement

Obj = dict[str, Any]
CORDONED_BY = "migscale.io/cordoned"


def _uses_gpu(pod: Obj) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}:
            if k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-"):
                return True
    return False


class Repartitioner:
    def __init__(
        self,
        rest: KubeRest,
        cfg: RenderConfig,
        clock: Clock,
        *,
        drain_timeout_s: float = 300.0,
        config_timeout_s: float = 600.0,
        poll_s: float = 5.0,
    ) -> None:
        self.rest = rest
        self.cfg = cfg
        self.clock = clock
        self.drain_timeout_s = drain_timeout_s
        self.config_timeout_s = config_timeout_s
        self.poll_s = poll_s
        self.log: list[str] = []  # steps taken, for `migscale status` / tests

    # ------------------------------------------------------------ steps

    def write_config(self, entry: list[Obj]) -> str:
        name = mig_config_name(entry)
        for _ in range(5):
            cm = self.rest.get(
                "v1", "ConfigMap", self.cfg.mig_parted_namespace, self.cfg.mig_parted_configmap
            )
            if cm is not None and not owned(cm):
                raise KubeError(409, f"ConfigMap {self.cfg.mig_parted_configmap} is not managed by migscale")
            configs = {}
            if cm is not None:
                configs = (yaml.safe_load((cm.get("data") or {}).get("config.yaml") or "") or {}).get(
                    "mig-configs"
                ) or {}
            if configs.get(name) == entry:
                return name
            configs[name] = entry
            new = mig_parted_configmap(configs, self.cfg)
            try:
                if cm is None:
                    self.rest.create(new)
                else:
                    new["metadata"]["resourceVersion"] = cm["metadata"]["resourceVersion"]
                    self.rest.replace(new)
                return name
            except KubeError as exc:
                if exc.status != 409:
                    raise
        raise KubeError(409, "mig-parted ConfigMap: still conflicting after 5 tries")

    def _patch_node(self, node: str, patch: Obj) -> Obj:
        """Merge-patch a node with its resourceVersion, retrying lost races."""
        for _ in range(5):
            live = self.rest.get("v1", "Node", None, node)
            if live is None:
                raise KubeError(404, f"node {node} not found")
            body = {
                **patch,
                "metadata": {
                    **(patch.get("metadata") or {}),
                    "resourceVersion": live["metadata"]["resourceVersion"],
                },
            }
            try:
                return self.rest.merge_patch("v1", "Node", None, node, body)
            except KubeError as exc:
                if exc.status != 409:
                    raise
        raise KubeError(409, f"node {node}: still conflicting after 5 tries")

    def cordon(self, node: str) -> bool:
        """Cordon; True when we did it (and so must undo it)."""
        live = self.rest.get("v1", "Node", None, node)
        if live is None:
            raise KubeError(404, f"node {node} not found")
        if (live.get("spec") or {}).get("unschedulable"):
            return False
        self._patch_node(
            node, {"spec": {"unschedulable": True}, "metadata": {"annotations": {CORDONED_BY: "true"}}}
        )
        self.log.append(f"cordon {node}")
        return True

    def uncordon(self, node: str) -> None:
        self._patch_node(
            node, {"spec": {"unschedulable": None}, "metadata": {"annotations": {CORDONED_BY: None}}}
        )
        self.log.append(f"uncordon {node}")

    def gpu_pods(self, node: str) -> list[Obj]:
        pods = self.rest.list("v1", "Pod", None, field_selector=f"spec.nodeName={node}")
        return [p for p in pods if _uses_gpu(p)]

    def drain(self, node: str) -> str | None:
        deadline = self.clock.now() + self.drain_timeout_s
        evicted: set[str] = set()
        while True:
            pods = self.gpu_pods(node)
            if not pods:
                return None
            for p in pods:
                name, ns = p["metadata"]["name"], p["metadata"]["namespace"]
                if name in evicted:
                    continue
                try:
                    self.rest.evict(ns, name)
                    evicted.add(name)
                    self.log.append(f"evict {ns}/{name}")
                except KubeError as exc:
                    if exc.status == 404:
                        evicted.add(name)
                    elif exc.status != 429:  # 429: the PDB says not now; try again next poll
                        raise
            if self.clock.now() >= deadline:
                left = ", ".join(p["metadata"]["name"] for p in pods)
                return f"drain of {node} timed out after {self.drain_timeout_s:.0f}s; still running: {left}"
            self.clock.sleep(self.poll_s)

    def wait_configured(self, node: str, name: str, target: Counter[str]) -> str | None:
        deadline = self.clock.now() + self.config_timeout_s
        left_success = False
        while True:
            live = self.rest.get("v1", "Node", None, node) or {"metadata": {}}
            lbls = live["metadata"].get("labels") or {}
            state = lbls.get(MIG_STATE_LABEL)
            if lbls.get(MIG_CONFIG_LABEL) != name:
                return (
                    f"{MIG_CONFIG_LABEL} on {node} changed to {lbls.get(MIG_CONFIG_LABEL)!r} by someone else"
                )
            if state == "failed":
                return f"mig-manager reported {MIG_STATE_LABEL}=failed on {node} for {name}"
            if state == "success" and (left_success or mig_counts(live) == target):
                return None
            left_success |= state != "success"
            if self.clock.now() >= deadline:
                return f"{node}: {MIG_STATE_LABEL} still {state!r} after {self.config_timeout_s:.0f}s"
            self.clock.sleep(self.poll_s)

    # ------------------------------------------------------------ flow

    def repartition(self, node: str, gpu_layouts: Sequence[Sequence[Placement] | None]) -> list[str]:
        """Give ``node`` the per-GPU layouts (None = MIG off); returns errors (empty on success)."""
        foreign = [p["metadata"]["name"] for p in self.gpu_pods(node) if not owned(p)]
        if foreign:
            return [
                f"repartition {node}: refused, GPU pods not managed by migscale run there: {', '.join(sorted(foreign))}"
            ]
        entry = mig_config_entry(gpu_layouts)
        target: Counter[str] = Counter()
        for lay in gpu_layouts:
            target.update(p.profile for p in lay or ())
        name = self.write_config(entry)
        self.log.append(f"config {name}")
        node_obj = self.rest.get("v1", "Node", None, node) or {"metadata": {}}
        previous = (node_obj["metadata"].get("labels") or {}).get(MIG_CONFIG_LABEL)
        we_cordoned = self.cordon(node)
        errors: list[str] = []
        try:
            err = self.drain(node)
            if err:
                return [f"repartition {node}: {err}"]
            self._patch_node(node, {"metadata": {"labels": {MIG_CONFIG_LABEL: name}}})
            self.log.append(f"label {node} {MIG_CONFIG_LABEL}={name}")
            err = self.wait_configured(node, name, target)
            if err:
                self._patch_node(node, {"metadata": {"labels": {MIG_CONFIG_LABEL: previous}}})
                self.log.append(f"rollback {node} {MIG_CONFIG_LABEL}={previous}")
                errors.append(f"repartition {node}: {err}; {MIG_CONFIG_LABEL} rolled back to {previous!r}")
            return errors
        finally:
            if we_cordoned:
                self.uncordon(node)
