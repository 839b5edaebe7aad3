"""``ScrapeSource``: the observe stage without Prometheus, scraping each Triton ``/metrics``.

Used by the local cluster when no Prometheus binary is present. Each ``read``
fetches every replica's exposition text (targets come from a callable,
``{replica_id: (model, url)}``, so replicas started a second ago are
included), parses it with ``prometheus_client``'s text parser, and keeps the
last scrapes in memory to compute rates -- what Prometheus' ``rate()`` would.

Counter resets (a replica restarted, its counters went back to ~0): the
same rule as Prometheus' ``rate()``: when a counter is lower than in the
previous scrape, the new value is the increase since the reset (it counted
up from 0). A replica that served 1000 requests, restarted and served 40
more adds 40, not -960.

Latency: quantiles from ``nv_inference_request_summary_us`` when Triton runs
with summaries; otherwise the mean request time from the counters, with
``latency_is_average=True``. Values that are NaN, Inf, negative or absurd are
dropped with an ``invalid_metric`` note, as in ``PrometheusSource``.
"""

from __future__ import annotations

import itertools
import math
import resource
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import urllib3

from autoscaler.observe.prometheus import check_value
from autoscaler.observe.queries import SUMMARY_WINDOW_S
from autoscaler.policy.types import ModelSignals, Reason, ReplicaSignals

Targets = Callable[[], Mapping[str, tuple[str, str]]]
Fetch = Callable[[str, float], str]

COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
PENDING = "nv_inference_pending_request_count"
SUMMARY = "nv_inference_request_summary_us"
_WANTED = (*COUNTERS, PENDING, SUMMARY)  # name prefixes: a counter's _total, a summary's _count and _sum


@dataclass(frozen=True)
class Scrape:
    """One parsed scrape of one replica, reduced to the series for its model."""

    t_s: float
    counters: Mapping[str, float]  # summed over labels other than model (failure reasons)
    pending: float | None = None
    quantiles: Mapping[float, float] = field(default_factory=dict)  # quantile -> microseconds


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica's counters over a model's window: their increases between its first and last
    scrape in it."""

    replica: str
    increases: dict[str, float]
    first: Scrape  # its first and last scrape in the window
    last: Scrape


@dataclass(frozen=True)
class ModelWindow:
    """One model's replicas over a window (``ScrapeSource.model_windows``)."""

    span_s: float  # the widest of its replicas' spans: what the rates are per second of
    rows: tuple[ReplicaWindow, ...]

    def total_rate(self, name: str) -> float | None:
        """The replicas' summed increase of counter ``name`` per second of the model's span;
        None when no replica has the series (absent, never 0)."""
        vals = [rw.increases[name] / self.span_s for rw in self.rows if name in rw.increases]
        return sum(vals) if vals else None


class ParseError(ValueError):
    pass


def parse_exposition(text: str, model: str, t_s: float) -> Scrape:
    """Parse Triton's ``/metrics`` text, keeping only ``model``'s series."""
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    pending: float | None = None
    quantiles: dict[float, float] = {}
    # Only the families read below go to the parser: Triton's exposition also carries GPU,
    # CPU, memory and cache families, and parsing is most of a scrape's cost (the
    # Kubernetes controller parses every pod's, every second).
    # With none of them the whole text is parsed: a page that is no exposition at all (an
    # error page, the wrong port) is a failed scrape, not a replica without series.
    kept = [ln for ln in text.splitlines()
            if ln.startswith(_WANTED) or (ln.startswith("# TYPE ") and ln[7:].startswith(_WANTED))]
    try:
        families = list(text_string_to_metric_families("\n".join(kept) + "\n" if kept else text))
    except Exception as exc:  # the parser raises ValueError/IndexError on garbage
        raise ParseError(f"unparseable exposition: {exc}") from exc
    for fam in families:
        for s in fam.samples:
            if s.labels.get("model") != model:
                continue
            name = s.name.removesuffix("_total")
            if name in COUNTERS:
                counters[name] = counters.get(name, 0.0) + s.value
            elif name == PENDING:
                pending = (pending or 0.0) + s.value
            elif name == SUMMARY and "quantile" in s.labels:
                q = float(s.labels["quantile"])
                if not math.isnan(s.value):  # an empty summary window exports NaN
                    quantiles[q] = max(quantiles.get(q, 0.0), s.value)
    return Scrape(t_s, counters, pending, quantiles)


def counter_increase(samples: Sequence[float]) -> float:
    """Increase over consecutive counter samples, reset-aware (Prometheus ``rate()`` rule).

    [100, 150, 20, 60] -> 50 + 20 (reset: counted from 0) + 40 = 110.
    """
    total = 0.0
    for prev, cur in itertools.pairwise(samples):
        total += cur - prev if cur >= prev else cur
    return total


class FetchError(OSError):
    """A page that came back but is no exposition to parse: a status other than 200."""


class HttpFetch:
    """``fetch(url, timeout_s) -> text`` over keep-alive connections (urllib3), one pool per
    target host, as Prometheus keeps one connection per target: a replica is fetched over the
    connection its last scrape left open instead of a new one each time (on a pod network,
    where every pod is its own host, a new connection adds a tenth to a sixth of a pod's
    scrape CPU).

    ``hosts``: how many hosts' connections are kept (least recently used first out), bounded
    by a quarter of the process's file-descriptor limit so idle sockets cannot starve the
    rest of the controller; a fleet larger than that reconnects to some pods each round.
    ``idle_s``: a host not fetched for that long has its connection closed (Go's default
    transport keeps an idle connection 90 s), so a pod that is gone does not hold a socket
    until the bound pushes it out; every live target is fetched far more often than that.
    ``proxy``: every fetch through that HTTP proxy over up to ``connections`` connections
    (a controller outside the pod network, and the emulated pod network in the tests).
    The environment's proxy settings are never used: pods reach pods directly, and
    ``NO_PROXY`` cannot name a pod CIDR. No retries and no redirects: a failed fetch is a
    gap in the scrape, and its timeout bounds the whole fetch, connect and read together.
    """

    def __init__(self, connections: int = 1, proxy: str | None = None, hosts: int = 4096,
                 idle_s: float = 90.0, clock: Callable[[], float] = time.monotonic) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            hosts = max(16, min(hosts, soft // 4))
        self.hosts = hosts
        self.idle_s = idle_s
        self._clock = clock
        self._proxy = urllib3.ProxyManager(proxy, maxsize=max(1, connections), retries=False) if proxy else None
        # (scheme, host, port) -> (pool, last fetched), least recently fetched first
        self._pools: OrderedDict[tuple[str, str, int], tuple[urllib3.HTTPConnectionPool, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, url: str, timeout_s: float) -> str:
        timeout = urllib3.Timeout(total=timeout_s)
        if self._proxy is not None:
            r = self._proxy.request("GET", url, timeout=timeout, retries=False, redirect=False)
        else:
            u = urllib3.util.parse_url(url)
            r = self._pool(u).request("GET", u.request_uri, timeout=timeout, retries=False, redirect=False)
        if r.status != 200:
            raise FetchError(f"HTTP {r.status} from {url}")
        return r.data.decode("utf-8")

    def _pool(self, u: urllib3.util.Url) -> urllib3.HTTPConnectionPool:
        scheme = u.scheme or "http"
        key = (scheme, u.host or "", u.port or (443 if scheme == "https" else 80))
        now = self._clock()
        gone: list[urllib3.HTTPConnectionPool] = []
        with self._lock:
            kept = self._pools.pop(key, None)
            if kept is not None:
                pool = kept[0]
            else:
                # a second connection to one host only when two threads fetch it at once
                cls = urllib3.HTTPSConnectionPool if scheme == "https" else urllib3.HTTPConnectionPool
                pool = cls(key[1], key[2], maxsize=2, retries=False)
            self._pools[key] = (pool, now)
            while self._pools:
                oldest, (old_pool, used) = next(iter(self._pools.items()))
                if len(self._pools) <= self.hosts and now - used < self.idle_s:
                    break
                del self._pools[oldest]
                gone.append(old_pool)
        for p in gone:
            p.close()
        return pool

    @property
    def kept_hosts(self) -> int:
        """How many hosts' connections are kept now."""
        with self._lock:
            return len(self._pools)

    def close(self) -> None:
        with self._lock:
            pools = [p for p, _ in self._pools.values()]
            self._pools.clear()
        for p in pools:
            p.close()
        if self._proxy is not None:
            self._proxy.clear()


class ScrapeSource:
    """See the module docstring. ``fetch(url, timeout_s) -> text`` is injectable for tests."""

    def __init__(
        self,
        targets: Targets,
        window_s: float = 30.0,
        long_window_s: float = 60.0,
        metrics_stale_s: float = 60.0,
        timeout_s: float = 2.0,
        fetch: Fetch | None = None,
        pool: Executor | None = None,
    ) -> None:
        self.targets = targets
        self.pool = pool
        self.window_s = window_s
        self.long_window_s = max(long_window_s, window_s)
        self.metrics_stale_s = metrics_stale_s
        self.timeout_s = timeout_s
        self.fetch = fetch or HttpFetch()
        self.history: dict[str, deque[Scrape]] = {}
        self.models_of: dict[str, str] = {}
        self.last_notes: tuple[str, ...] = ()

    # ------------------------------------------------------------ scraping
    def scrape(self, now_s: float, notes: list[str]) -> tuple[int, int]:
        """Scrape every target once; returns (targets, failures). With a ``pool`` the
        fetches run on it side by side (hundreds of pods in a second), else one by one."""
        targets = dict(self.targets())

        def one(item: tuple[str, tuple[str, str]]) -> Scrape | Exception:
            _rid, (model, url) = item
            try:
                return parse_exposition(self.fetch(url, self.timeout_s), model, now_s)
            except Exception as exc:  # noqa: BLE001 - a failed scrape is a missing replica
                return exc

        items = list(targets.items())
        got = list(self.pool.map(one, items)) if self.pool is not None and len(items) > 1 else [one(i) for i in items]
        failures = 0
        for (rid, (model, url)), sc in zip(items, got):
            if isinstance(sc, Exception):
                failures += 1
                notes.append(
                    f"{Reason.HOLD_MISSING_METRICS.value}: {rid}: scrape of {url} failed: "
                    f"{type(sc).__name__}: {sc}"
                )
                continue
            h = self.history.setdefault(rid, deque())
            h.append(sc)
            self.models_of[rid] = model
            # keep one scrape older than the long window, so the window is covered
            while len(h) > 2 and h[1].t_s <= now_s - self.long_window_s:
                h.popleft()
        for rid in list(self.history):
            if rid not in targets:  # a replica that is gone: forget its counters
                del self.history[rid]
                self.models_of.pop(rid, None)
        return len(targets), failures

    def _window(self, rid: str, now_s: float, window_s: float) -> list[Scrape]:
        h = list(self.history.get(rid, ()))
        if not h or now_s - h[-1].t_s > self.metrics_stale_s:
            return []
        inside = [s for s in h if s.t_s >= now_s - window_s]
        older = [s for s in h if s.t_s < now_s - window_s]
        if older:  # start from the last scrape before the window (covers the whole window)
            inside = [older[-1]] + inside
        return inside

    def replica_increases(self, rid: str, now_s: float, window_s: float | None = None
                          ) -> tuple[dict[str, float], list[Scrape]] | None:
        """Each counter's increase over the replica's scrapes in the window, and those
        scrapes; None with fewer than 2, or none of the window's time between them."""
        w = self._window(rid, now_s, window_s or self.window_s)
        if len(w) < 2 or w[-1].t_s <= w[0].t_s:
            return None
        out = {}
        for name in COUNTERS:
            series = [s.counters.get(name) for s in w]
            if all(v is None for v in series):
                continue
            # Triton creates some counters lazily (a failure reason's first
            # failure): a series absent before it appears was at 0.
            first = next(i for i, v in enumerate(series) if v is not None)
            known = [0.0] * first + [v for v in series[first:] if v is not None]
            if len(known) >= 2:
                out[name] = counter_increase(known)
        return out, w

    def model_windows(self, now_s: float, window_s: float | None = None) -> dict[str, ModelWindow]:
        """Per model, its replicas' counter increases over the window as rates over the model's
        span (its replicas' widest), with each replica's first and last scrape in it.

        Over the model's span, not each replica's own: a replica that joined inside the
        window served only part of it, and its few requests over its own short span would
        read as a rate it never had. Two scrapes 0.1 s apart (the tick's own scrape right
        after the idle hook's) holding 6 completions are 60 req/s over 0.1 s but 2 req/s
        over the model's 3 s; summed with the others as the first, a 70 req/s model read 131."""
        incs: dict[str, list[tuple[str, dict[str, float], list[Scrape]]]] = {}
        for rid, model in self.models_of.items():
            inc = self.replica_increases(rid, now_s, window_s)
            if inc is not None:
                incs.setdefault(model, []).append((rid, *inc))
        out: dict[str, ModelWindow] = {}
        for model, rows in incs.items():
            span = max(w[-1].t_s - w[0].t_s for _, _, w in rows)
            out[model] = ModelWindow(span, tuple(
                ReplicaWindow(rid, counts, w[0], w[-1]) for rid, counts, w in rows))
        return out

    # ------------------------------------------------------------ MetricsSource
    def read(
        self, models: Sequence[str], replicas: Sequence[str], now_s: float
    ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        notes: list[str] = []
        n_targets, failures = self.scrape(now_s, notes)
        if n_targets and failures == n_targets:
            self.last_notes = tuple(notes)
            raise ConnectionError(f"every Triton /metrics scrape failed ({n_targets} targets)")
        per_model = self.model_windows(now_s)
        rep_out: dict[str, ReplicaSignals] = {}
        stale = self.metrics_stale_s
        for model, mw in per_model.items():
            for rw in mw.rows:
                # over its own span: the replica's own busy fraction
                own_s = rw.last.t_s - rw.first.t_s
                busy, note = check_value(
                    "busy_fraction",
                    rw.increases.get("nv_inference_compute_infer_duration_us", math.nan) / own_s / 1e6,
                    rw.last.t_s,
                    now_s,
                    stale,
                )
                if note and "nv_inference_compute_infer_duration_us" in rw.increases:
                    notes.append(f"{rw.replica}: {note}")
                rep_out[rw.replica] = ReplicaSignals(replica=rw.replica, model=model, t_s=rw.last.t_s,
                                                     busy_fraction=busy)
        out: dict[str, ModelSignals | None] = {}
        for m in models:
            mw = per_model.get(m)
            if mw is None:
                notes.append(
                    f"{Reason.HOLD_MISSING_METRICS.value}: {m}: no replica with two scrapes in the window"
                )
                out[m] = None
                continue
            out[m] = self._model_signals(m, mw, now_s, notes)
        self.last_notes = tuple(notes)
        return out, {r: s for r, s in rep_out.items() if not replicas or r in set(replicas)}

    def _model_signals(self, m, mw: ModelWindow, now_s: float, notes: list[str]) -> ModelSignals:
        rows = mw.rows
        t_s = max(rw.last.t_s for rw in rows)
        total = mw.total_rate

        def ok(name: str, v: float | None) -> float | None:
            if v is None:
                return None
            val, note = check_value(name, v, t_s, now_s, self.metrics_stale_s)
            if note:
                notes.append(f"{m}: {note}")
            return val

        succ = ok("success_rate", total("nv_inference_request_success"))
        fail = ok("failure_rate", total("nv_inference_request_failure"))
        rate = None if succ is None else succ + (fail or 0.0)  # failure series appear lazily

        def per_request(name: str, signal: str) -> float | None:
            num = total(name)
            if num is None or succ is None:
                return None
            # no request in the window: the average is undefined -> None, never 0
            return ok(signal, num / succ / 1000.0) if succ > 0 else None

        q_ms = per_request("nv_inference_queue_duration_us", "avg_queue_ms")
        parts = [
            total(n)
            for n in (
                "nv_inference_compute_input_duration_us",
                "nv_inference_compute_infer_duration_us",
                "nv_inference_compute_output_duration_us",
            )
        ]
        c_ms = None
        if succ is not None and all(p is not None for p in parts):
            c_ms = ok("avg_compute_ms", sum(parts) / succ / 1000.0) if succ > 0 else None
        qu, inf_ = total("nv_inference_queue_duration_us"), total("nv_inference_compute_infer_duration_us")
        qcr = ok("queue_compute_ratio", qu / max(inf_, 1.0)) if qu is not None and inf_ is not None else None
        cnt, ex = total("nv_inference_count"), total("nv_inference_exec_count")
        batch = ok("avg_batch", cnt / ex) if cnt is not None and ex else None
        quant: dict[float, float] = {}
        for rw in rows:
            for q, v in rw.last.quantiles.items():
                quant[q] = max(quant.get(q, 0.0), v)
        is_avg = False
        p50, p95, p99 = (
            ok(n, quant[q] / 1000.0) if q in quant else None
            for n, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))
        )
        if p99 is None:
            avg = per_request("nv_inference_request_duration_us", "avg_request_ms")
            if avg is not None:
                p50 = p95 = p99 = avg
                is_avg = True
        pend_vals = [rw.last.pending for rw in rows if rw.last.pending is not None]
        pending = ok("pending", sum(pend_vals)) if pend_vals else None
        return ModelSignals(
            model=m,
            t_s=t_s,
            request_rate=rate,
            success_rate=succ,
            failure_rate=fail,
            avg_queue_ms=q_ms,
            avg_compute_ms=c_ms,
            queue_compute_ratio=qcr,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            latency_is_average=is_avg,
            latency_window_s=SUMMARY_WINDOW_S if p99 is not None and not is_avg else None,
            pending=pending,
            avg_batch=batch,
            ready_replicas=len(rows),
        )
