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
"""

from __future__ import annotations

import math

import numpy as np

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


def step_x(x: np.ndarray, lam: np.ndarray, mu: np.ndarray, dt: float) -> np.ndarray:
    """Mean number in system after ``dt`` seconds at arrival rate ``lam`` (implicit Euler on PSFFA).

    Solves ``x' = x + dt*(lam - mu*x'/(1+x'))`` for its positive root.
    """
    c = x + dt * lam
    b = 1.0 - c + dt * mu
    return 0.5 * (-b + np.sqrt(b * b + 4.0 * c))


def step(x0: np.ndarray, lam: np.ndarray, mu: np.ndarray, dt: float, slo_s: np.ndarray | float,
         max_wait_s: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of a replica's queue: (``x`` unbounded, ``x`` after dropping work beyond
    ``max_wait_s`` of service, share of this step's arrivals within ``slo_s``). The share is
    taken at the step's mean occupancy. One definition for the simulator and for the
    offline pricing that must agree with it."""
    x_raw = step_x(x0, lam, mu, dt)
    x1 = np.minimum(x_raw, mu * max_wait_s)
    return x_raw, x1, within_slo(0.5 * (x0 + x1), mu, slo_s)


def stationary_x(lam: float, mu: float) -> float:
    return math.inf if lam >= mu else lam / (mu - lam)


def within_slo(x: np.ndarray, mu: np.ndarray, slo_s: np.ndarray | float) -> np.ndarray:
    """Share of arrivals whose sojourn is within ``slo_s`` when the replica holds ``x`` on average."""
    return 1.0 - np.exp(-mu * slo_s / (1.0 + x))


def quantile_s(x: np.ndarray, mu: np.ndarray, q: float) -> np.ndarray:
    """Sojourn-time quantile (seconds) for an arrival finding ``x`` in the system."""
    return -math.log(1.0 - q) * (1.0 + x) / mu


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
