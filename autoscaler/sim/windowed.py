"""The reactive bound's own rule, run as a policy (pure: no I/O, time as ``now_s``).

Place in the loop: like the HPA baselines (``baselines.py``), this replaces the
sizing half of ``decide`` -- it reads the same ``Observation`` and asks the
production planner (``policy/planner``) for the capacity it wants, and the
simulator's driver passes the planner's actions through the loop's own
per-GPU/per-model gate (``loop.hold_in_flight``). Only the sizing rule differs
from migscale's, so a benchmark that runs both measures the rule, not packing,
make-before-break or the gate.

The rule is ``baselines.reactive_frontier``'s, with nothing known in hindsight::

    target[m] = (1 + h[m]) x max(rate[m] measured over the last window_s)

and ``h[m]`` learned online from the model's own past: the ``quantile`` of how
far the measured rate rose above the window's maximum as it stood ``lag_s``
earlier (the bound's lag: scrape plus replica start), over the last
``history_s``, clipped to [``lo``, ``hi``]; ``prior`` until ``min_samples``
ratios exist. The bound prices the same rule with each model's headroom chosen
with the whole trace known, on exact per-step rates, with fractional
slices, no start time and no queueing; running it here through the simulator
shows what those idealisations are worth on one trace
(``benchmarks/actuation.py``). ``price_offline`` prices the rule without the
simulator, as the bound does, and can add the simulator's whole replicas and
queues one at a time.

Defaults are not tuned: ``quantile``, ``history_s``, ``prior``, ``lo`` and
``hi`` are migscale's learned-headroom settings (``forecast.HeadroomConfig``),
``window_s`` and ``lag_s`` the bound's; ``min_samples`` is 30 minutes of 15 s
ticks, migscale's 30 one-minute samples.

Missing data: a model without a measured rate holds what runs (never a
scale-down on a partial picture), as migscale does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from autoscaler.policy import forecast as fc
from autoscaler.policy.capacity import current_capacity, failed_replicas
from autoscaler.policy.types import ModelSpec, Observation
from autoscaler.sim import queueing as q
from autoscaler.sim.baselines import lagged_window_max
from autoscaler.sim.records import SimConfig

_HR = fc.HeadroomConfig()


@dataclass(frozen=True)
class WindowedMaxConfig:
    quantile: float = _HR.quantile
    window_s: float = 300.0
    lag_s: float = 45.0
    history_s: float = _HR.window_s
    min_samples: int = 120
    prior: float = _HR.prior
    lo: float = _HR.lo
    hi: float = _HR.hi
    churn_budget: int | None = 4
    tick_s: float = 15.0
    replan_s: float = 60.0  # migscale's ``PolicyConfig.replan_s``

    def __post_init__(self) -> None:
        if not (0.0 < self.quantile <= 1.0):
            raise ValueError(f"quantile: must be in (0, 1], got {self.quantile!r}")
        for name in ("window_s", "history_s", "tick_s", "replan_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be > 0, got {v!r}")
        if not (math.isfinite(self.lag_s) and self.lag_s >= 0):
            raise ValueError(f"lag_s: must be >= 0, got {self.lag_s!r}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples: must be >= 1, got {self.min_samples!r}")
        if not (0.0 <= self.lo <= self.hi and math.isfinite(self.hi)):
            raise ValueError(f"lo, hi: need 0 <= lo <= hi < inf, got {self.lo!r}, {self.hi!r}")


@dataclass(frozen=True)
class ModelWindow:
    """One model's memory: rates inside the window, window maxima inside the lag, ratios."""

    rates: tuple[tuple[float, float], ...] = ()  # (t, measured req/s), the last window_s
    maxima: tuple[tuple[float, float], ...] = ()  # (t, window max then), back to lag_s ago
    ratios: tuple[tuple[float, float], ...] = ()  # (t, rate / max lag_s earlier), oldest first
    sorted_ratios: tuple[float, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class WindowedMaxState:
    models: Mapping[str, ModelWindow] = field(default_factory=dict)


def headroom(w: ModelWindow, cfg: WindowedMaxConfig) -> float:
    """The learned headroom: the ratios' ``quantile`` minus one, clipped; ``prior`` until
    there are ``min_samples`` of them."""
    s = w.sorted_ratios
    if len(s) < cfg.min_samples:
        return cfg.prior
    # the lower empirical quantile: a sample that happened, never an interpolation above it
    i = min(len(s) - 1, max(0, math.ceil(cfg.quantile * len(s)) - 1))
    return min(cfg.hi, max(cfg.lo, s[i] - 1.0))


def observe(w: ModelWindow, now_s: float, rate: float | None, cfg: WindowedMaxConfig) -> ModelWindow:
    """One tick's measurement: slide the window, record a rise ratio against the window's
    maximum as it stood ``lag_s`` ago, forget ratios older than ``history_s``."""
    rates = w.rates + (((now_s, rate),) if rate is not None else ())
    rates = tuple(x for x in rates if x[0] > now_s - cfg.window_s)
    maxima, ratios, srt = w.maxima, w.ratios, w.sorted_ratios
    # the newest maximum at least lag_s old: the capacity a rule lag_s late would hold now
    while len(maxima) > 1 and maxima[1][0] <= now_s - cfg.lag_s:
        maxima = maxima[1:]
    seen = rate is not None and maxima and maxima[0][0] <= now_s - cfg.lag_s and maxima[0][1] > 0
    new = ((now_s, rate / maxima[0][1]),) if seen else ()
    ratios, srt = fc.slide(ratios, srt, new, now_s - cfg.history_s)
    if rates:
        maxima = maxima + ((now_s, max(r for _, r in rates)),)
    return ModelWindow(rates, maxima, ratios, srt)


def targets(
    obs: Observation, state: WindowedMaxState, specs: Sequence[ModelSpec], cfg: WindowedMaxConfig, now_s: float
) -> tuple[dict[str, float], WindowedMaxState]:
    """(req/s to ask the planner for per model, next state)."""
    out: dict[str, float] = {}
    models = dict(state.models)
    for s in specs:
        sig = obs.models.get(s.name) if obs.source_ok else None
        rate = sig.request_rate if sig is not None else None
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            rate = None
        w = observe(models.get(s.name, ModelWindow()), now_s, rate, cfg)
        models[s.name] = w
        if rate is None or not w.rates:
            out[s.name] = current_capacity(s, obs.cluster)[1]  # blind: hold what runs
        else:
            out[s.name] = (1.0 + headroom(w, cfg)) * max(r for _, r in w.rates)
    return out, WindowedMaxState(models)


class LastCall(NamedTuple):
    """What the planner was last called with: when, the targets, the failed replicas then."""

    t_s: float
    targets: Mapping[str, float]
    failed: frozenset[str]


def replan(last: LastCall | None, want: Mapping[str, float], cluster,
           specs: Sequence[ModelSpec], now_s: float, cfg: WindowedMaxConfig) -> bool:
    """Call the planner this tick? As ``decide`` does: the first tick, the last call
    ``replan_s`` old, a replica failed since the last call (one it already saw is not
    news), or a model short of a target above the one the last call saw. Otherwise what
    runs stands (its actions were issued then)."""
    if last is None or now_s - last.t_s >= cfg.replan_s:
        return True
    if failed_replicas(cluster) - last.failed:
        return True
    return any(want.get(s.name, 0.0) > current_capacity(s, cluster)[1] * (1 + 1e-9)
               and want.get(s.name, 0.0) > last.targets.get(s.name, 0.0) for s in specs)


class Replicas(NamedTuple):
    """How ``price_offline`` buys capacity when not in fractional slices: whole replicas,
    per model, of ``rps`` req/s at the SLO each (its most efficient profile's
    capacity-at-SLO) costing ``slices`` compute slices each (that profile's),
    ``floor`` of them at least; with ``slo_ms`` set, each replica is
    also a queue (``queueing``: the simulator's own M/M/1 fluid model, load shared
    evenly, a queue held to ``queue_timeout_s`` of work as the simulator holds it), so
    a replica run at ``rps`` meets 99% of its requests, not all. ``queue_timeout_s``
    per model, at its SLO, is a replica that sheds what waited past it (Triton's
    queue policy with ``timeout_action: REJECT``, docs/shedding.md)."""

    rps: np.ndarray
    slices: np.ndarray
    floor: np.ndarray
    slo_ms: np.ndarray | None = None
    queue_timeout_s: float | np.ndarray = SimConfig.queue_timeout_s


def price_offline(
    demand_rps: np.ndarray,
    per_slice_rps: np.ndarray,
    step_s: float,
    slices_per_gpu: int,
    cfg: WindowedMaxConfig = WindowedMaxConfig(),
    floor_slices: np.ndarray | None = None,
    replicas: Replicas | None = None,
    react_s: float | None = None,
) -> tuple[float, float]:
    """(attainment, GPU-hours) of this rule priced as ``baselines.reactive_frontier``
    prices its own: exact per-step rates, fractional slices, no start, no queueing,
    ``lag_s`` of delay -- only the headroom is learned as the policy learns it, from
    each model's past, instead of chosen with the whole trace known.

    ``capacity[m, k] = max((1 + h[m, k]) * seen[m, k], floor)``, ``seen`` the bound's
    lagged window maximum; ``h[m, k]`` is ``headroom`` over the ratios
    ``demand[m, j] / seen[m, j]`` with ``j <= k - L`` inside ``history_s``,
    re-learned every ``tick_s``. The ratio of its GPU-hours to the bound's at the
    attainment it reaches is what hindsight is worth on the trace.

    With ``replicas``, the same capacity is bought in whole replicas (rounded up), and
    with ``replicas.slo_ms`` served through queues: two of the simulator's costs the
    bound leaves out, added one at a time, with no planner, placement or start.

    ``react_s`` (default ``lag_s``) is how late capacity follows the demand: the
    headroom is still learned against the window's maximum ``lag_s`` earlier, as the
    policy learns it, but what it multiplies, and when a new headroom applies, is
    ``react_s`` old -- the rule as it runs in a world that lets it react sooner than
    the bound's lag."""
    d = np.asarray(demand_rps, dtype=float)
    rate = np.asarray(per_slice_rps, dtype=float)
    cap = _learned_capacity(d, rate, step_s, cfg, floor_slices, cfg.lag_s if react_s is None else react_s)
    total = float(d.sum())
    if replicas is None:
        missed = float(np.maximum(d - cap, 0.0).sum())
        gpu_h = float((cap / rate[:, None]).sum()) * step_s / 3600.0 / slices_per_gpu
        return (1.0 - missed / total if total > 0 else 1.0), gpu_h
    per = np.asarray(replicas.rps, dtype=float)[:, None]
    n = np.maximum(np.ceil(cap / per - 1e-9), np.asarray(replicas.floor, dtype=float)[:, None])
    gpu_h = float((n * np.asarray(replicas.slices, dtype=float)[:, None]).sum()) * step_s / 3600.0 / slices_per_gpu
    if replicas.slo_ms is None:
        missed = float(np.maximum(d - n * per, 0.0).sum())
        return (1.0 - missed / total if total > 0 else 1.0), gpu_h
    return _queued_attainment(d, n, per[:, 0], np.asarray(replicas.slo_ms, dtype=float), step_s,
                              np.asarray(replicas.queue_timeout_s, dtype=float)), gpu_h


def _learned_capacity(d: np.ndarray, rate: np.ndarray, step_s: float, cfg: WindowedMaxConfig,
                      floor_slices: np.ndarray | None, react_s: float) -> np.ndarray:
    """``price_offline``'s capacity per model and step, in req/s."""
    if not (math.isfinite(react_s) and react_s >= 0):
        raise ValueError(f"react_s: must be >= 0, got {react_s!r}")
    n_models, n_steps = d.shape
    floor = np.zeros(n_models) if floor_slices is None else np.asarray(floor_slices, dtype=float)
    lag = math.floor(react_s / step_s + 1e-9)
    learned = lagged_window_max(d, step_s, cfg.lag_s, cfg.window_s)
    seen = learned if react_s == cfg.lag_s else lagged_window_max(d, step_s, react_s, cfg.window_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(learned > 0, d / learned, np.nan)
    hist = max(1, round(cfg.history_s / step_s))
    every = max(1, round(cfg.tick_s / step_s))
    # min_samples counts ticks in the policy; here ratios come every step
    need = cfg.min_samples * every
    h = np.full((n_models, n_steps), cfg.prior)
    for j in range(0, n_steps, every):
        a, b = j + lag, min(n_steps, j + every + lag)
        if a >= n_steps:
            break
        for i in range(n_models):
            x = ratio[i, max(0, j - hist + 1): j + 1]
            x = np.sort(x[np.isfinite(x)])
            if len(x) >= need:
                k = min(len(x) - 1, max(0, math.ceil(cfg.quantile * len(x)) - 1))
                h[i, a:b] = min(cfg.hi, max(cfg.lo, float(x[k]) - 1.0))
    return np.maximum((1.0 + h) * seen, (floor * rate)[:, None])


def _queued_attainment(d: np.ndarray, n: np.ndarray, per_rps: np.ndarray, slo_ms: np.ndarray,
                       step_s: float, timeout_s: float | np.ndarray) -> float:
    """Share of requests within the SLO when ``n[m, k]`` replicas of ``per_rps[m]`` share
    model m's demand evenly, each a fluid M/M/1 queue as in ``SimCluster``. A model's
    backlog stays with it when its replica count changes (spread over the new count);
    with no replica, a step's requests all miss; work beyond ``timeout_s`` is dropped."""
    mu = np.array([q.service_rate(c, s) for c, s in zip(per_rps, slo_ms, strict=True)])
    slo_s = slo_ms / 1000.0
    backlog = np.zeros(d.shape[0])  # requests in system, per model
    ok = 0.0
    for k in range(d.shape[1]):
        nk = n[:, k]
        live = nk > 0
        x0 = np.where(live, backlog / np.maximum(nk, 1.0), 0.0)
        lam = np.where(live, d[:, k] / np.maximum(nk, 1.0), 0.0)
        _, x1, within = q.step(x0, lam, mu, step_s, slo_s, timeout_s)
        ok += float((d[:, k] * step_s * within)[live].sum())
        backlog = np.where(live, x1 * nk, backlog)
    total = float(d.sum()) * step_s
    return ok / total if total > 0 else 1.0
