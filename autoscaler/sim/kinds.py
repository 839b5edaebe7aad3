"""Single-model demand kinds: the seeded series a trace's rows come from.

``sim/traces.py`` asks these for one model's rates (``generate`` with kind
``diurnal``, ``bursty``, ``flash`` or ``azure``), and the fleet families in
``sim/families.py`` build on the same helpers (diurnal factor, Poisson counts,
Gamma noise, normalisation to a mean). Every function is pure: a
``numpy.random.Generator`` in, an array of req/s per step out.

- ``diurnal``: a daily sine around the mean (trough 25% of the peak) with
  Poisson per-step counts.
- ``bursty``: burst onsets arrive with Gamma inter-arrival times (shape
  1/cv^2; mean 10 min); each burst holds a Gamma-distributed rate level (mean
  1, CV ``cv`` = 1), reached through a 2-minute lag -- the BurstGPT shape
  (docs/traces.md). Peaks reach 3-5x the mean.
- ``flash``: a steady base rate; at a random moment the rate ramps to
  ``flash_x`` times the base in 30 s, holds 10 minutes, then decays.
- ``azure``: an Azure-Functions-2019-like mix (docs/traces.md): per-minute counts,
  a diurnal and a weekly cycle, lognormal popularity across models (sigma 2.5:
  12 models span ~4 orders of magnitude, the 8 of the paper is over 10^5
  functions), and Gamma-Poisson minute counts (Gamma CV 0.3) -- over-dispersed
  like the paper's inter-arrival CV > 1. In ``mixed`` the popularity skew is
  left out: the benchmark sets each model's mean itself.
"""

from __future__ import annotations

import math

import numpy as np

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


def poisson_rate(rng: np.random.Generator, rate: np.ndarray, step_s: float) -> np.ndarray:
    """Observed rate of a Poisson count per step: what a per-minute trace records."""
    return rng.poisson(np.maximum(rate, 0.0) * step_s) / step_s


def diurnal_factor(t: np.ndarray, phase_s: float, trough: float = 0.25) -> np.ndarray:
    # peak at 14:00 + phase, trough at 02:00 + phase; mean of the factor is 1
    wave = 0.5 - 0.5 * np.cos(2 * np.pi * (t - phase_s - 2 * 3600) / DAY_S)
    f = trough + (1 - trough) * wave
    return f / ((1 + trough) / 2)


def diurnal(rng: np.random.Generator, t: np.ndarray, mean: float, step_s: float) -> np.ndarray:
    phase = rng.uniform(-2, 2) * 3600
    return poisson_rate(rng, mean * diurnal_factor(t, phase), step_s)


def gamma_interarrivals(rng: np.random.Generator, mean_s: float, cv: float, n: int) -> np.ndarray:
    """``n`` Gamma inter-arrival times with the given mean and coefficient of variation (shape 1/cv^2)."""
    k = 1.0 / (cv * cv)
    return rng.gamma(k, mean_s / k, size=n)


def bursty(
    rng: np.random.Generator, t: np.ndarray, mean: float, step_s: float, cv: float = 1.0,
    burst_s: float = 600.0, rise_s: float = 120.0,
) -> np.ndarray:
    """Gamma-modulated rate: burst onsets with Gamma inter-arrivals (CV ``cv``), Gamma levels (mean 1).

    Levels change through a first-order lag of ``rise_s`` (a burst builds over
    a couple of minutes, as user traffic does); ``rise_s=0`` makes them jump.
    """
    end = float(t[-1] + step_s)
    n = int(end / burst_s * 4) + 16
    onsets = np.cumsum(gamma_interarrivals(rng, burst_s, cv, n))
    while onsets[-1] < end:  # rare: extend until the trace is covered
        onsets = np.append(onsets, onsets[-1] + np.cumsum(gamma_interarrivals(rng, burst_s, cv, n)))
    onsets = np.concatenate([[0.0], onsets])
    k = 1.0 / (cv * cv)
    levels = rng.gamma(k, 1.0 / k, size=len(onsets))
    idx = np.searchsorted(onsets, t, side="right") - 1
    level = levels[idx]
    if rise_s > 0:
        a = 1.0 - math.exp(-step_s / rise_s)
        smooth = np.empty_like(level)
        acc = float(level[0])
        for k, v in enumerate(level):  # sequential by nature; one pass over the steps
            acc += a * (v - acc)
            smooth[k] = acc
        level = smooth
    # mild diurnal underneath so bursts ride on a realistic base
    return poisson_rate(rng, mean * level * diurnal_factor(t, 0.0, trough=0.6), step_s)


def flash(
    rng: np.random.Generator, t: np.ndarray, mean: float, step_s: float, flash_x: float = 5.0,
    ramp_s: float = 30.0, hold_s: float = 600.0, decay_s: float = 600.0,
) -> np.ndarray:
    end = float(t[-1] + step_s)
    t0 = rng.uniform(0.2, 0.6) * end
    x = np.ones_like(t)
    up = (t >= t0) & (t < t0 + ramp_s)
    x[up] = 1 + (flash_x - 1) * (t[up] - t0 + step_s) / (ramp_s + step_s)
    hold = (t >= t0 + ramp_s) & (t < t0 + ramp_s + hold_s)
    x[hold] = flash_x
    after = t >= t0 + ramp_s + hold_s
    x[after] = 1 + (flash_x - 1) * np.exp(-(t[after] - t0 - ramp_s - hold_s) / decay_s)
    return poisson_rate(rng, mean * x * diurnal_factor(t, 0.0, trough=0.7), step_s)


def azure(rng: np.random.Generator, t: np.ndarray, mean: float, step_s: float, dispersion: float = 0.3) -> np.ndarray:
    """One Azure-Functions-like series: diurnal x weekly cycle, Gamma-Poisson per-step counts.

    The Gamma factor (CV ``dispersion``, renewed every step) makes counts
    over-dispersed, the signature of inter-arrival CV > 1 in the 2019 trace.
    """
    phase = rng.uniform(-3, 3) * 3600
    day = diurnal_factor(t, phase, trough=0.3)
    dow = np.floor(t / DAY_S) % 7
    week = np.where(dow >= 5, 0.7, 1.0)  # days 5 and 6 are the weekend
    week = week / (5 + 2 * 0.7) * 7
    k = 1.0 / (dispersion * dispersion)
    noise = rng.gamma(k, 1.0 / k, size=len(t))
    return poisson_rate(rng, mean * day * week * noise, step_s)


def azure_popularity(rng: np.random.Generator, n: int, sigma: float = 2.5) -> np.ndarray:
    """Heavy-tailed (lognormal) popularity weights summing to n, largest first."""
    w = np.sort(rng.lognormal(0.0, sigma, size=n))[::-1]
    return w / w.sum() * n


def normalised(f: np.ndarray, mean: float) -> np.ndarray:
    """Scale a shape ``f >= 0`` so that its time mean is ``mean``."""
    m = float(f.mean())
    return f * (mean / m) if m > 0 else np.zeros_like(f)


def gamma_noise(rng: np.random.Generator, n: int, cv: float) -> np.ndarray:
    k = 1.0 / (cv * cv)
    return rng.gamma(k, 1.0 / k, size=n)
