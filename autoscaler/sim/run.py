"""``simulate``: drive one policy over one trace in the simulated cluster and score it.

Place in the loop: this is the wiring. The one run loop, ``driver.Driver``,
ticks the policy (the production ``ControlLoop`` for ``migscale``, a
``sim/drivers.py`` driver for the baselines) on simulated time,
``SimTime``: a clock whose ``sleep`` *is* the world moving on -- ``SimCluster``
advances in ``step_s`` steps at the trace's rates -- so the driver's waits
between ticks are what integrates the world. It decides nothing itself.

Scoring starts at t = 0 after a warm-up (``warmup_s``, default 1800 s) in which
the trace's first rate is held: every policy starts from the state it would
reach on that load, not from an empty cluster, so the numbers compare
steady-state behaviour and the first minutes do not punish slow starters.

- ``slo_attainment``: requests within their model's p99 target / all requests.
- ``gpu_hours``: integral of GPUs holding at least one replica (or being
  repartitioned); ``slice_hours``: of compute slices holding a replica.
- ``reconfigurations``: GPU repartitions carried out.
- ``recovery_s``: after the largest spike (the largest per-minute rate over
  the model's trailing 10-minute mean), seconds until that model's per-step
  attainment is back at >= 99.9% and stays there for 5 minutes; 0 when it
  never dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autoscaler.clock import VirtualClock
from autoscaler.driver import Driver, Hooks
from autoscaler.mig import Placement, get_product
from autoscaler.policy.types import ClusterState, GpuState, ModelSpec, RepartitionScope, Replica, ReplicaState
from autoscaler.sim import baselines as bl
from autoscaler.sim import queueing as q
from autoscaler.sim.cluster import SimCluster, SimConfig
from autoscaler.sim.drivers import HpaDriver, WindowedMaxDriver
from autoscaler.sim.traces import Trace

POLICIES = ("static-peak", "hpa-queue", "hpa-util", "oracle", "migscale")
# Run only when named (not by ``--policy all`` or the policy benchmark): the reactive
# bound's own rule, for ``benchmarks/actuation.py`` (``sim/windowed.py``).
ANALYSIS_POLICIES = ("windowed-max",)
RECOVERY_TARGET = 0.999
RECOVERY_HOLD_S = 300.0
SPIKE_BASE_S = 600.0


class SimError(ValueError):
    """A simulation that cannot run as asked; the message names the field and value."""


# Which backend's paths the simulated world has (``backend_world``).
BACKENDS = ("sim", "kubernetes", "kubernetes-no-fast")


def backend_world(backend: str, sim: SimConfig) -> tuple[SimConfig, dict[str, Any]]:
    """The world ``sim`` as ``backend`` runs it: (its ``SimConfig``, migscale's policy overrides).

    ``sim``: every path the simulator has -- the 1 s direct scrape that feeds the burst layer
    (``SimConfig.fast_window_s``) and repartitions that take one GPU (``RepartitionScope.GPU``:
    warm spares, recuts while consolidating). ``kubernetes``: mig-manager drains the node for
    any cut, which the Kubernetes controller tells the policy (``RepartitionScope.NODE``: no
    spares, consolidation only into instances as cut now); its pods are scraped straight from
    their IPs each second (``migscale controller --fast-scrape``, the default), so the burst
    layer keeps its signals. ``kubernetes-no-fast``: the same without that scrape
    (``--no-fast-scrape``, or pods the controller cannot reach): Prometheus alone. The drain
    itself is not modelled: a cut still takes one GPU for ``repartition_delay_s`` while the
    node's other GPUs serve, so in that respect both are the backend's best case. The
    overrides are migscale's: the HPA baselines read no fast signals and keep static layouts.
    """
    if backend == "sim":
        return sim, {}
    if backend == "kubernetes":
        return sim, {"repartition_scope": RepartitionScope.NODE}
    if backend == "kubernetes-no-fast":
        return replace(sim, fast_window_s=None), {"repartition_scope": RepartitionScope.NODE}
    raise SimError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")


@dataclass
class Timeline:
    t_s: np.ndarray  # step starts (>= 0)
    models: tuple[str, ...]
    demand_rps: np.ndarray  # (models, steps)
    capacity_rps: np.ndarray  # req/s at SLO of READY replicas
    p99_ms: np.ndarray  # worst replica p99 per model (nan: no traffic)
    slo_ms: np.ndarray  # (models,)
    attainment: np.ndarray  # per-step share within SLO per model (nan: no traffic)
    gpus_in_use: np.ndarray  # (steps,)
    slices_in_use: np.ndarray


@dataclass
class Result:
    policy: str
    slo_attainment: float
    per_model: dict[str, float]
    gpu_hours: float
    slice_hours: float
    reconfigurations: int
    recovery_s: float
    gpus_provisioned: int
    wall_s: float = 0.0
    ticks: int = 0
    errors: list[str] = field(default_factory=list)
    timeline: Timeline | None = None
    measured_service: list[str] = field(default_factory=list)  # models served at profiled rates
    measured_curves: list[str] = field(default_factory=list)  # ...and at their measured Poisson p99 curve
    max_batch: dict[str, int] = field(default_factory=dict)  # models batched as their config.pbtxt says

    def to_json(self) -> dict[str, Any]:
        return {
            "slo_attainment": round(self.slo_attainment, 6),
            "per_model": {m: round(v, 6) for m, v in self.per_model.items()},
            "gpu_hours": round(self.gpu_hours, 4),
            "slice_hours": round(self.slice_hours, 4),
            "reconfigurations": self.reconfigurations,
            "recovery_s": round(self.recovery_s, 1),
            "gpus_provisioned": self.gpus_provisioned,
            "ticks": self.ticks,
            "wall_s": round(self.wall_s, 3),
            "errors": len(self.errors),
            "measured_service_rates": self.measured_service,
            "measured_service_curves": self.measured_curves,
            "max_batch": self.max_batch,
        }


# ------------------------------------------------------------------ entry points


def simulate(
    models_cfg: Any,
    cluster_cfg: Any,
    trace: Trace,
    policy_name: str,
    step_s: float = 5.0,
    *,
    sim: SimConfig | None = None,
    warmup_s: float = 1800.0,
    policy_overrides: Mapping[str, Any] | None = None,
    baseline_target: float | None = None,
) -> Result:
    """Simulate from config objects (``config.load_models`` / ``config.load_cluster``).

    Where a model's ``capacity_file`` holds ``migscale profile`` sweeps, the
    simulated replicas serve at the measured rate (``queueing.profiled_service_rate``:
    the Poisson capacity-at-SLO when profiled with Poisson arrivals, else the
    saturation throughput, and with Poisson points measured, at the rate each load
    calls for, ``queueing.ServiceCurve``) while the policy keeps planning with the
    capacity table; where its ``model_dir`` holds a Triton ``config.pbtxt``, its replicas batch as
    that config says (``config.triton_max_batch``).
    """
    from autoscaler.config import (
        initial_cluster_state,
        measured_replicas,
        model_max_batches,
        model_specs,
        policy_config,
    )

    specs = model_specs(models_cfg, cluster_cfg)
    slo = {m.name: float(m.slo.p99_ms) for m in models_cfg.models}
    # the policy knows how long this world's repartitions and starts take (its fast path and
    # its reaction horizon depend on them)
    world = sim or SimConfig()
    pcfg = policy_config(models_cfg, cluster_cfg, **{"repartition_s": world.repartition_delay_s,
                                                     "replica_start_s": world.start_delay_s,
                                                     **dict(policy_overrides or {})})
    service: dict[str, dict[str, float]] = {}
    curves: dict[str, dict[str, q.ServiceCurve]] = {}
    for name, per_profile in measured_replicas(models_cfg).items():
        for prof, got in per_profile.items():
            mu = q.profiled_service_rate(got.saturation_rps, got.poisson_capacity_rps, got.slo_p99_ms)
            if mu is not None:
                service.setdefault(name, {})[prof] = mu
            curve = q.ServiceCurve.from_poisson(got.poisson_points, got.saturation_rps, got.slo_p99_ms)
            if curve is not None:
                curves.setdefault(name, {})[prof] = curve
    return simulate_specs(specs, slo, initial_cluster_state(cluster_cfg), pcfg, trace, policy_name,
                          step_s, sim=sim, warmup_s=warmup_s, service_rps=service, service_curves=curves,
                          max_batch=model_max_batches(models_cfg), baseline_target=baseline_target)


def simulate_specs(
    specs: Sequence[ModelSpec],
    slo_ms: Mapping[str, float],
    initial: ClusterState,
    policy_cfg: Any,
    trace: Trace,
    policy_name: str,
    step_s: float = 5.0,
    *,
    sim: SimConfig | None = None,
    warmup_s: float = 1800.0,
    planner: Any = None,
    service_rps: Mapping[str, Mapping[str, float]] | None = None,
    service_curves: Mapping[str, Mapping[str, q.ServiceCurve]] | None = None,
    max_batch: Mapping[str, int] | None = None,
    baseline_target: float | None = None,
) -> Result:
    """``baseline_target``: the HPA baselines' target value (None: NVIDIA's reference
    queue:compute ratio 1, or 70% utilisation), the knob their frontier varies; for
    ``windowed-max``, its headroom quantile (None: migscale's)."""
    if policy_name not in POLICIES + ANALYSIS_POLICIES:
        raise SimError(f"policy: must be one of {', '.join(POLICIES + ANALYSIS_POLICIES)}, got {policy_name!r}")
    if not (math.isfinite(step_s) and step_s > 0):
        raise SimError(f"step_s: must be > 0, got {step_s!r}")
    other = {s.name: s.backend for s in specs if s.backend != "mig"}
    specs = [s for s in specs if s.backend == "mig"]
    names = [s.name for s in specs]
    unknown = [m for m in trace.models if m not in names and m not in other]
    unmodelled = [m for m in trace.models if m in other]
    problems = []
    if unknown:
        problems.append(f"trace: models {unknown} are not in the models config ({names})")
    if unmodelled:
        kinds = "/".join(sorted({other[m] for m in unmodelled}))
        problems.append(f"trace: models {unmodelled} run on the {kinds} backend, "
                        "which the simulator does not model (MIG replicas only)")
    if problems:
        raise SimError("; ".join(problems))
    gpus = [g for g in initial.gpus if g.mig_enabled and not g.rdma]
    if not gpus:
        raise SimError("cluster.gpus: the simulator needs at least one MIG GPU, got none")
    products = {g.product for g in gpus}
    if len(products) > 1:
        raise SimError(f"cluster.gpus: the simulator handles one GPU product, got {sorted(products)}")
    product = gpus[0].product
    sim = replace(sim or SimConfig(), step_s=step_s)
    _, grid = trace.on_grid(step_s)
    demand = np.zeros((len(specs), grid.shape[1]))
    for i, s in enumerate(specs):
        if s.name in trace.models:
            demand[i] = grid[trace.index(s.name)]
    if policy_name == "oracle":
        return _oracle(specs, demand, step_s, product, len(gpus))
    wall0 = time.perf_counter()
    peak = {s.name: float(demand[i].max()) for i, s in enumerate(specs)}
    tick_s = float(getattr(policy_cfg, "tick_s", 15.0))
    state = ClusterState(tuple(gpus), ())
    driver: Any
    if policy_name == "static-peak":
        state = _static_peak_state(specs, peak, gpus, product)
        driver = None
    elif policy_name in ("hpa-queue", "hpa-util"):
        profiles, layouts = bl.static_mig_layouts(specs, peak, gpus)
        state = ClusterState(tuple(replace(g, layout=layouts[g.id]) for g in gpus), ())
        cfg = bl.HpaBaselineConfig(
            metric="queue_compute" if policy_name == "hpa-queue" else "utilization",
            target=baseline_target if baseline_target is not None else (1.0 if policy_name == "hpa-queue" else 0.7),
            profiles=profiles,
        )
        tick_s = cfg.sync_s
        driver = HpaDriver(specs, cfg)
    elif policy_name == "windowed-max":
        from autoscaler.sim.windowed import WindowedMaxConfig

        wcfg = WindowedMaxConfig(**({"quantile": baseline_target} if baseline_target is not None else {}),
                                 tick_s=tick_s, churn_budget=getattr(policy_cfg, "churn_budget", 4))
        driver = WindowedMaxDriver(specs, wcfg, float(getattr(policy_cfg, "repartition_s", sim.repartition_delay_s)),
                                    planner)
    clock = VirtualClock(-float(warmup_s))
    cluster = SimCluster(specs, slo_ms, state, clock, sim, service_rps=service_rps,
                         service_curves=service_curves, max_batch=max_batch)
    if policy_name == "migscale":
        from autoscaler.loop import ControlLoop

        loop = ControlLoop(cluster, cluster, cluster, policy_cfg, clock, planner=planner)
        driver = loop
    elif driver is not None:
        driver.bind(cluster)
    n_warm = math.ceil(warmup_s / step_s - 1e-9)
    first = demand[:, 0]
    time_ = SimTime(cluster, n_warm + demand.shape[1], lambda k: first if k < n_warm else demand[:, k - n_warm])
    errors: list[str] = []
    ticks = 0
    if driver is not None:

        def after_tick(res: Any) -> None:  # a loop.TickResult or a baseline's drivers.TickOut
            errors.extend(f"t={res.t_s:.0f}s: {e}" for e in res.errors)

        d = Driver(driver, time_, tick_s=tick_s, slice_s=step_s, hooks=Hooks(after_tick=after_tick))
        d.run(time_.ended)
        ticks = d.ticks
        if d.tick_errors:
            errors.append(f"{d.tick_errors} tick(s) raised, the last: {d.last_error}")
    while not time_.ended():  # a policy that never acts (static peak): the world still runs
        time_.sleep(step_s)
    errors.extend(cluster.late_errors)
    res = _score(policy_name, specs, slo_ms, cluster, demand, step_s, n_warm, len(cluster.gpus),
                 time.perf_counter() - wall0, ticks, errors)
    res.measured_service = sorted(m for m in (service_rps or {}) if m in names)
    res.measured_curves = sorted(m for m in (service_curves or {}) if m in names)
    res.max_batch = {m: b for m, b in sorted((max_batch or {}).items()) if m in names}
    return res


# ------------------------------------------------------------------ time and tickers


class SimTime:
    """The driver's clock in the simulator: ``sleep(dt)`` integrates the world for ``dt``.

    Time moves in whole ``step_s`` steps of ``SimCluster.advance``, step ``k``
    at the per-model arrival rates ``rates(k)`` (``before_step(k)`` first, to
    record the world as the step begins); a sleep that ends inside a step ends
    at that step's end, so a tick is always on the step grid, at the first
    step boundary at or after its due time (ticks due at 0, 7, 14 s with 5 s
    steps run at 0, 10, 15 s). ``ended()`` once all ``steps`` have run.
    """

    def __init__(self, cluster: SimCluster, steps: int, rates: Callable[[int], np.ndarray],
                 before_step: Callable[[int], None] | None = None) -> None:
        self.cluster = cluster
        self.steps = steps
        self.rates = rates
        self.before_step = before_step
        self.k = 0
        self.target = cluster.clock.now()

    def now(self) -> float:
        return self.cluster.clock.now()

    def sleep(self, seconds: float) -> None:
        self.target += seconds
        while not self.ended() and self.cluster.clock.now() < self.target - 1e-9:
            if self.before_step is not None:
                self.before_step(self.k)
            self.cluster.advance(self.rates(self.k))
            self.k += 1

    def ended(self) -> bool:
        return self.k >= self.steps


def _static_peak_state(specs: Sequence[ModelSpec], peak: Mapping[str, float], gpus: Sequence[GpuState],
                       product: str) -> ClusterState:
    counts = bl.static_peak_counts(specs, peak, product)
    full = get_product(product).full.name
    need = sum(counts.values())
    out_gpus = list(gpus)
    # Peak provisioning buys what the peak needs: extra GPUs beyond the cluster are added (and counted).
    for i in range(max(0, need - len(out_gpus))):
        out_gpus.append(GpuState(id=f"sim-extra/{i}", node="sim-extra", product=product))
    out_gpus = [replace(g, layout=(Placement(0, full),)) for g in out_gpus]
    reps = []
    it = iter(out_gpus)
    for s in specs:
        for j in range(counts[s.name]):
            g = next(it)
            reps.append(Replica(f"{s.name}-peak-{j}", s.name, full, g.id, 0, ReplicaState.READY, 0.0))
    return ClusterState(tuple(out_gpus), tuple(reps))


# ------------------------------------------------------------------ scoring


def _oracle(specs: Sequence[ModelSpec], demand: np.ndarray, step_s: float, product: str, n_gpus: int) -> Result:
    """The oracle bound, held to the fleet's ``n_gpus`` (it misses only where the fleet is too small)."""
    per_gpu = get_product(product).compute_slices
    slices, served = bl.oracle_capped(specs, demand, product, n_gpus * per_gpu)
    n = demand.shape[1]
    tot = float(demand.sum())
    per_model = {s.name: (float(served[i].sum() / demand[i].sum()) if demand[i].sum() > 0 else 1.0)
                 for i, s in enumerate(specs)}
    with np.errstate(invalid="ignore", divide="ignore"):
        att = np.where(demand > 0, served / np.where(demand > 0, demand, 1), np.nan)
    tl = Timeline(t_s=np.arange(n) * step_s, models=tuple(s.name for s in specs), demand_rps=demand,
                  capacity_rps=served, p99_ms=np.full(demand.shape, np.nan), slo_ms=np.full(len(specs), np.nan),
                  attainment=att, gpus_in_use=slices / per_gpu, slices_in_use=slices)
    sh = float(slices.sum() * step_s / 3600.0)
    return Result("oracle", float(served.sum()) / tot if tot > 0 else 1.0, per_model, sh / per_gpu, sh, 0, 0.0,
                  math.ceil(float(slices.max()) / per_gpu - 1e-9), timeline=tl)


def _score(policy: str, specs: Sequence[ModelSpec], slo_ms: Mapping[str, float], c: SimCluster,
           demand: np.ndarray, step_s: float, n_warm: int, n_gpus: int, wall_s: float, ticks: int,
           errors: list[str]) -> Result:
    arr = c.per_step("arr")[n_warm:].T  # (models, steps)
    ok = c.per_step("ok")[n_warm:].T
    tot_arr, tot_ok = float(arr.sum()), float(ok.sum())
    per_model = {s.name: (float(ok[i].sum() / arr[i].sum()) if arr[i].sum() > 0 else 1.0)
                 for i, s in enumerate(specs)}
    gpus = np.array(c.gpus_in_use[n_warm:], dtype=float)
    slices = np.array(c.slices_in_use[n_warm:], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        att = np.where(arr > 0, ok / np.where(arr > 0, arr, 1), np.nan)
    tl = Timeline(
        t_s=np.array(c.t[n_warm:]), models=tuple(s.name for s in specs), demand_rps=demand,
        capacity_rps=np.array(c.capacity[n_warm:]).T, p99_ms=np.array(c.p99_s[n_warm:]).T * 1000.0,
        slo_ms=np.array([slo_ms[s.name] for s in specs]), attainment=att, gpus_in_use=gpus, slices_in_use=slices,
    )
    return Result(
        policy=policy,
        slo_attainment=tot_ok / tot_arr if tot_arr > 0 else 1.0,
        per_model=per_model,
        gpu_hours=float(gpus.sum() * step_s / 3600.0),
        slice_hours=float(slices.sum() * step_s / 3600.0),
        reconfigurations=c.reconfigurations,
        recovery_s=recovery_s(demand, att, step_s),
        gpus_provisioned=n_gpus,
        wall_s=wall_s,
        ticks=ticks,
        errors=errors,
        timeline=tl,
    )


def largest_spike(demand: np.ndarray, step_s: float) -> tuple[int, int] | None:
    """(model, step) of the largest rate over the model's trailing ``SPIKE_BASE_S`` mean (ratio, min 1.5x)."""
    w = max(1, int(SPIKE_BASE_S / step_s))
    best: tuple[float, int, int] | None = None
    for m in range(demand.shape[0]):
        d = demand[m]
        if len(d) <= w:
            continue
        c = np.concatenate([[0.0], np.cumsum(d)])
        base = (c[w:-1] - c[:-w - 1]) / w  # mean of the w steps before step k (k >= w)
        ratio = d[w:] / np.maximum(base, 1e-9)
        k = int(np.argmax(ratio))
        if ratio[k] >= 1.5 and (best is None or ratio[k] > best[0]):
            best = (float(ratio[k]), m, k + w)
    return None if best is None else (best[1], best[2])


def recovery_s(demand: np.ndarray, attainment: np.ndarray, step_s: float) -> float:
    spike = largest_spike(demand, step_s)
    if spike is None:
        return 0.0
    m, k0 = spike
    a = np.nan_to_num(attainment[m, k0:], nan=1.0)
    bad = a < RECOVERY_TARGET
    if not bad.any():
        return 0.0
    hold = max(1, int(RECOVERY_HOLD_S / step_s))
    for k in range(len(a)):
        if not bad[k:k + hold].any():
            return float(k * step_s)
    return float(len(a) * step_s)
