"""The burst layer: capacity above the predictive floor within seconds (pure).

Place in the loop: beside the forecaster in ``decide``. The floor follows a
smoothed forecast and learns its headroom over hours; a flash crowd, a step,
or a model coming back from silence outruns both. This layer reads the fastest
signals there are -- Triton's queue and completions scraped straight from the
replicas every 1-2 s (``ModelSignals.fast``) -- and asks for what is arriving
*now*, plus the backlog, as soon as it exceeds the floor. It never feeds the
forecaster with anything but measured arrivals (a guess made while saturated
would ratchet the floor up), and it holds nothing itself: once arrivals fall
back, only the scale-down stabilization keeps its capacity for a while.

Worked number: a model with 200 req/s of capacity whose replicas completed
210 req/s over the last 5 s while their queue grew by 400 requests is getting
210 + 400 / 5 = 290 req/s; with 20 requests still queued and a 10 s drain
that is 292 req/s, and with an 18% headroom the layer asks for 345 req/s --
about 30 s before the 30 s metrics window and its 15 s scrape delay would
have shown the rise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autoscaler.policy.types import FastSignals


@dataclass(frozen=True)
class BurstConfig:
    stale_s: float = 10.0  # fast signals older than this are not used
    backlog_drain_s: float = 10.0  # queued requests are to be served within this
    # Closed-loop clients (each waits for its answer: locust users, RPC callers)
    # keep the backlog in the clients, so arrivals never exceed completions; a
    # queue time above this multiple of compute time means more is wanted.
    saturated_queue_compute: float = 1.0
    saturated_share: float = 1.0
    max_pressure: float = 4.0


def fresh(fast: FastSignals | None, now_s: float, cfg: BurstConfig = BurstConfig()) -> FastSignals | None:
    if fast is None or fast.t_s is None or now_s - fast.t_s > cfg.stale_s:
        return None
    return fast


def arrivals(fast: FastSignals | None, now_s: float, cfg: BurstConfig = BurstConfig()) -> float | None:
    """The measured arrival rate from the fast signals (None: none fresh). A measurement,
    not a guess: this is what may feed the forecaster."""
    f = fresh(fast, now_s, cfg)
    if f is None or f.arrival_rps is None or not math.isfinite(f.arrival_rps):
        return None
    return max(0.0, f.arrival_rps)


def demand(fast: FastSignals | None, now_s: float, capacity_rps: float | None,
           cfg: BurstConfig = BurstConfig()) -> float | None:
    """What the burst layer sizes for: arrivals, or completions scaled by queue pressure
    for closed-loop clients (whichever is larger), plus the backlog over the drain time.

    Pressure applies only when the replicas complete at least ``saturated_share``
    of what runs (``capacity_rps``, at the SLO) and nothing piles up or fails. Below
    that a long queue is ordinary load: one queue at 89% load waits 8x its
    service time (rho / (1 - rho)), which is where an M/M/1 replica meets a 99%
    SLO. And an open-loop crowd shows in the arrivals themselves, while its 30 s
    queue (ratio 1500 behind 20 ms of compute) would read as the 4x cap however
    small the real excess."""
    lam = arrivals(fast, now_s, cfg)
    if lam is None:
        return None
    assert fast is not None
    q, c, done = fast.avg_queue_ms, fast.avg_compute_ms, fast.completed_rps
    saturated = capacity_rps is not None and capacity_rps > 0 and done is not None \
        and done >= cfg.saturated_share * capacity_rps
    if saturated and q is not None and c is not None and c > 0 and lam <= 1.1 * done:
        ratio = q / c
        if math.isfinite(ratio) and ratio > cfg.saturated_queue_compute:
            # (1 + ratio) / 2: queue 3x compute -> about twice the capacity is wanted
            pressure = min(cfg.max_pressure, (1.0 + ratio) / (1.0 + cfg.saturated_queue_compute))
            lam = max(lam, done * pressure)
    if fast.pending is not None and fast.pending > 0 and cfg.backlog_drain_s > 0:
        lam += fast.pending / cfg.backlog_drain_s
    return lam


def outruns(fast: FastSignals | None, now_s: float, capacity_rps: float | None,
            cfg: BurstConfig = BurstConfig()) -> bool:
    """Whether what the burst layer would size for exceeds the capacity serving now.

    The run loop asks this between ticks (from the 1 s scrape) to tick at once
    when a model starts to outrun its replicas, instead of waiting out the
    cadence. No capacity figure or no fresh signal: False (nothing is known to
    be short, so nothing is hurried)."""
    if capacity_rps is None or capacity_rps <= 0:
        return False
    want = demand(fast, now_s, capacity_rps, cfg)
    return want is not None and want > capacity_rps


class WakeOnBurst:
    """The run loop's wake rule between ticks (pure: times are passed in).

    ``began`` is asked after each 1 s scrape with the models that outrun their
    ready replicas now. It is True when a model starts to outrun them, and again
    while one keeps outrunning them once half a tick has passed since the last
    tick. The tick a burst's first second wakes reads the fast signals afresh and
    can find them just under the capacity; without the second rule the burst would
    then wait out the whole cadence (``make demo``: a replica 11.1 s after the rise
    instead of about 6). Half a tick bounds what a long burst costs: at most twice
    the tick rate, never a tick a second.
    """

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._outrun: frozenset[str] = frozenset()  # models short at the last check
        self._last_tick_at: float | None = None

    def ticked(self, now_s: float) -> None:
        """A tick began at ``now_s``."""
        self._last_tick_at = now_s

    def began(self, short: set[str] | frozenset[str], now_s: float) -> bool:
        began = bool(set(short) - self._outrun)
        if not began and short and self._last_tick_at is not None:
            began = now_s - self._last_tick_at >= 0.5 * self.tick_s
        self._outrun = frozenset(short)
        return began


def outrun_models(fast: Mapping[str, FastSignals], now_s: float, capacity: Mapping[str, float],
                  cfg: BurstConfig = BurstConfig()) -> set[str]:
    """The models whose burst demand exceeds what their ready replicas serve (``capacity``)."""
    return {m for m, f in fast.items() if outruns(f, now_s, capacity.get(m), cfg)}
