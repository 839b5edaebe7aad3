"""The simulator's latency model: one replica as a fluid M/M/1 queue (PSFFA).

Place in the loop: this is what the *world* does between two control ticks --
requests arrive at a replica, queue, and finish -- so the simulated metrics
source has something true to report. No policy code lives here.

Model. A replica of model m on profile p is an M/M/1 server whose service
rate is derived from the capacity table: capacity-at-SLO ``C`` is the arrival
rate at which the replica's p99 sojourn time equals the SLO. M/M/1 sojourn
times are exponential with rate ``mu - lambda``, so p99 = ln(100)/(mu - C) =
SLO gives::

    mu = C + ln(100) / SLO_s          # e.g. C = 300 req/s, SLO 50 ms -> mu = 392 req/s

Batching is inside ``C``: the capacity table is measured with Triton's dynamic
batcher on, so the service rate it implies is the batched one. Exponential
service is the conservative choice (deterministic service, M/D/1, has a
thinner tail), so the simulator errs toward reporting SLO misses.

Time variation uses the pointwise stationary fluid flow approximation
(PSFFA, Wang et al. 1996): the state is the mean number in system ``x``, and
``dx/dt = lambda - mu * x / (1 + x)`` -- the stationary M/M/1 relation
``rho = x/(1+x)`` used as the departure rate. It passes smoothly through
overload: above ``mu`` the queue grows by ``(lambda - mu)`` per second, and
drains afterwards at ``mu - lambda``. An arrival that finds ``x`` in the
system waits a geometric number of exponential services, so its sojourn time
is exponential with rate ``mu / (1 + x)``; the share within the SLO is::

    within(x) = 1 - exp(-mu * SLO_s / (1 + x))    # stationary: 1 - exp(-(mu - lambda) * SLO_s)

At ``lambda = C`` that is exactly 0.99: a replica run at its capacity-at-SLO
meets a p99 target and no better. The integration step is implicit Euler
(L-stable, exact at equilibrium), so a 5 s step stays stable for mu = 1000/s.
``tests/unit/test_sim.py`` validates all of this against a per-request
discrete-event simulation of the same replica (steady state and an overload
transient).

A replica ``migscale profile`` measured under Poisson arrivals gets more than one
number: ``ServiceCurve`` carries its measured p99 at each rate into the same fluid
model, as a service rate that depends on how much the replica holds. A dynamic
batcher serves faster the longer its queue (bigger batches), so one rate cannot
hold both its light-load and its heavy-load p99.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammainc, gammaincinv

LN100 = math.log(100.0)


def service_rate(capacity_rps: float, slo_ms: float) -> float:
    """The M/M/1 service rate whose p99 sojourn equals the SLO at ``capacity_rps`` arrivals."""
    if capacity_rps < 0 or slo_ms <= 0:
        raise ValueError(f"capacity_rps must be >= 0 and slo_ms > 0, got {capacity_rps}, {slo_ms}")
    return capacity_rps + LN100 / (slo_ms / 1000.0)


def profiled_service_rate(saturation_rps: float | None, poisson_capacity_rps: float | None = None,
                          slo_ms: float | None = None) -> float | None:
    """The world's service rate for a replica ``migscale profile`` measured.

    With a capacity-at-SLO under Poisson arrivals, the M/M/1 that meets the SLO exactly
    there (``service_rate``): the calibration every capacity table gets, from the arrivals
    this queue models. Else the saturation throughput: a closed-loop sweep's capacity is
    no Poisson capacity (on the emulated resnet's 1g slice, 64.5 req/s closed-loop against
    40.3 under Poisson, docs/profile-throughput.md), and the saturation reading, 81 req/s,
    is the nearer of the two to the Poisson calibration's 71. None: nothing measured."""
    if poisson_capacity_rps is not None and slo_ms is not None:
        return service_rate(poisson_capacity_rps, slo_ms)
    return saturation_rps


@dataclass(frozen=True)
class ServiceCurve:
    """A replica's service rate as a function of its occupancy, from measured Poisson points.

    At each measured rate ``lam`` with p99 ``p`` the stationary M/M/1 that matches is
    ``mu = lam + ln(100)/p``, and it holds ``x = lam * p / ln(100)`` (``lam / (mu - lam)``).
    Between points the rate is interpolated in ``x``; below the first it stays at the
    first, above the last at the last. The rate never falls with ``x`` (a batcher's
    throughput does not fall as its batch grows), and the departure rate ``mu x/(1+x)``
    never exceeds ``saturation_rps``, the most the replica was measured to complete (the
    closed-loop saturation, or a higher Poisson rate it kept up with).
    Each measured point is then a stationary state of the fluid model with exactly the
    measured p99.

    ``shape``: the sojourn law around that p99. M/M/1's is exponential (shape 1: p99 =
    6.6 x the median), but a batcher's sojourn is mostly a wait for whole batches and
    far less spread. Where the points carry their median, the sojourn is a gamma law of
    the shape whose p99/p50 ratio is the points' median ratio, scaled so its p99 stays the
    fluid model's (``within_slo``); without medians it stays exponential, the
    conservative law.

    Worked numbers (the emulated resnet on a 1g slice, max batch 8): 40.4 req/s at p99
    147 ms gives mu = 71.7, x = 1.29; 60.6 req/s at 198 ms gives mu = 83.8, x = 2.61.
    A single rate calibrated at 40.4 (71.7) puts 60.6 req/s at p99 414 ms."""

    x: tuple[float, ...]
    mu: tuple[float, ...]
    saturation_rps: float | None = None
    shape: float = 1.0

    @classmethod
    def from_poisson(cls, points: Sequence[tuple[float, float, float | None]],
                     saturation_rps: float | None = None,
                     slo_p99_ms: float | None = None) -> ServiceCurve | None:
        """From ``(offered_rps, p99_ms, p50_ms or None)`` of error-free Poisson points; None: no
        usable point.

        A point whose p99 is over twice ``slo_p99_ms`` is left out: that is where the
        profiler's sweep stops because further load only queues, and a queue that keeps
        growing through a few seconds' measurement reports no stationary state (its p99
        depends on how long the point ran)."""
        by_x: dict[float, float] = {}
        ratios: list[float] = []
        top = 0.0
        for lam, p99_ms, p50_ms in points:
            if slo_p99_ms is not None and p99_ms > 2.0 * slo_p99_ms:
                continue
            if lam > 0 and 0 < p99_ms < math.inf:
                top = max(top, lam)
                p = p99_ms / 1000.0
                x = lam * p / LN100
                by_x[x] = max(by_x.get(x, 0.0), lam + LN100 / p)
                if p50_ms is not None and 0 < p50_ms <= p99_ms:
                    ratios.append(p99_ms / p50_ms)
        if not by_x:
            return None
        xs = sorted(by_x)
        mus = np.maximum.accumulate([by_x[x] for x in xs])
        shape = gamma_shape(float(np.median(ratios))) if ratios else 1.0
        if saturation_rps is not None:  # a rate it kept up with is one it completes
            saturation_rps = max(saturation_rps, top)
        return cls(tuple(xs), tuple(float(m) for m in mus), saturation_rps, shape)

    def scaled(self, factor: float) -> ServiceCurve:
        """The same replica on a slice ``factor`` times as fast: rates scale, occupancies and
        the sojourn's shape do not."""
        sat = None if self.saturation_rps is None else self.saturation_rps * factor
        return ServiceCurve(self.x, tuple(m * factor for m in self.mu), sat, self.shape)

    def rate(self, x: np.ndarray) -> np.ndarray:
        mu = np.interp(x, self.x, self.mu)
        if self.saturation_rps is not None:
            mu = np.minimum(mu, self.saturation_rps * (1.0 + x) / np.maximum(x, 1e-12))
        return mu


MAX_SHAPE = 100.0  # p99/p50 = 1.26: a sojourn nearly fixed; beyond, the ratio barely moves


def gamma_shape(p99_over_p50: float) -> float:
    """The gamma shape whose p99/p50 ratio is ``p99_over_p50``: 1 (exponential) at 6.64 or more,
    8 at 2.09, ``MAX_SHAPE`` at 1.26 or less. The ratio falls as the shape grows."""
    def ratio(k: float) -> float:
        return float(gammaincinv(k, 0.99) / gammaincinv(k, 0.5))

    if p99_over_p50 >= ratio(1.0):
        return 1.0
    if p99_over_p50 <= ratio(MAX_SHAPE):
        return MAX_SHAPE
    lo, hi = 1.0, MAX_SHAPE
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ratio(mid) > p99_over_p50 else (lo, mid)
    return math.sqrt(lo * hi)


def curve_shapes(curves: Sequence[ServiceCurve | None]) -> np.ndarray | None:
    """Per replica, its sojourn law's shape; None when every replica's is exponential."""
    if all(c is None or c.shape == 1.0 for c in curves):
        return None
    return np.array([1.0 if c is None else c.shape for c in curves])


def curve_rates(curves: Sequence[ServiceCurve | None], mu: np.ndarray, x0: np.ndarray,
                lam: np.ndarray, dt: float) -> np.ndarray:
    """Per replica, the rate its queue serves at over a step from ``x0``: ``mu`` where it has
    no curve, else its curve's rate at the occupancy one step at the rate of ``x0`` reaches.
    The implicit step takes its departures at the step's end, so the rate is read there too:
    a queue that grows within the step is served at its batched rate, and never faster than
    its saturation."""
    idx = [i for i, c in enumerate(curves) if c is not None]
    if not idx:
        return mu
    out = np.array(mu, dtype=float)
    for i in idx:
        c = curves[i]
        assert c is not None
        xi, li = x0[i:i + 1], lam[i:i + 1]
        pred = step_x(xi, li, c.rate(xi), dt)
        out[i] = float(c.rate(pred)[0])
    return out


def step_x(x: np.ndarray, lam: np.ndarray, mu: np.ndarray, dt: float) -> np.ndarray:
    """Mean number in system after ``dt`` seconds at arrival rate ``lam`` (implicit Euler on PSFFA).

    Solves ``x' = x + dt*(lam - mu*x'/(1+x'))`` for its positive root.
    """
    c = x + dt * lam
    b = 1.0 - c + dt * mu
    return 0.5 * (-b + np.sqrt(b * b + 4.0 * c))


def step(x0: np.ndarray, lam: np.ndarray, mu: np.ndarray, dt: float, slo_s: np.ndarray | float,
         max_wait_s: np.ndarray | float, shape: np.ndarray | None = None,
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of a replica's queue: (``x`` unbounded, ``x`` after dropping work beyond
    ``max_wait_s`` of service, share of this step's arrivals within ``slo_s``). The share is
    taken at the step's mean occupancy. One definition for the simulator and for the
    offline pricing that must agree with it."""
    x_raw = step_x(x0, lam, mu, dt)
    x1 = np.minimum(x_raw, mu * max_wait_s)
    return x_raw, x1, within_slo(0.5 * (x0 + x1), mu, slo_s, shape)


def stationary_x(lam: float, mu: float) -> float:
    return math.inf if lam >= mu else lam / (mu - lam)


def within_slo(x: np.ndarray, mu: np.ndarray, slo_s: np.ndarray | float,
               shape: np.ndarray | None = None) -> np.ndarray:
    """Share of arrivals whose sojourn is within ``slo_s`` when the replica holds ``x`` on average.

    Exponential (M/M/1) when ``shape`` is None; else the gamma law of that shape with the
    same p99 (``sojourn_scale``)."""
    if shape is None:
        return 1.0 - np.exp(-mu * slo_s / (1.0 + x))
    return gammainc(shape, slo_s / sojourn_scale(x, mu, shape))


def sojourn_scale(x: np.ndarray, mu: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
    """The scale of the sojourn's gamma law for an arrival finding ``x``: the M/M/1 mean
    ``(1+x)/mu`` at shape 1; at any shape, the scale whose p99 is M/M/1's p99."""
    if shape is None:
        return (1.0 + x) / mu
    return LN100 * (1.0 + x) / (mu * gammaincinv(shape, 0.99))


def quantile_s(x: np.ndarray, mu: np.ndarray, q: float, shape: np.ndarray | None = None) -> np.ndarray:
    """Sojourn-time quantile (seconds) for an arrival finding ``x`` in the system."""
    if shape is None:
        return -math.log(1.0 - q) * (1.0 + x) / mu
    return gammaincinv(shape, q) * sojourn_scale(x, mu, shape)


NEWTON_STEPS = 12  # mixes spanning six decades: 1e-13 relative at 12 steps, 1% at 8 (test_sim.py)


def mixture_quantiles(q: float | np.ndarray, values: np.ndarray, weights: np.ndarray,
                      of: float | None = None) -> np.ndarray:
    """Per row, the ``q`` quantile of a mixture of exponential distributions: the j-th
    has its ``of`` quantile (default: ``q``) at ``values[i, j]`` and weight
    ``weights[i, j]`` (0: padding). ``q`` is one level or one per row. What a summary
    over a window reports when each moment of it served its own exponential sojourns:
    one slow moment holds the tail of the whole window (worked number: 11 parts at a
    20 ms p99 and 1 part at 500 ms give a p99 of 230 ms, not their mean's 60 ms).

    Every row at once. The log of the mixture's tail is convex and falls with x, so
    Newton's method from the smallest component quantile (where the tail is still at
    least ``1 - q``) climbs to the root without passing it, in a few steps; a row with
    no weight is nan."""
    rows = values.shape[0]
    out = np.full(rows, np.nan)
    live = (weights > 0).any(axis=1)
    if not live.any():
        return out
    qs = np.broadcast_to(np.asarray(q, dtype=float), (rows,))[live]
    values, weights = values[live], weights[live]
    used = weights > 0
    own = -np.log1p(-qs)
    level = own if of is None else np.full(len(qs), -math.log1p(-of))
    rate = level[:, None] / np.where(used, values, 1.0)  # each component's: its ``of`` quantile at ``values``
    x = np.where(used, values, np.inf).min(axis=1) * (own / level)
    logw = np.log(np.where(used, weights, 1.0))
    target = np.log1p(-qs) + np.log(weights.sum(axis=1))
    for _ in range(NEWTON_STEPS):
        e = np.where(used, logw - rate * x[:, None], -np.inf)
        top = e.max(axis=1, keepdims=True)
        p = np.exp(e - top)
        tail = p.sum(axis=1)
        slope = (p * rate).sum(axis=1) / tail  # minus the derivative of the tail's log
        x = x + np.maximum(np.log(tail) + top[:, 0] - target, 0.0) / slope
    out[live] = x
    return out


def busy(x: np.ndarray) -> np.ndarray:
    """Busy fraction (utilisation): rho = x/(1+x), -> 1 in overload."""
    return x / (1.0 + x)


def mean_batch(x: np.ndarray, max_batch: np.ndarray | float) -> np.ndarray:
    """Mean batch a dynamic batcher runs when the replica holds ``x``: the queue it finds
    on freeing up (``x`` less the busy share in service), between 1 and ``max_batch``.

    Worked number: at 70 req/s on a replica serving 81 req/s, x = 70 / 11 = 6.4, of
    which 5.5 wait -> batches of 5.5 requests, each reporting 5.5 / 81 s = 68 ms of
    compute (the emulated resnet's batch of 5.5 takes 31.4 + 4.5 x 9.5 = 74 ms)."""
    return np.clip(x - busy(x), 1.0, max_batch)


# ------------------------------------------------------------------ reference


def des_mm1_sojourns(
    arrival_rps: np.ndarray, step_s: float, mu: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per-request FCFS M/M/1 simulation (Lindley recursion): (arrival times, sojourn times).

    ``arrival_rps[k]`` is the Poisson rate during ``[k*step_s, (k+1)*step_s)``.
    This is the reference the fluid model is checked against.
    """
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    for k, lam in enumerate(arrival_rps):
        n = rng.poisson(lam * step_s)
        times.append(np.sort(rng.uniform(k * step_s, (k + 1) * step_s, size=n)))
    arr = np.concatenate(times) if times else np.zeros(0)
    svc = rng.exponential(1.0 / mu, size=len(arr))
    soj = np.empty(len(arr))
    free_at = 0.0
    for i in range(len(arr)):  # the recursion is sequential by nature
        start = max(free_at, arr[i])
        free_at = start + svc[i]
        soj[i] = free_at - arr[i]
    return arr, soj


def des_mm1(
    arrival_rps: np.ndarray, step_s: float, mu: float, slo_s: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``des_mm1_sojourns`` binned per step: (arrivals, arrivals within ``slo_s``)."""
    arr, soj = des_mm1_sojourns(arrival_rps, step_s, mu, seed)
    bins = (arr // step_s).astype(int)
    n_steps = len(arrival_rps)
    total = np.bincount(bins, minlength=n_steps)[:n_steps]
    ok = np.bincount(bins, weights=(soj <= slo_s).astype(float), minlength=n_steps)[:n_steps]
    return total.astype(float), ok


def fluid_mm1(arrival_rps: np.ndarray, step_s: float, mu: float, slo_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The fluid model on the same input as ``des_mm1``: per-step (expected arrivals, expected within SLO)."""
    x = np.zeros(1)
    total = np.empty(len(arrival_rps))
    ok = np.empty(len(arrival_rps))
    mu_a = np.array([mu])
    for k, lam in enumerate(arrival_rps):
        _, x, within = step(x, np.array([lam]), mu_a, step_s, slo_s, math.inf)
        total[k] = lam * step_s
        ok[k] = total[k] * float(within[0])
    return total, ok
