"""One local replica: a tritonserver pinned to one (emulated or real) MIG instance,
or a multinode group (``ProcessGroup``) holding whole GPUs.

Kept apart from ``local.py`` so the cluster there reads as state transitions;
this module knows how to launch and describe one replica.

A group is ONE ``LocalReplica`` here (routed, scraped, drained and stopped
through its leader) but several planner replicas in ``to_replicas()``: one per
member GPU, ids ``"<group>-<rank>"``, profile ``"whole"``, start 0, all in the
group's state -- the planner's own convention (``planner.actions``), so the
planner sees exactly the groups it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.act.local.emulation import emulation_env, real_mig_env
from autoscaler.act.local.multinode import ProcessGroup
from autoscaler.act.local.probe import ReplicaCounters
from autoscaler.act.local.triton import TritonProcess
from autoscaler.policy.types import Replica, ReplicaState

WHOLE = "whole"  # the planner's profile for a GPU held whole by a multinode group


@dataclass(frozen=True)
class ModelRuntime:
    """What it takes to serve one model locally."""

    name: str  # public name (models.yaml), used in /v2/models/<name>
    repository: Path  # Triton model repository holding the model dir
    triton_name: str  # the model dir's name inside the repository
    backend: str = "mig"
    group_size: int = 1  # multinode: nodes_per_group * gpus_per_node processes


@dataclass
class LocalReplica:
    id: str
    model: str
    profile: str
    gpu: str
    start: int
    process: TritonProcess | ProcessGroup
    state: ReplicaState = ReplicaState.STARTING
    since_s: float = 0.0
    restarts: int = 0
    routable: bool = False  # in nginx's upstream (set just before READY is published)
    last_counters: ReplicaCounters | None = field(default=None, repr=False)
    # multinode: (planner replica id, GPU id) per rank; rank 0 is the leader
    members: tuple[tuple[str, str], ...] = ()
    # crash loop (act/local/supervisor.py): when it last died, how, and when it restarts
    created_s: float | None = None
    exited_s: float | None = None
    exit_code: int | None = None
    next_restart_s: float | None = None
    last_error: tuple[str, ...] = ()
    startup_timed_out: bool = False  # stopped by the supervisor for not turning ready in time

    def __post_init__(self) -> None:
        if self.created_s is None:
            self.created_s = self.since_s

    @property
    def is_group(self) -> bool:
        return bool(self.members)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(g for _, g in self.members) if self.members else (self.gpu,)

    def pids(self) -> list[int]:
        """Every process of this replica we started (all members of a group)."""
        if isinstance(self.process, ProcessGroup):
            return self.process.pids()
        return [self.process.pid] if self.process.pid else []

    def log_paths(self) -> list[Path]:
        """Its current logs (a group: the leader's and each worker's of this generation)."""
        p = self.process
        if isinstance(p, ProcessGroup):
            out = [p.leader.log_path] if p.leader else []
            return out + [m.log_path for m in p.workers if m.log_path is not None]
        return [p.log_path]

    @property
    def port(self) -> int:
        return self.process.ports.http

    @property
    def backend(self) -> str:
        return self.process.url_http

    def to_replicas(self) -> list[Replica]:
        """What the planner sees: one replica, or one per member GPU of a group."""
        if not self.members:
            return [self.to_replica()]
        return [
            Replica(id=mid, model=self.model, profile=WHOLE, gpu=gpu, start=0, state=self.state, since_s=self.since_s)
            for mid, gpu in self.members
        ]

    def to_replica(self) -> Replica:
        return Replica(
            id=self.id,
            model=self.model,
            profile=self.profile,
            gpu=self.gpu,
            start=self.start,
            state=self.state,
            since_s=self.since_s,
        )


def replica_env(
    product: str, profile: str, gpu: str, start: int, model: str, mig_uuid: str | None, emulate: bool = True
) -> dict[str, str]:
    """Real MIG instance: CUDA_VISIBLE_DEVICES=MIG-<uuid>; otherwise the emulation env
    (``emulate=False`` keeps the slice identity but adds no accelerator time: benchmarks)."""
    if mig_uuid:
        return real_mig_env(mig_uuid, model=model)
    env = emulation_env(product, profile, gpu, start, model=model)
    if not emulate:
        env["MIGSCALE_EMULATE"] = "0"
    return env


def launch(
    rt: ModelRuntime, replica_id: str, run_dir: Path, env: dict[str, str], tritonserver: str | None
) -> TritonProcess:
    """Start (not wait for) a tritonserver serving ``rt`` in ``run_dir/replicas/<id>``."""
    proc = TritonProcess(
        rt.repository, [rt.triton_name], run_dir / "replicas" / replica_id, env=env, tritonserver=tritonserver,
        run_dir=run_dir,
    )
    proc.start()
    return proc


def group_env(product: str, gpu: str, model: str, emulated: bool) -> dict[str, str]:
    """One group member's identity: its whole GPU. An emulated GPU hides any real
    one (the model then picks gloo); a real one is the GPU index on its node."""
    env = {
        "MIGSCALE_PRODUCT": product,
        "MIGSCALE_PROFILE": WHOLE,
        "MIGSCALE_GPU": gpu,
        "MIGSCALE_MODEL": model,
        "MIGSCALE_EMULATE": "1" if emulated else "0",
        "CUDA_VISIBLE_DEVICES": "" if emulated else gpu.rsplit("/", 1)[-1],
    }
    return env


def launch_group(
    rt: ModelRuntime,
    group_id: str,
    run_dir: Path,
    member_env: list[dict[str, str]],
    tritonserver: str | None,
) -> ProcessGroup:
    """Start (not wait for) every member of a multinode group in ``run_dir/replicas/<group>``."""
    group = ProcessGroup(
        rt.repository,
        rt.triton_name,
        len(member_env),
        run_dir / "replicas" / group_id,
        tritonserver=tritonserver,
        member_env=member_env,
        run_dir=run_dir,
    )
    group.start()
    return group
