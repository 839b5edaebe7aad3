"""Build a ``LocalCluster`` from the two config files, and its first placement.

``cluster_from_config`` joins cluster.yaml's GPUs (emulated ones as declared,
real ones as NVML reports them) with models.yaml's Triton model dirs.
``initial_actions`` puts ``min_replicas`` of each MIG model on the first
allowed profile that fits, at ``best_start``, and ``min_replicas`` groups of
each multinode model on the RDMA pool's whole GPUs (the control loop takes
over from there).
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.act.local.backoff import BackoffPolicy
from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.replicas import WHOLE, ModelRuntime
from autoscaler.config import ClusterConfig, ModelsConfig, initial_cluster_state, model_specs
from autoscaler.mig.layout import Placement, best_start
from autoscaler.mig.products import get_product
from autoscaler.observe import nvml
from autoscaler.policy.types import Action, ActionKind, ClusterState, GpuState, Reason


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
    models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, state: ClusterState
) -> list[Action]:
    """CREATE ``min_replicas`` of each MIG model (2 on distinct GPUs for high
    availability), then one WAIT_READY.

    A free instance already in the layout is used first; otherwise a new one at
    ``best_start``. Models in file order, so earlier models get the first slices.
    """
    layouts = {g.id: list(g.layout) for g in state.gpus if g.mig_enabled}
    products = {g.id: get_product(g.product) for g in state.gpus if g.mig_enabled}
    used = {(r.gpu, r.start) for r in state.replicas}
    actions: list[Action] = []
    for spec in model_specs(models_cfg, cluster_cfg):
        if spec.backend != "mig":
            continue
        have = [r.gpu for r in state.replicas if r.model == spec.name]
        # high availability: at least 2 replicas, on distinct GPUs where possible
        want = max(spec.min_replicas, 2 if spec.high_availability else 0)
        for _ in range(max(0, want - len(have))):
            avoid = set(have) if spec.high_availability else set()
            spot = _find_spot(spec.allowed_profiles, layouts, products, used, avoid)
            if spot is None and avoid:
                spot = _find_spot(spec.allowed_profiles, layouts, products, used)
            if spot is None:
                break  # shortfall: the loop reports it
            gpu, prof, start = spot
            have.append(gpu)
            used.add((gpu, start))
            if Placement(start, prof) not in layouts[gpu]:
                layouts[gpu].append(Placement(start, prof))
            actions.append(
                Action(
                    ActionKind.CREATE,
                    Reason.MIN_REPLICAS,
                    gpu=gpu,
                    model=spec.name,
                    profile=prof,
                    start=start,
                )
            )
    actions += _initial_groups(models_cfg, cluster_cfg, state)
    if actions:
        actions.append(Action(ActionKind.WAIT_READY, Reason.MIN_REPLICAS))
    return actions


def _initial_groups(models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, state: ClusterState) -> list[Action]:
    """``min_replicas`` groups per multinode model, with the planner's conventions:
    member ids ``"<model>-g<k>-<rank>"``, profile ``"whole"``, start 0; each group on
    ``nodes_per_group`` distinct nodes x ``gpus_per_node`` free whole RDMA GPUs,
    the model's fabric first. A group that does not fit is left to the loop
    (it reports the shortfall)."""
    held = {r.gpu for r in state.replicas}
    free = [g for g in state.gpus if g.rdma and not g.mig_enabled and g.id not in held]
    taken_ids = {r.id for r in state.replicas}
    actions: list[Action] = []
    for spec in model_specs(models_cfg, cluster_cfg):
        if spec.backend != "multinode":
            continue
        npg, gpn = max(1, spec.nodes_per_group), max(1, spec.gpus_per_node)
        have = {r.id.rsplit("-", 1)[0] for r in state.replicas if r.model == spec.name}
        want = max(spec.min_replicas, 2 if spec.high_availability else 0)
        k = 0
        for _ in range(max(0, want - len(have))):
            chosen = _pick_group(free, npg, gpn, spec.fabric)
            if chosen is None:
                break
            while f"{spec.name}-g{k}" in have or f"{spec.name}-g{k}-0" in taken_ids:
                k += 1
            gid = f"{spec.name}-g{k}"
            have.add(gid)
            for rank, g in enumerate(chosen):
                free.remove(g)
                actions.append(
                    Action(
                        ActionKind.CREATE,
                        Reason.MIN_REPLICAS,
                        gpu=g.id,
                        model=spec.name,
                        profile=WHOLE,
                        start=0,
                        replica=f"{gid}-{rank}",
                    )
                )
    return actions


def _pick_group(free: list[GpuState], npg: int, gpn: int, fabric: str | None) -> list[GpuState] | None:
    # One fabric (the model's first), else any mix -- as the planner does.
    fabrics: list = sorted({g.fabric for g in free}, key=lambda f: (f != fabric, str(f)))
    for fab in [*fabrics, "*any*"]:
        by_node: dict[str, list[GpuState]] = {}
        for g in free:
            if fab == "*any*" or g.fabric == fab:
                by_node.setdefault(g.node, []).append(g)
        nodes = sorted(n for n, gs in by_node.items() if len(gs) >= gpn)
        if len(nodes) >= npg:
            return [g for n in nodes[:npg] for g in by_node[n][:gpn]]
    return None


def _find_spot(profiles, layouts, products, used, avoid=frozenset()) -> tuple[str, str, int] | None:
    layouts = {g: lay for g, lay in layouts.items() if g not in avoid}
    for prof in profiles:
        for gid, layout in layouts.items():  # an existing idle instance first
            for pl in layout:
                if pl.profile == prof and (gid, pl.start) not in used:
                    return gid, prof, pl.start
        for gid, layout in layouts.items():
            if prof not in products[gid].profiles:
                continue
            s = best_start(products[gid], layout, prof)
            if s is not None:
                return gid, prof, s
    return None
