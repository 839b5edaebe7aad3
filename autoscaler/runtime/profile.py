"""Capacity profiling: how many req/s one replica sustains at its SLO, per MIG profile.

This runs *before* the loop and feeds the planner: ``migscale profile`` writes
``capacity.yaml`` (``{models: {name: {profile: rps}}}``), which ``models.yaml``
references through ``capacity_file`` and ``config.model_specs`` reads into
``ModelSpec.capacity``.

Two layers:

* the sweep (``runtime.profile_sweep``) is pure: given a ``measure(concurrency)``
  or ``measure_rate(rps)`` callable it decides which points to measure, when to
  stop, and what the capacity at the SLO is;
* the measurement adapter here (``TritonMeasurer``) drives one real replica with
  N concurrent in-flight requests or Poisson arrivals (``tritonclient.http.aio``)
  and reads Triton's own counters for the average batch size; ``plot`` draws the
  points.

The stability rule for one point: after a warm-up (default 0.5 s at the new
concurrency, so the dynamic batcher's queue reaches its steady length), the
point measures until BOTH ``point_s`` seconds have passed AND ``min_requests``
(200) requests have completed -- 200 samples put the p99 between the 2nd and 3rd
slowest request rather than on a single outlier. A replica too slow to give 200
requests in ``5 * point_s`` ends the point there and marks it ``unstable``.

Each open-loop point sends Poisson arrivals at the offered rate
(``TritonMeasurer.measure_rate``) until ``point_s`` and ``open_requests`` are
both reached, and times each request from its *scheduled* send time, so a
client that falls behind shows as latency rather than as a slower offer.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Sequence

import numpy as np

from autoscaler.runtime.profile_sweep import PointRule, ProfileResult, SweepPoint


def plot(results: Sequence[ProfileResult], path: str) -> None:
    """Throughput vs p99 per profile, one panel per model, the SLO as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_model: dict[str, list[ProfileResult]] = {}
    for r in results:
        by_model.setdefault(r.model, []).append(r)
    n = len(by_model)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
    for ax, (model, rs) in zip(axes[0], by_model.items()):
        for r in rs:
            pts = [p for p in r.points if p.p99_ms is not None]
            line, = ax.plot([p.throughput_rps for p in pts], [p.p99_ms for p in pts], marker="o",
                            label=f"{r.profile} (cap {r.closed_capacity_rps or 0:.0f} req/s)")
            for p in pts:
                ax.annotate(str(p.concurrency), (p.throughput_rps, p.p99_ms), fontsize=7,
                            textcoords="offset points", xytext=(3, 3), color=line.get_color())
            opts = r.poisson_curve
            if opts:
                ax.plot([p.offered_rps for p in opts], [p.p99_ms for p in opts], marker="s", linestyle="--",
                        color=line.get_color(),
                        label=f"{r.profile} Poisson (cap {r.capacity_rps or 0:.0f} req/s)")
        ax.axhline(rs[0].slo_p99_ms, color="red", linestyle="--", label=f"SLO p99 {rs[0].slo_p99_ms:g} ms")
        ax.set_xlabel("throughput (req/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.set_title(f"{model}: throughput vs p99 (labels: concurrency; squares: Poisson offered rate)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- measurement adapter

_SAMPLE = re.compile(r'^(nv_inference_count|nv_inference_exec_count|nv_inference_request_success)'
                     r'\{model="([^"]+)",version="[^"]*"\} (\S+)$', re.MULTILINE)


def triton_counters(metrics_text: str, model: str) -> dict[str, float]:
    """Counters for ``model`` (summed over versions); absent counters are absent, not 0."""
    out: dict[str, float] = {}
    for name, m, value in _SAMPLE.findall(metrics_text):
        if m == model:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def avg_batch(before: dict[str, float], after: dict[str, float]) -> float | None:
    try:
        d_count = after["nv_inference_count"] - before["nv_inference_count"]
        d_exec = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
    except KeyError:
        return None
    return d_count / d_exec if d_exec > 0 else None


# An open-loop point lasts until it has sent ``open_requests`` (2,000 at 36 req/s is 55 s);
# a model slower than ``open_requests`` / 120 req/s ends its point here, marked unstable.
OPEN_POINT_MAX_S = 120.0


class TritonMeasurer:
    """Load against one replica's HTTP endpoint: N requests in flight (``measure``) or
    Poisson arrivals at a rate (``measure_rate``)."""

    def __init__(self, url_http: str, url_metrics: str, model: str, rule: PointRule,
                 batch: int = 1) -> None:
        import tritonclient.http as httpclient

        from loadtests.inputs import build_inputs, fetch_model_io, requested_outputs

        self.url = url_http
        self.url_metrics = url_metrics
        self.model = model
        self.rule = rule
        sync = httpclient.InferenceServerClient(url_http)
        try:
            io = fetch_model_io(sync, model)
        finally:
            sync.close()
        self.inputs = build_inputs(httpclient, io, batch=batch)
        self.outputs = requested_outputs(httpclient, io)

    def _counters(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url_metrics, timeout=5) as r:
            return triton_counters(r.read().decode(), self.model)

    def measure(self, concurrency: int) -> SweepPoint:
        return asyncio.run(self._measure(concurrency))

    async def _measure(self, concurrency: int) -> SweepPoint:
        from tritonclient.http.aio import InferenceServerClient

        rule = self.rule
        client = InferenceServerClient(self.url, conn_limit=max(concurrency, 1))
        lat_ms: list[float] = []
        errors = 0
        window: list[float] = []  # [t_start] once measuring
        stopping = False

        async def worker() -> None:
            nonlocal errors
            while not stopping:
                t0 = time.perf_counter()
                ok = True
                try:
                    await client.infer(self.model, self.inputs, outputs=self.outputs)
                except Exception:  # noqa: BLE001 - a failed request is counted, not raised
                    ok = False
                t1 = time.perf_counter()
                # a request belongs to the window it completes in
                if window and not stopping and t1 >= window[0]:
                    if ok:
                        lat_ms.append((t1 - t0) * 1000.0)
                    else:
                        errors += 1
                if not ok:
                    await asyncio.sleep(0.01)  # a dead replica must not turn into a busy loop

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await asyncio.sleep(rule.warmup_s)
            before = await asyncio.to_thread(self._counters)
            t_start = time.perf_counter()
            window.append(t_start)
            unstable = False
            while True:
                await asyncio.sleep(0.05)
                el = time.perf_counter() - t_start
                if el >= rule.point_s and len(lat_ms) + errors >= rule.min_requests:
                    break
                if el >= rule.point_s * rule.max_factor:
                    unstable = True
                    break
            stopping = True
            t_end = time.perf_counter()
            n, n_err = len(lat_ms), errors
            after = await asyncio.to_thread(self._counters)
        finally:
            stopping = True
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()
        return _point(lat_ms[:n], n_err, t_end - t_start, before, after, unstable, concurrency=concurrency)

    def measure_rate(self, rate_rps: float, seed: int = 0) -> SweepPoint:
        return asyncio.run(self._measure_rate(rate_rps, seed))

    async def _measure_rate(self, rate_rps: float, seed: int) -> SweepPoint:
        from tritonclient.http.aio import InferenceServerClient

        rule = self.rule
        # Sends are never held back for a connection: open loop means the offer does
        # not wait for answers. 1024 in flight is far past any SLO this measures.
        client = InferenceServerClient(self.url, conn_limit=1024)
        rng = np.random.default_rng(seed)
        lat_ms: list[float] = []
        errors = 0
        window: list[float] = []  # [t_start] once measuring

        async def one(t_sched: float) -> None:
            nonlocal errors
            ok = True
            try:
                await client.infer(self.model, self.inputs, outputs=self.outputs)
            except Exception:  # noqa: BLE001 - a failed request is counted, not raised
                ok = False
            if window and t_sched >= window[0]:  # a request belongs to the window it was sent in
                if ok:
                    lat_ms.append((time.perf_counter() - t_sched) * 1000.0)
                else:
                    errors += 1

        tasks: list[asyncio.Task] = []
        try:
            t0 = time.perf_counter()
            t_next = t0
            sent_in_window = 0
            before: dict[str, float] = {}
            t_start = t_end = t0
            unstable = False
            while True:
                t_next += float(rng.exponential(1.0 / rate_rps))
                now = time.perf_counter()
                if not window and t_next >= t0 + rule.warmup_s:
                    before = await asyncio.to_thread(self._counters)
                    t_start = time.perf_counter()
                    window.append(t_start)
                    t_next = max(t_next, t_start)
                    now = t_start
                if window:
                    el = t_next - t_start
                    if el >= rule.point_s and sent_in_window >= rule.open_requests:
                        break
                    if el >= OPEN_POINT_MAX_S:
                        unstable = True
                        break
                if t_next > now:
                    await asyncio.sleep(t_next - now)
                tasks.append(asyncio.create_task(one(t_next)))
                if window:
                    sent_in_window += 1
                if len(tasks) > 4 * rule.open_requests:
                    tasks = [t for t in tasks if not t.done()]
            t_end = t_next
            await asyncio.gather(*tasks, return_exceptions=True)
            after = await asyncio.to_thread(self._counters)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()
        return _point(lat_ms, errors, t_end - t_start, before, after, unstable, offered_rps=rate_rps)


def _point(lat_ms: Sequence[float], errors: int, dur: float, before: dict[str, float], after: dict[str, float],
           unstable: bool, *, concurrency: int = 0, offered_rps: float | None = None) -> SweepPoint:
    """One measured point from its window's latencies and Triton's counters around it."""
    n = len(lat_ms)
    arr = np.asarray(lat_ms) if n else None
    pct = (lambda q: float(np.percentile(arr, q))) if arr is not None else (lambda q: None)
    return SweepPoint(concurrency=concurrency, requests=n, errors=errors, duration_s=dur,
                      throughput_rps=n / dur if dur > 0 else 0.0, p50_ms=pct(50), p95_ms=pct(95),
                      p99_ms=pct(99), avg_batch=avg_batch(before, after), unstable=unstable,
                      offered_rps=offered_rps)
