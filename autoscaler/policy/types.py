"""Values that flow through one control tick: Observation in, Plan out.

This module is the contract between the adapters (observe/, act/, sim/, api/)
and the pure core (policy/, mig/). Everything is a frozen dataclass or an enum;
nothing here does I/O. A missing measurement is ``None``, never 0 -- the
policy treats None as "unknown" and follows the HPA's missing-data rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from autoscaler.mig.layout import Placement


class Reason(str, Enum):
    """Why the policy changed (or refused to change) something."""

    # demand-driven
    SCALE_UP_DEMAND = "scale_up_demand"
    SCALE_DOWN_DEMAND = "scale_down_demand"
    PANIC_SCALE_UP = "panic_scale_up"  # burst seen on the short window
    MIN_REPLICAS = "min_replicas"
    MAX_REPLICAS = "max_replicas"
    HIGH_AVAILABILITY = "high_availability"
    # holds
    HOLD_WITHIN_TOLERANCE = "hold_within_tolerance"
    HOLD_STABILIZATION = "hold_stabilization"
    HOLD_MISSING_METRICS = "hold_missing_metrics"
    HOLD_PANIC = "hold_panic"  # no scale-down while panicking
    HOLD_CONVERGING = "hold_converging"  # earlier actions still in flight
    RATE_LIMITED = "rate_limited"  # behavior policies capped the change
    INVALID_METRIC = "invalid_metric"  # NaN/Inf/negative/huge value dropped
    # placement
    PROFILE_EFFICIENCY = "profile_efficiency"  # a better capacity-per-slice profile
    CONSOLIDATE = "consolidate"  # free a whole GPU
    REPARTITION = "repartition"  # the profile mix of a GPU must change
    CHURN_BUDGET = "churn_budget"  # change deferred to a later tick
    SHORTFALL = "shortfall"  # the cluster cannot meet demand
    FLEET_SHARE_MIN = "fleet_share_min"  # full fleet: held at the one replica no model goes without
    REPLACE_FAILED = "replace_failed"  # a crashed replica is replaced
    WARM_SPARE = "warm_spare"  # an empty instance carved ahead of the next scale-up
    KEEP = "keep"


# ---------------------------------------------------------------- inventory


class ReplicaState(str, Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    # Exited again soon after a restart; waiting out its back-off before the next
    # one (kubelet's CrashLoopBackOff). Not capacity: the policy places elsewhere.
    CRASHLOOP = "crashloop"


# Serving, or about to: the states that count as a model's capacity.
LIVE = (ReplicaState.STARTING, ReplicaState.READY)


@dataclass(frozen=True)
class GpuState:
    """One physical (or emulated) GPU and how it is cut right now."""

    id: str  # stable id, e.g. "node-a/0"
    node: str
    product: str  # key of autoscaler.mig.PRODUCTS
    layout: tuple[Placement, ...] = ()
    mig_enabled: bool = True
    rdma: bool = False  # on an RDMA-capable node (multinode backend)
    fabric: str | None = None  # RDMA fabric label; groups prefer one fabric
    emulated: bool = True
    reserved_by: str | None = None  # a multinode model holding the whole GPU
    # Work still in flight on it (a repartition, a drain, queued actions): the
    # planner leaves it exactly as it is this tick -- no new replica, no layout
    # change -- and places elsewhere (the loop's per-GPU gate sets it).
    busy: bool = False


@dataclass(frozen=True)
class Replica:
    """One Triton replica pinned to one MIG instance (or a multinode group)."""

    id: str
    model: str
    profile: str  # MIG profile name, or "whole" for multinode groups
    gpu: str  # GpuState.id (the leader's GPU for a group)
    start: int
    state: ReplicaState = ReplicaState.STARTING
    since_s: float | None = None  # when it entered ``state``


@dataclass(frozen=True)
class ClusterState:
    gpus: tuple[GpuState, ...] = ()
    replicas: tuple[Replica, ...] = ()

    def gpu(self, gpu_id: str) -> GpuState:
        for g in self.gpus:
            if g.id == gpu_id:
                return g
        raise KeyError(gpu_id)


# ---------------------------------------------------------------- signals


@dataclass(frozen=True)
class FastSignals:
    """The burst layer's signals: scraped straight from the replicas every 1-2 s where
    the backend allows (the local cluster, the simulator), summed over a model's replicas.

    ``arrival_rps`` is what arrived over the last few seconds: completions plus
    failures plus the growth of the queue -- unlike the served rate it does not
    saturate at capacity. Any field may be None (absent series, first scrape).
    """

    t_s: float  # sample time of the newest scrape
    window_s: float  # what the rates average over
    arrival_rps: float | None = None
    completed_rps: float | None = None
    pending: float | None = None  # queued requests now (Triton's pending gauge)
    avg_queue_ms: float | None = None
    avg_compute_ms: float | None = None


@dataclass(frozen=True)
class ModelSignals:
    """Per-model request signals, each a rate or average over the query window.

    ``t_s`` is the sample time of the newest data point used. Any field may be
    None when its series is absent, stale or invalid.
    """

    model: str
    t_s: float | None
    request_rate: float | None = None  # requests/s, success + failure
    success_rate: float | None = None
    failure_rate: float | None = None
    avg_queue_ms: float | None = None
    avg_compute_ms: float | None = None
    queue_compute_ratio: float | None = None  # NVIDIA's reference HPA signal
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    latency_is_average: bool = False  # True: p*_ms hold the counter average, no summaries
    # How far back p*_ms reach when that is longer than the metrics window: Triton keeps
    # its summaries' quantiles over a sliding window (``observe.queries.SUMMARY_WINDOW_S``).
    # None: the quantiles cover the metrics window, as the rates do.
    latency_window_s: float | None = None
    pending: float | None = None  # queued requests (gauge)
    avg_batch: float | None = None
    ready_replicas: int | None = None  # replicas that reported this window
    fast: FastSignals | None = None  # the burst layer's 1-2 s signals, where the backend has them


@dataclass(frozen=True)
class ReplicaSignals:
    replica: str
    model: str
    t_s: float | None
    busy_fraction: float | None = None  # rate(compute_infer_us) / 1e6
    gr_engine_active: float | None = None  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0..1


@dataclass(frozen=True)
class Observation:
    t_s: float
    cluster: ClusterState
    models: Mapping[str, ModelSignals | None] = field(default_factory=dict)
    replicas: Mapping[str, ReplicaSignals] = field(default_factory=dict)
    source_ok: bool = True  # False when the metrics source could not be read at all
    notes: tuple[str, ...] = ()  # e.g. invalid values dropped, with their reasons


# ---------------------------------------------------------------- planner input


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know about one model (built from config)."""

    name: str
    capacity: Mapping[str, float]  # profile name -> req/s one replica sustains at the SLO
    allowed_profiles: tuple[str, ...]  # usable profiles, best first is NOT implied
    min_replicas: int = 1
    max_replicas: int = 16
    high_availability: bool = False  # >= 2 replicas on distinct GPUs
    priority: int = 0  # higher wins when the cluster is short
    memory_gb: float | None = None
    backend: str = "mig"  # "mig" | "multinode"
    nodes_per_group: int = 1
    gpus_per_node: int = 1
    group_capacity_rps: float | None = None  # multinode: req/s one group sustains
    fabric: str | None = None


# ---------------------------------------------------------------- plan


class ActionKind(str, Enum):
    CREATE = "create"  # start a replica on (gpu, profile, start)
    WAIT_READY = "wait_ready"  # barrier: the created replica must be ready
    DRAIN = "drain"  # stop routing to a replica, let it finish
    DELETE = "delete"  # stop the drained replica
    REPARTITION = "repartition"  # set a GPU's layout (its affected instances are empty)


class RepartitionScope(str, Enum):
    """What one repartition takes down on a backend.

    GPU: new instances are carved in a GPU's free space while its other
    instances keep serving (MIG allows it: the simulator, a node driven with
    ``nvidia-smi mig`` directly). NODE: the GPU Operator's mig-manager applies
    a node's whole config and needs every GPU of the node idle, so the node is
    drained first (the Kubernetes backend, docs/kubernetes.md).
    """

    GPU = "gpu"
    NODE = "node"


@dataclass(frozen=True)
class Assignment:
    model: str
    profile: str
    gpu: str
    start: int
    replica: str | None = None  # existing replica kept in place; None = new


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: Reason
    gpu: str | None = None
    model: str | None = None
    profile: str | None = None
    start: int | None = None
    replica: str | None = None
    layout: tuple[Placement, ...] | None = None  # REPARTITION: the target layout


@dataclass(frozen=True)
class Cost:
    gpus_used: int = 0
    slices_used: int = 0
    instances_created: int = 0
    instances_destroyed: int = 0
    gpus_repartitioned: int = 0


@dataclass(frozen=True)
class Plan:
    t_s: float
    desired: Mapping[tuple[str, str], int]  # (model, profile) -> replicas
    assignments: tuple[Assignment, ...]
    layouts: Mapping[str, tuple[Placement, ...]]  # gpu id -> target layout
    actions: tuple[Action, ...]
    shortfall: Mapping[str, float]  # model -> req/s the cluster cannot serve
    cost: Cost
    reasons: Mapping[str, tuple[Reason, ...]]  # model -> why it changed / held
    capacity_rps: Mapping[str, float] = field(default_factory=dict)  # model -> planned req/s
    target_rps: Mapping[str, float] = field(default_factory=dict)  # model -> req/s asked of the planner
