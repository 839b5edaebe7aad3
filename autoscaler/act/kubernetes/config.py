"""Kubernetes backend settings from cluster.yaml, and the backend built from them.

The glue between the typed config (``autoscaler.config.schema``) and the Kubernetes
"act" edge: ``render_config`` maps cluster.yaml (namespace, RDMA pool and
NCCL, GPU products) onto ``render.RenderConfig``;
``mig_configs`` turns declared layouts into mig-parted entries;
``build_backend`` wires client, elector (and its write fence) and backend for a controller.
Used by ``migscale render`` and by whatever runs the loop on a cluster.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoscaler.act.kubernetes.backend import KubernetesBackend
from autoscaler.act.kubernetes.client import Fenced, KubeRest
from autoscaler.act.kubernetes.leader import LeaseElector
from autoscaler.act.kubernetes.migparted import mig_config_entry, mig_config_name
from autoscaler.act.kubernetes.render import Nccl, RenderConfig
from autoscaler.clock import Clock, WallClock
from autoscaler.config import ClusterConfig, initial_cluster_state
from autoscaler.policy.types import ModelSpec


def render_config(cluster: ClusterConfig, **overrides: Any) -> RenderConfig:
    """RenderConfig from cluster.yaml: namespace, RDMA/NCCL, products."""
    kw: dict[str, Any] = {"namespace": cluster.namespace}
    products = list(cluster.products())
    if cluster.rdma_pool is not None:
        pool = cluster.rdma_pool
        kw["rdma_resource"] = pool.rdma_resource
        kw["fabric_label"] = pool.fabric_label
        n = pool.nccl
        kw["nccl"] = Nccl(n.ib_hca, n.net_gdr_level, n.socket_ifname, n.ib_gid_index)
        kw["rdma_products"] = tuple(dict.fromkeys(node.product for node in pool.nodes))
    if products:
        kw["products"] = tuple(dict.fromkeys(products))
    kw.update(overrides)
    return RenderConfig(**kw)


def mig_configs(cluster: ClusterConfig) -> dict[str, list[dict]]:
    """One mig-parted entry per node with declared layouts (docs/gpu-operator.md format)."""
    state = initial_cluster_state(cluster)
    by_node: dict[str, list] = {}
    for g in sorted(state.gpus, key=lambda g: (g.node, int(g.id.rpartition("/")[2]))):
        if g.rdma and not g.mig_enabled:
            continue  # whole GPUs of the RDMA pool: the GPU Operator's all-disabled
        by_node.setdefault(g.node, []).append(g.layout if g.mig_enabled else None)
    out: dict[str, list[dict]] = {}
    for layouts in by_node.values():
        entry = mig_config_entry(layouts)
        out[mig_config_name(entry)] = entry
    return out


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults (kube-controller-manager's too): 15 s lease, 10 s renew deadline, 2 s retry."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def build_backend(
    models: Sequence[ModelSpec],
    cluster: ClusterConfig,
    *,
    host: str | None = None,
    identity: str | None = None,
    lease_namespace: str | None = None,
    clock: Clock | None = None,
    leader_elect: bool = True,
    dry_run: bool = False,
    lease: LeaseTimings = LeaseTimings(),
    backend_options: dict[str, Any] | None = None,
    **overrides: Any,
) -> KubernetesBackend:
    """A leader-elected backend; ``host`` None = in-cluster config, else kubeconfig.

    The identity defaults to the pod name (``POD_NAME``, set by k8s/base) and
    the Lease lives in ``POD_NAMESPACE`` (the controller's own namespace).
    Every write goes through the elector's fence (``KubeRest.guard``); a dry
    run refuses every write, the Lease's included.
    """
    clock = clock or WallClock()
    identity = identity or os.environ.get("POD_NAME") or socket.gethostname()
    cfg = render_config(cluster, **overrides)
    rest = KubeRest.connect(host, user_agent=f"migscale/{identity}")
    elector = None
    if dry_run:
        rest.guard = _refuse_dry_run
    elif leader_elect:
        elector = LeaseElector(
            rest,
            namespace=lease_namespace or os.environ.get("POD_NAMESPACE") or cfg.namespace,
            identity=identity,
            clock=clock,
            lease_duration_s=lease.lease_duration_s,
            renew_deadline_s=lease.renew_deadline_s,
            retry_period_s=lease.retry_period_s,
        )
        rest.guard = elector.check_write
    return KubernetesBackend(rest, models, cfg, clock=clock, elector=elector, identity=identity,
                             **(backend_options or {}))


def _refuse_dry_run(method: str, path: str) -> None:
    raise Fenced(0, f"{method} {path}: refused, dry run")
