"""The burst layer's metrics source: a 1 s direct scrape of every replica's Triton ``/metrics``.

Place in the loop: beside the observe stage. The main source (Prometheus, or
``ScrapeSource``) averages over a window of several ticks, so a step in load
shows in it only gradually; the burst layer (``policy/burst.py``) wants what
arrives *now*. ``FastScrape.sample`` is called every second by the run loop's
idle hook; ``WithFast`` wraps the main source and attaches, per model, a
``FastSignals`` over the last ``window_s`` of those scrapes to each
``ModelSignals`` it returns. Where a model's replicas were not scraped in the
last ``stale_s`` the model gets no fast signals (``fast=None``), never zeros.

Arrivals are inferred as a scraper must (Triton has no arrival counter):
completions + failures + the growth of the pending-request gauge over the
window. Worked number: over 3 s a model's replicas completed 600 requests,
failed none, and their queue grew from 4 to 154: 600 / 3 + 150 / 3 = 250 req/s
arriving, although only 200 req/s were served.

Both controllers run it: the local one scrapes its Triton processes one by
one; the Kubernetes one scrapes each Ready Triton pod at its IP and named
``metrics`` port (``KubeInventory.metrics_targets``) on a pool of threads,
beside Prometheus, which stays the main source. Where the pods cannot be
reached (a NetworkPolicy, a proxy), every model goes without fast signals and
the loop runs on Prometheus alone, as it would without this path.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from autoscaler.observe.scrape import HttpFetch, ScrapeSource, Targets
from autoscaler.policy.types import FastSignals, ModelSignals, ReplicaSignals

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
QUEUE = "nv_inference_queue_duration_us"
COMPUTE = ("nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
           "nv_inference_compute_output_duration_us")


class FastScrape:
    """Direct scrapes of the replicas, kept for ``2 * window_s``; thread-safe (the idle hook
    samples while a tick reads).

    ``workers`` > 1 scrapes the targets side by side on a pool of that many threads
    over keep-alive connections (``HttpFetch``): what a controller with hundreds of pods needs to
    finish a round in well under its 1 s interval (each fetch may take ``timeout_s``).
    ``max_duty`` < 1 bounds the share of the time rounds take: a round of d seconds puts
    the next one ``d / max_duty`` after its start, and the rates are then read over that
    longer span -- a fleet of thousands of pods gets signals every few seconds instead
    of a controller whose ticks wait for the scrape.
    """

    def __init__(self, targets: Targets, window_s: float = 3.0, stale_s: float = 3.0, timeout_s: float = 0.5,
                 fetch=None, min_span_s: float = 1.0, workers: int = 1, interval_s: float = 1.0,
                 max_duty: float = 1.0, timer: Callable[[], float] = time.perf_counter,
                 proxy: str | None = None) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s: must be > 0, got {window_s!r}")
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers!r}")
        if not 0 < max_duty <= 1:
            raise ValueError(f"max_duty: must be in (0, 1], got {max_duty!r}")
        self.window_s = window_s
        # The shortest span a model's rates are read over: the idle hook's scrape
        # interval. Less is two scrapes a moment apart (a tick's own right after the hook's).
        self.min_span_s = min_span_s
        self.stale_s = stale_s
        self.interval_s = interval_s
        # the share of the time the rounds may take: a round of d seconds puts the next one
        # d / max_duty after this one's start, however often the hook asks
        self.max_duty = max_duty
        self.timer = timer
        self.gap_s = interval_s  # seconds from this round's start to the next's
        self._pool: ThreadPoolExecutor | None = None
        if workers > 1:
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fast-scrape")
        # keep-alive connections kept between rounds, one per pod; through ``proxy`` for a
        # controller outside the pod network (and the emulated one in the tests)
        self._client = HttpFetch(connections=workers, proxy=proxy) if fetch is None else None
        fetch = fetch or self._client
        self._src = ScrapeSource(targets, window_s=window_s, long_window_s=2 * window_s, metrics_stale_s=stale_s,
                                 timeout_s=timeout_s, fetch=fetch, pool=self._pool)
        self._lock = threading.Lock()
        self._sampled_at: float | None = None
        self._round_s = 0.0  # the last round's length, which the next one is expected to take
        self._rounds = 0
        self._round_signals: tuple[int, dict[str, FastSignals]] | None = None
        # the last round, for status: when, how many targets, how many failed, the first failure
        self.last: dict[str, object] = {"t_s": None, "targets": 0, "failures": 0, "error": None, "round_s": None,
                                        "next_in_s": None}

    def sample(self, now_s: float) -> None:
        """Scrape every replica once (failures only leave a gap: the model goes without)."""
        notes: list[str] = []
        with self._lock:
            t0 = self.timer()
            n, failures = self._src.scrape(now_s, notes)
            took = self.timer() - t0
            self._sampled_at, self._round_s = now_s, took
            self._rounds += 1
            self.gap_s = max(self.interval_s, took / self.max_duty)
            # rounds further apart stay usable: a model's last scrape is stale only after two gaps
            self._src.metrics_stale_s = max(self.stale_s, 2.0 * self.gap_s)
        self.last = {"t_s": now_s, "targets": n, "failures": failures, "error": notes[0][:300] if notes else None,
                     "round_s": round(took, 4), "next_in_s": round(self.gap_s, 3)}

    def sample_if_due(self, now_s: float, free_s: float | None = None) -> bool:
        """``sample`` when the gap since the last round has passed (``interval_s``, or more where
        ``max_duty`` stretches it), for an idle hook called more often than that.

        ``free_s``: the seconds the caller has before it must be free (the next tick). A due
        round that the last one's length says would overrun them waits for a later call --
        the tick starts on time and reads the last round -- unless that leaves the signals
        half a gap from going stale (``2 * gap_s``): then it runs regardless."""
        if self._sampled_at is not None:
            age = now_s - self._sampled_at
            # a hair early counts: a hook called every 0.5 s must not slip to every 1.5 s
            if age < 0.9 * self.gap_s:
                return False
            if free_s is not None and self._round_s > free_s and age < 1.5 * self.gap_s:
                return False
        self.sample(now_s)
        return True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    def round_signals(self) -> dict[str, FastSignals]:
        """``signals`` as of the last round, computed once per round: for a check that runs
        between rounds (the wake hooks, every half second), to which nothing new arrives until
        the next round -- at 600 pods a computation costs tens of milliseconds, and rounds
        come every few seconds. The caller judges their age against its own clock."""
        with self._lock:
            rounds, at = self._rounds, self._sampled_at
        cached = self._round_signals
        if cached is not None and cached[0] == rounds:
            return cached[1]
        sig = self.signals(at) if at is not None else {}
        self._round_signals = (rounds, sig)
        return sig

    def signals(self, now_s: float) -> dict[str, FastSignals]:
        """Per model, the fast signals over the last ``window_s``, as rates over the model's
        span (``ScrapeSource.model_windows``); models whose replicas' scrapes span less
        than ``min_span_s`` are absent."""
        out: dict[str, FastSignals] = {}
        with self._lock:
            # rounds stretched apart (``max_duty``) are read over as long as they are apart
            windows = self._src.model_windows(now_s, max(self.window_s, 2.0 * self.gap_s))
        for model, mw in windows.items():
            if mw.span_s < self.min_span_s:
                continue  # scrapes a moment apart: a rate over them is noise, not a signal
            rows = mw.rows
            t_s = max(rw.last.t_s for rw in rows)
            succ = mw.total_rate(SUCCESS) or 0.0
            fail = mw.total_rate(FAILURE) or 0.0
            growth = 0.0
            pend_now: float | None = None
            for rw in rows:
                if rw.last.pending is not None:
                    pend_now = (pend_now or 0.0) + rw.last.pending
                if rw.first.pending is not None and rw.last.pending is not None:
                    growth += (rw.last.pending - rw.first.pending) / mw.span_s
            queue = mw.total_rate(QUEUE)
            comp_parts = [mw.total_rate(n) for n in COMPUTE]
            has_comp = any(c is not None for c in comp_parts)
            out[model] = FastSignals(
                t_s=t_s,
                window_s=mw.span_s,
                arrival_rps=max(0.0, succ + fail + growth),
                completed_rps=succ,
                pending=pend_now,
                # an average over no request is undefined: None, never 0
                avg_queue_ms=queue / succ / 1000.0 if succ > 0 and queue is not None else None,
                avg_compute_ms=sum(c or 0.0 for c in comp_parts) / succ / 1000.0 if succ > 0 and has_comp else None,
            )
        return out


class WithFast:
    """A ``MetricsSource``: the wrapped source's signals, each model's with ``fast`` attached.

    ``fresh_each_read``: the tick scrapes once more for itself (a few local replicas: the
    freshest signals for a few milliseconds); False takes the idle hook's last round and
    never runs one (hundreds of pods: a round takes about 1 s at 1,000 pods, time the tick's
    actions would wait; the idle hook's rounds are at most two gaps old)."""

    def __init__(self, inner, fast: FastScrape, fresh_each_read: bool = True) -> None:
        self.inner = inner
        self.fast = fast
        self.fresh_each_read = fresh_each_read

    @property
    def last_notes(self) -> tuple[str, ...]:
        return tuple(getattr(self.inner, "last_notes", ()))

    def prefetch(self, now_s: float) -> None:
        """The wrapped source's early start of a tick's queries, where it has one."""
        pre = getattr(self.inner, "prefetch", None)
        if pre is not None:
            pre(now_s)

    def read(self, models: Sequence[str], replicas: Sequence[str], now_s: float
             ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        sigs, reps = self.inner.read(models, replicas, now_s)
        if self.fresh_each_read:
            self.fast.sample(now_s)  # the freshest scrape for this very tick
        fast = self.fast.signals(now_s)
        out: dict[str, ModelSignals | None] = {}
        for m, s in sigs.items():
            f = fast.get(m)
            out[m] = dataclasses.replace(s, fast=f) if s is not None and f is not None else s
        return out, reps
