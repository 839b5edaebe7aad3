"""Build a ``LocalCluster`` from the two config files, and its first placement.

Place in the loop: wiring before the first tick. ``cluster_from_config``
joins cluster.yaml's GPUs (emulated ones as declared, real ones as NVML
reports them) with models.yaml's Triton model dirs. ``initial_actions`` asks
the planner itself for the first placement -- no traffic yet, so
``min_replicas`` of each model (two on distinct GPUs for high availability,
whole groups on the RDMA pool for multinode models) -- exactly as the control
loop's first tick would place them, and the loop takes over from there.
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.act.local.backoff import BackoffPolicy
from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.config import ClusterConfig, ModelsConfig, initial_cluster_state, model_specs
from autoscaler.observe import nvml
from autoscaler.policy.planner import plan
from autoscaler.policy.types import Action, ClusterState, GpuState


class SetupError(ValueError):
    """Config that cannot run locally; the message names the field and value."""


def model_runtimes(models_cfg: ModelsConfig) -> dict[str, ModelRuntime]:
    out: dict[str, ModelRuntime] = {}
    for i, m in enumerate(models_cfg.models):
        d = models_cfg.resolve(m.model_dir).resolve()
        if m.backend == "mig" and not (d / "config.pbtxt").is_file():
            raise SetupError(
                f"models[{i}].model_dir: no Triton model (config.pbtxt) in {d}, got {m.model_dir!r}"
            )
        if m.backend == "multinode" and not (d / "config.pbtxt").is_file():
            raise SetupError(
                f"models[{i}].model_dir: no Triton model (config.pbtxt) for the group leader in {d}, "
                f"got {m.model_dir!r}"
            )
        size = m.multinode.nodes_per_group * m.multinode.gpus_per_node if m.multinode else 1
        out[m.name] = ModelRuntime(m.name, d.parent, d.name, m.backend, size)
    return out


def local_gpus(cluster_cfg: ClusterConfig, discovered: list | None = None) -> tuple[list[GpuState], dict]:
    """GPUs for the local backend: emulated MIG GPUs from config; real ones (``emulated: false``)
    replaced by what NVML reports on this host (layout and MIG UUIDs); plus the RDMA
    pool's whole GPUs (MIG off) for multinode groups, as the config declares them."""
    state = initial_cluster_state(cluster_cfg)
    mig = [g for g in state.gpus if g.mig_enabled and not g.rdma]
    rdma = [g for g in state.gpus if g.rdma]
    real = [g for g in mig if not g.emulated]
    if not real:
        return mig + rdma, {}
    found = nvml.discover() if discovered is None else discovered
    node = real[0].node
    states, uuids = nvml.gpu_states(node, found)
    if len(states) < len(real):
        raise SetupError(
            f"gpus: {len(real)} GPU(s) with emulated: false, but NVML finds {len(states)} MIG-enabled GPU(s) "
            f"on this host; got {[g.id for g in real]}"
        )
    return [g for g in mig if g.emulated] + states[: len(real)] + rdma, uuids


def cluster_from_config(
    models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, run_dir: str | Path | None = None, **kw
) -> LocalCluster:
    local = cluster_cfg.local
    gpus, uuids = local_gpus(cluster_cfg)
    return LocalCluster(
        run_dir or local.run_dir,
        model_runtimes(models_cfg),
        gpus,
        frontdoor_port=kw.pop("frontdoor_port", local.frontdoor_port),
        api_port=kw.pop("api_port", local.api_port),
        prometheus=kw.pop("prometheus", local.prometheus),
        tritonserver=local.tritonserver,
        mig_uuids=uuids,
        restart_backoff=BackoffPolicy(**local.restart_backoff.model_dump()),
        **kw,
    )


def initial_actions(
    models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, state: ClusterState, *, now_s: float = 0.0
) -> list[Action]:
    """The planner's actions for no traffic yet: ``min_replicas`` of every model on ``state``.

    The local emulation repartitions instantly, so the planner's fast path
    (instances that exist now first) is off, as in the loop
    (``runtime/local.py``: ``repartition_s=0``).
    """
    specs = model_specs(models_cfg, cluster_cfg)
    p = plan(specs, {s.name: 0.0 for s in specs}, state, now_s=now_s, fast_path=False)
    return list(p.actions)
