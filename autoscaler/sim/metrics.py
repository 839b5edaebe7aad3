"""``SimMetrics``: the MetricsSource side of ``SimCluster`` (what the loop reads).

Place in the loop: the simulator's Prometheus. ``read(now)`` reports window
averages over ``[now - scrape_delay_s - metrics_window_s, now - scrape_delay_s]``
from the per-step history ``SimCluster.advance`` records: what a Prometheus
``rate(...[30s])`` evaluated on 15 s-old samples would say. Each model's
signals also carry ``fast``: the last step as a 1-2 s direct scrape of the
replicas sees it (``SimConfig.fast_window_s``; None turns it off;
``fast_gap_s``: rounds further apart, as a large fleet's are). The latency
quantiles cover ``latency_window_s`` (Triton's summaries: about a minute) ending at
the same scrape, and are the quantiles of every request served in it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from autoscaler.policy.types import FastSignals, ModelSignals, ReplicaSignals
from autoscaler.sim import queueing as q

LATENCY_LEVELS = np.array([0.5, 0.95, 0.99])  # the quantiles Triton's summaries report


class SimMetrics:
    """Mixed into ``SimCluster``; uses its ``t``, ``config``, ``_cum``, ``midx``,
    ``pending``, ``ready_count`` and ``_reps``."""

    # ------------------------------------------------------------ MetricsSource

    def _window(self, now_s: float, delay_s: float | None = None, window_s: float | None = None
                ) -> tuple[int, int, float] | None:
        """History steps [k0, k1) inside the window of ``window_s`` (the scrape window)
        ending ``delay_s`` (the scrape delay) ago."""
        if not self.t:
            return None
        delay = self.config.scrape_delay_s if delay_s is None else delay_s
        width = self.config.metrics_window_s if window_s is None else window_s
        t0, step = self.t[0], self.config.step_s
        end = now_s - delay
        k1 = min(math.floor((end - t0) / step + 1e-9), len(self.t))
        k0 = max(math.ceil((end - width - t0) / step - 1e-9), 0)
        if k1 <= k0:
            return None
        return k0, k1, t0 + k1 * step

    def _fast(self, now_s: float) -> list[FastSignals | None] | None:
        """Per model, the burst layer's signals: what a 1-2 s direct scrape of the replicas
        shows over the last ``fast_window_s``. Arrivals are inferred as a scraper must:
        completions + failures + the growth of the queue (no arrival counter exists). A model
        with no READY replica in the window has nothing to scrape: None."""
        cfg = self.config
        if cfg.fast_window_s is None:
            return None
        delay, width = cfg.fast_delay_s, cfg.fast_window_s
        if cfg.fast_gap_s is not None and cfg.fast_gap_s > cfg.step_s and self.t:
            # rounds every gap from the start: the rates between the last two, as old as the last
            gap = cfg.fast_gap_s
            last_round = self.t[0] + math.floor((now_s - delay - self.t[0]) / gap + 1e-9) * gap
            delay, width = now_s - last_round, max(width, gap)
        w = self._window(now_s, delay, width)
        if w is None:
            return None
        k0, k1, t_end = w
        span = (k1 - k0) * cfg.step_s
        c = self._cum
        done = c["done"][k1] - c["done"][k0]
        fail = c["fail"][k1] - c["fail"][k0]
        drop = c["drop"][k1] - c["drop"][k0]
        wait = c["wait"][k1] - c["wait"][k0]
        comp = c["comp"][k1] - c["comp"][k0]
        arr = c["arr"][k1] - c["arr"][k0]
        p1 = self.pending[k1 - 1]
        p0 = self.pending[k0 - 1] if k0 > 0 else p1 * 0.0
        seen = self._scraped(k0, k1)
        out: list[FastSignals | None] = []
        for i in range(len(self.models)):
            if not seen[i]:
                out.append(None)
                continue
            served = arr[i] - fail[i]
            out.append(FastSignals(
                t_s=t_end, window_s=span,
                arrival_rps=max(0.0, float((done[i] + drop[i] + (p1[i] - p0[i])) / span)),
                completed_rps=float(done[i] / span),
                pending=float(p1[i]),
                avg_queue_ms=float(wait[i] / served * 1000.0) if served > 0 else None,
                avg_compute_ms=float(comp[i] / served * 1000.0) if served > 0 else None,
            ))
        return out

    def _latency(self, now_s: float) -> np.ndarray | None:
        """Per model (rows) the p50, p95 and p99 in ms (columns; nan: nothing served) of
        every request served over the latency window, as Triton's summaries report them
        at the scrape: each step's requests are exponential with the step's p99, weighted
        by what it served (``queueing.mixture_quantiles``)."""
        cfg = self.config
        w = self._window(now_s, None, cfg.latency_window_s or cfg.metrics_window_s)
        if w is None:
            return None
        k0, k1, _ = w
        c = self._cum
        per_step = {key: np.diff(np.asarray(c[key][k0:k1 + 1]), axis=0).T for key in ("arr", "fail", "lost", "p99w")}
        reached = per_step["arr"] - per_step["lost"]  # the arrivals a replica took (p99w's weights)
        weights = np.where((reached > 0) & (per_step["p99w"] > 0),
                           np.maximum(per_step["arr"] - per_step["fail"], 0.0), 0.0)
        p99 = np.where(weights > 0, per_step["p99w"] / np.where(reached > 0, reached, 1.0), 1.0)
        n = len(self.models)
        levels = np.repeat(LATENCY_LEVELS, n)
        got = q.mixture_quantiles(levels, np.tile(p99, (3, 1)), np.tile(weights, (3, 1)), of=0.99)
        return got.reshape(3, n).T * 1000.0

    def _scraped(self, k0: int, k1: int) -> np.ndarray:
        """Per model: had it a READY replica (a series to scrape) in any step of [k0, k1)?"""
        return np.asarray(self.ready_count[k0:k1]).max(axis=0) > 0

    def read(
        self, models: Sequence[str], replicas: Sequence[str], now_s: float
    ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        w = self._window(now_s)
        out_m: dict[str, ModelSignals | None] = {}
        out_r: dict[str, ReplicaSignals] = {}
        if w is None:
            return {m: None for m in models}, out_r
        k0, k1, t_end = w
        span = (k1 - k0) * self.config.step_s
        fast = self._fast(now_s)
        lat = self._latency(now_s)
        c = self._cum
        d = {key: c[key][k1] - c[key][k0] for key in c}
        seen = self._scraped(k0, k1)
        for m in models:
            i = self.midx.get(m)
            if i is None or not seen[i]:
                out_m[m] = None  # no series: missing data, not a measured 0
                continue
            served = d["arr"][i] - d["fail"][i]
            avg_q = avg_c = ratio = None
            if served > 0:
                avg_q = d["wait"][i] / served * 1000.0
                avg_c = d["comp"][i] / served * 1000.0
                ratio = avg_q / avg_c if avg_c > 0 else None
            p50 = p95 = p99 = None
            if lat is not None and not math.isnan(lat[i, 2]):
                p50, p95, p99 = (float(v) for v in lat[i])
            out_m[m] = ModelSignals(
                model=m,
                t_s=t_end,
                # as Triton's counters: success + failure, and a request a replica's queue
                # dropped is a failure (docs/metrics.md)
                request_rate=float((d["done"][i] + d["drop"][i]) / span),
                success_rate=float(d["done"][i] / span),
                failure_rate=float(d["drop"][i] / span),
                avg_queue_ms=avg_q,
                avg_compute_ms=avg_c,
                queue_compute_ratio=ratio,
                p50_ms=p50,
                p95_ms=p95,
                p99_ms=p99,
                latency_window_s=self.config.latency_window_s if p99 is not None else None,
                pending=float(self.pending[k1 - 1][i]),
                ready_replicas=int(self.ready_count[k1 - 1][i]),
                fast=fast[i] if fast is not None else None,
            )
        for rid in replicas:
            r = self._reps.get(rid)
            if r is None:
                continue
            lo, hi = k0 - r.first_step, k1 - r.first_step
            if hi <= 0 or lo >= len(r.cum_busy) or hi > len(r.cum_busy):
                continue  # no samples for this replica in the window yet
            lo = max(lo, 0)
            start_v = r.cum_busy[lo - 1] if lo > 0 else 0.0
            secs = (hi - lo) * self.config.step_s
            b = (r.cum_busy[hi - 1] - start_v) / secs
            out_r[rid] = ReplicaSignals(rid, r.model, t_end, busy_fraction=b, gr_engine_active=b)
        return out_m, out_r
