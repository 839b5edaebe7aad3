"""The simulated world's settings and records: ``SimConfig``, one replica, one repartition.

Place in the loop: shared state of ``SimCluster`` (the world, ``cluster.py``)
and its apply path (``actions.py``); nothing here acts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autoscaler.mig import Placement
from autoscaler.observe.queries import SUMMARY_WINDOW_S
from autoscaler.policy.types import ReplicaState
from autoscaler.sim.queueing import ServiceCurve


@dataclass(frozen=True)
class SimConfig:
    step_s: float = 5.0  # fluid integration step between ticks
    start_delay_s: float = 30.0
    drain_s: float = 5.0
    repartition_delay_s: float = 180.0
    scrape_delay_s: float = 15.0
    metrics_window_s: float = 30.0
    # The span of the latency quantiles the loop reads: Triton's summaries keep about a
    # minute of requests, longer than any rate window, ending at the same scrape. None:
    # the quantiles cover the metrics window, as a histogram_quantile over its rate would.
    latency_window_s: float | None = SUMMARY_WINDOW_S
    # The burst layer's direct scrape of the replicas (every 1-2 s on a real
    # backend): the last ``fast_window_s`` of history, ``fast_delay_s`` late.
    # One 5 s step is the simulator's resolution, so the freshest fast sample
    # covers the step that just ended. None: the backend runs without one
    # (``migscale controller --no-fast-scrape``) and ``read`` reports no fast signals.
    fast_window_s: float | None = 5.0
    fast_delay_s: float = 0.0
    # Seconds between the direct scrape's rounds where they come less often than every
    # step: the Kubernetes controller's rounds take at most a quarter of the time, so a
    # fleet of 2,000 pods is scraped every ~8 s. A read then sees the rates between the
    # last two rounds (a window of one gap) ending at the last round, which the rounds'
    # schedule (every ``fast_gap_s`` from the start) puts up to a gap in the past; the
    # burst layer's staleness rule applies to that age as to a real scrape's. None:
    # every step (the freshest sample; a gap of up to one step is the same).
    fast_gap_s: float | None = None
    # A request queued longer than this is dropped (client/Triton timeout): it
    # counts as an SLO miss but does not hold the queue up forever. 30 s at
    # 300 req/s caps a replica's backlog at ~9,000 requests.
    queue_timeout_s: float = 30.0
    # True: every replica sheds what waited past its model's SLO instead (Triton's queue
    # policy with ``timeout_action: REJECT``, docs/shedding.md): a setting serving teams
    # choose in their model config, off in the benchmark's world.
    shed_at_slo: bool = False
    # False: ``in_flight()`` names every GPU and model busy while anything
    # converges -- a global gate, for ``benchmarks/policies.py --diagnose`` to
    # measure what the per-GPU/per-model answer gains.
    in_flight_hook: bool = True
    # A WAIT_READY fails (and drops the rest of its chain) when its replica is not
    # READY this long after the WAIT_READY began waiting: a Deployment's default
    # progressDeadlineSeconds. Worked number: a CREATE behind a 180 s repartition
    # plus a 30 s start waits 210 s, well inside it.
    wait_ready_timeout_s: float = 600.0
    # Triton's ``max_batch_size`` with the dynamic batcher on. Triton reports for each
    # request the compute time of the whole batch it ran in (docs/metrics.md), so the
    # compute per request its metrics show -- and with it the queue:compute ratio the
    # burst layer and the ``hpa-queue`` baseline read -- depends on the batch, while
    # latency does not (batching is inside the service rate). The mean batch is the
    # queue a replica finds when it frees up, between 1 and this. 1: every request
    # runs alone and reports its own service time.
    max_batch: int = 1

    def __post_init__(self) -> None:
        for name in ("fast_window_s", "latency_window_s", "fast_gap_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be > 0 or None, got {v!r}")
        for name in ("step_s", "metrics_window_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be > 0, got {v!r}")
        if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ValueError(f"max_batch: must be an integer >= 1, got {self.max_batch!r}")
        for name in ("start_delay_s", "drain_s", "repartition_delay_s", "scrape_delay_s", "queue_timeout_s",
                     "wait_ready_timeout_s", "fast_delay_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be >= 0, got {v!r}")


@dataclass
class SimReplica:
    id: str
    model: str
    profile: str
    gpu: str
    start: int
    mu: float  # service rate (req/s) of the fluid M/M/1 queue
    capacity: float  # req/s at the SLO (the capacity table)
    compute: int  # compute slices held
    state: ReplicaState = ReplicaState.STARTING
    since_s: float = 0.0
    ready_at: float | None = None  # None: waits for its GPU's repartition
    drained_at: float | None = None
    x: float = 0.0  # requests in the system
    delete_when_drained: bool = False
    first_step: int = 0
    cum_busy: list[float] = field(default_factory=list)  # busy-seconds at the end of each step
    curve: ServiceCurve | None = None  # measured rate by occupancy; None: ``mu`` at every load


@dataclass
class Repartition:
    target: tuple[Placement, ...]
    done_at: float
