"""The policy's typed configuration, its memory between ticks and its per-tick diagnostics.

``PolicyConfig`` is what ``config/`` builds from cluster.yaml's ``policy`` and the
models; ``PolicyState`` is all that ``decide`` carries from one tick to the next
(immutable: each tick returns a new one), so the live loop, the simulator and a
replay decide alike; ``ModelDiagnostics`` is one model's inputs and stage
outcomes in one tick, what ``migscale explain`` prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from autoscaler.policy import burst as bu
from autoscaler.policy import demand as dm
from autoscaler.policy import forecast as fc
from autoscaler.policy import hpa
from autoscaler.policy import spares as sp
from autoscaler.policy.replan import Memo, Replan
from autoscaler.policy.types import ModelSpec, Plan, Reason, RepartitionScope


@dataclass(frozen=True)
class PolicyConfig:
    """Typed policy knobs (cluster.yaml ``policy``) plus the model specs and SLOs."""

    models: tuple[ModelSpec, ...]
    slo_p99_ms: Mapping[str, float] = field(default_factory=dict)
    tick_s: float = 5.0
    # The headroom before one is learned (and always, when headroom_quantile is None).
    headroom: float = 0.2
    # The learned headroom: this quantile of how far demand rose above the forecast
    # within one reaction horizon (``forecast.py``, where its default is chosen);
    # the policy's main knob.
    headroom_quantile: float | None = fc.HeadroomConfig.quantile
    # Seconds from CREATE to a serving replica: a pod start on Kubernetes (30 s in
    # the simulator), ~2 s for a local tritonserver. Part of the reaction horizon.
    replica_start_s: float = 30.0
    # The planner runs at least this often; in between only when something is
    # urgent (``replan``): a smaller profile or an emptied GPU waits up to this long.
    replan_s: float = 60.0
    # None: the level's time constant is the long window (``forecasting``)
    forecast: fc.ForecastConfig | None = None
    burst: bu.BurstConfig = field(default_factory=bu.BurstConfig)
    tolerance: float = 0.1
    short_window_s: float = 10.0
    long_window_s: float = 60.0
    panic_threshold: float = 2.0
    panic_stable_window_s: float | None = None  # None: the long window (Knative: stable window)
    churn_budget: int | None = 4
    scale_up: hpa.ScalingRules = hpa.DEFAULT_SCALE_UP
    scale_down: hpa.ScalingRules = hpa.DEFAULT_SCALE_DOWN
    metrics_stale_s: float = 60.0
    backlog_drain_s: float | None = None  # None: the short window
    correction: dm.CorrectionConfig = field(default_factory=dm.CorrectionConfig)
    # NVIDIA's reference signal as a second HPA metric (e.g. 1.0); None: off
    queue_compute_target: float | None = None
    # A replica is swapped for a smaller profile only once the req/s required has
    # stayed low this long (None/0: never). Longer than the scale-down window on
    # purpose: an oversized replica's slack absorbs the next burst of a bursty
    # model; only demand that stays low for half an hour is right-sized.
    rightsize_window_s: float | None = 1800.0
    # How long a MIG repartition takes on this backend: mig-manager 3-5 min on
    # Kubernetes (docs/gpu-operator.md), ~0 on the local emulation. When it is slower than
    # FAST_PATH_MIN_REPARTITION_S the planner's scale-up fast path covers a
    # shortfall with instances that exist now before cutting efficient ones.
    repartition_s: float = 180.0
    # Warm spare slices (``spares.py``): learned, bounded; only where the fast path is on.
    spares: sp.SpareConfig = field(default_factory=sp.SpareConfig)
    # What a repartition drains on this backend (NODE on Kubernetes): where it is the
    # whole node, no spare is carved (one would evict the node's replicas).
    repartition_scope: RepartitionScope = RepartitionScope.GPU

    @property
    def metrics_window_hint_s(self) -> float:
        """The metrics window the slow signals average over (the source's rate window;
        30 s for Prometheus ``rate(...[30s])``), for the age of its samples."""
        return 30.0

    def spec(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def forecasting(self) -> fc.ForecastConfig:
        if self.forecast is not None:
            return self.forecast
        # The level's time constant is the long window: a level that moves faster than
        # capacity can follow only adds its noise to the scale-down window's maximum,
        # and the learned headroom and the burst layer cover what it smooths over.
        # Chosen on the development seeds 1-5 of benchmarks/generalization.py (3 h):
        # the cheapest of 0.5 / 1 / 1.5 x the window, each at quantile 0.9 and 0.95,
        # that reached 99% mean attainment. At 0.9: 99.05% / 32.0 GPU-h, 99.02% / 31.1
        # and 98.97% / 30.9; at 0.95: 99.14% / 33.3, 99.08% / 32.2 and 99.08% / 31.9.
        return fc.ForecastConfig(level_tau_s=max(self.long_window_s, self.tick_s))

    @property
    def headroom_learning(self) -> fc.HeadroomConfig:
        if self.headroom_quantile is None:
            return fc.HeadroomConfig(prior=self.headroom, min_samples=10**9)
        return fc.HeadroomConfig(quantile=self.headroom_quantile, prior=self.headroom)

    @property
    def stable_window_s(self) -> float:
        return self.panic_stable_window_s if self.panic_stable_window_s is not None else self.long_window_s


@dataclass(frozen=True)
class Stage:
    name: str
    value: float | None
    reason: Reason


@dataclass(frozen=True)
class ModelDiagnostics:
    """Inputs and stage outcomes for one model in one tick (what ``explain`` prints)."""

    model: str
    metrics_ok: bool
    observed_rps: float | None = None
    demand_short_rps: float | None = None
    demand_long_rps: float | None = None
    demand_used_rps: float | None = None
    panicking: bool = False
    correction: float = 1.0
    current_replicas: int = 0
    current_capacity_rps: float = 0.0
    required_rps: float | None = None
    forecast_rps: float | None = None  # the forecaster's envelope over the horizon
    floor_rps: float | None = None  # forecast x correction x (1 + headroom)
    burst_rps: float | None = None  # the burst layer's ask (None: no fresh fast signals)
    hold_rps: float | None = None  # long-window demand x correction x (1 + headroom), at most what runs
    rise_rps: float | None = None  # short-window demand x correction x (1 + headroom): leading the long, above the floor, within capacity
    headroom: float | None = None
    headroom_learned: bool = False  # False: the prior, too few samples yet
    headroom_quantile: float | None = None  # the quantile it is learned at (None: fixed)
    headroom_samples: int = 0
    horizon_s: float | None = None
    cycle_s: float | None = None  # the period demand repeats on (None: none found)
    recurring_rps: float | None = None  # the recurring rise expected within the horizon
    p99_ms: float | None = None
    slo_p99_ms: float | None = None
    stages: tuple[Stage, ...] = ()
    desired_replicas: int = 0
    target_rps: float = 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["stages"] = [{"name": s.name, "value": s.value, "reason": s.reason.value} for s in self.stages]
        return d


@dataclass(frozen=True)
class PolicyState:
    """Everything decide remembers between ticks (immutable; each tick returns a new one)."""

    demand: Mapping[str, tuple[dm.DemandSample, ...]] = field(default_factory=dict)
    recommendations: Mapping[str, tuple[hpa.Recommendation, ...]] = field(default_factory=dict)
    # per model, per-minute maxima of the req/s required over the right-size window
    required_peaks: Mapping[str, tuple[tuple[float, float | None], ...]] = field(default_factory=dict)
    scale_events: Mapping[str, tuple[hpa.ScaleEvent, ...]] = field(default_factory=dict)
    panic: Mapping[str, dm.PanicState] = field(default_factory=dict)
    correction: Mapping[str, float] = field(default_factory=dict)
    forecast: Mapping[str, fc.Forecast] = field(default_factory=dict)
    headroom: Mapping[str, fc.Headroom] = field(default_factory=dict)
    last_recommendation: Mapping[str, int] = field(default_factory=dict)  # before stabilization
    last_plan: Plan | None = None
    # (planner inputs, its plan, the planner function) of the last call: equal inputs
    # give an equal plan, so an unchanged tick reuses it (see ``decide``)
    planner_memo: Memo | None = field(default=None, repr=False, compare=False)
    diagnostics: Mapping[str, ModelDiagnostics] = field(default_factory=dict)
    spares: sp.SpareState = field(default_factory=sp.SpareState)
    t_s: float | None = None
    replan: Replan | None = None  # whether this tick called the planner, and why
