"""``PrometheusSource``: the observe stage reading Triton and DCGM series from Prometheus.

Implements ``protocols.MetricsSource`` with prometheus-api-client and the
PromQL in ``observe.queries``. Rules this adapter enforces before anything
reaches the pure policy:

- every value carries its sample time (``timestamp()`` of the newest sample
  of the model's success counter; the query's evaluation time otherwise);
- absent, stale (older than ``metrics_stale_s``), NaN, Inf, negative or
  absurdly large values become None, each with a note that starts with
  ``invalid_metric`` (``last_notes``; the loop copies them into
  ``Observation.notes``);
- when no query at all can be answered (Prometheus down), ``read`` raises
  ``PrometheusUnavailable`` so the loop marks the tick blind and holds.

``prefetch`` sends a tick's queries ahead of its ``read`` (the Kubernetes
runtime calls it before the backend's writes of the tick, so the two sets of
round trips overlap instead of adding up); the next ``read`` takes those
answers if they are at most ``PREFETCH_MAX_AGE_S`` old, and asks afresh
otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from autoscaler.observe.queries import SUMMARY_WINDOW_S, Queries
from autoscaler.policy.types import ModelSignals, Reason, ReplicaSignals

# Largest believable value per signal; beyond it a value is a bug or an
# overflow, not a measurement (10 million req/s on one model, 1 hour latency).
LIMITS: Mapping[str, float] = {
    "request_rate": 1e7,
    "success_rate": 1e7,
    "failure_rate": 1e7,
    "avg_queue_ms": 3.6e6,
    "avg_compute_ms": 3.6e6,
    "queue_compute_ratio": 1e6,
    "p50_ms": 3.6e6,
    "p95_ms": 3.6e6,
    "p99_ms": 3.6e6,
    "avg_request_ms": 3.6e6,
    "pending": 1e8,
    "avg_batch": 1e5,
    "ready_replicas": 1e5,
    "busy_fraction": 1e3,  # >1 with several model instances per replica
    "gr_engine_active": 1.5,  # a 0..1 ratio; GR_ENGINE_ACTIVE may read slightly >1 on some versions
}


# Queries in flight at once: what one Prometheus answers without queueing them
# (its --query.max-concurrency defaults to 20), small enough to stay polite.
QUERY_CONCURRENCY = 4
# Oldest prefetched answers a read still takes: a prefetch belongs to the tick
# that sent it (sent just before the tick's own start); answers from a tick that
# never read them (it failed first) are older than this by the next one.
PREFETCH_MAX_AGE_S = 5.0


def _drop(sent: tuple[ThreadPoolExecutor, list[Future]]) -> None:
    """Give up on sent queries: those not started are cancelled, the pool ends without waiting."""
    pool, futures = sent
    for f in futures:
        f.cancel()
    pool.shutdown(wait=False)


class PrometheusUnavailable(ConnectionError):
    """No query could be answered: the loop treats the tick as blind."""


def check_value(
    name: str, value: Any, sample_t: float | None, now_s: float, stale_s: float
) -> tuple[float | None, str | None]:
    """(value, None) when usable, else (None, note) naming the signal and what was wrong."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None, f"{Reason.INVALID_METRIC.value}: {name} is not a number, got {value!r}"
    if math.isnan(v) or math.isinf(v):
        return None, f"{Reason.INVALID_METRIC.value}: {name} is {v}"
    if v < 0:
        return None, f"{Reason.INVALID_METRIC.value}: {name} is negative, got {v}"
    limit = LIMITS.get(name, 1e12)
    if v > limit:
        return None, f"{Reason.INVALID_METRIC.value}: {name} above {limit:g}, got {v:g}"
    if sample_t is not None and now_s - sample_t > stale_s:
        return (
            None,
            f"{Reason.INVALID_METRIC.value}: {name} is stale ({now_s - sample_t:.0f}s old > {stale_s:g}s)",
        )
    return v, None


QueryFn = Callable[[str], list]


class PrometheusSource:
    """Reads model and replica signals; see the module docstring for the rules.

    ``window_s``: the rate window. Keep it >= 2 scrape intervals (a rate
    needs two samples) -- 30 s with a 5 s scrape. The policy builds its own
    short and long windows from successive reads.
    ``pod_to_replica``: maps DCGM's pod label to a replica id (identity: in
    Kubernetes a replica is a pod).
    """

    NAMES = Queries.MODEL_SIGNALS + Queries.REPLICA_SIGNALS  # every query a read sends

    def __init__(
        self,
        url: str = "http://127.0.0.1:9090",
        queries: Queries | None = None,
        window_s: float = 30.0,
        metrics_stale_s: float = 60.0,
        timeout_s: float = 5.0,
        pod_to_replica: Callable[[str], str | None] | None = None,
        query_fn: QueryFn | None = None,
    ) -> None:
        self.url = url
        self.queries = queries or Queries()
        self.window_s = window_s
        self.metrics_stale_s = metrics_stale_s
        self.timeout_s = timeout_s
        self.pod_to_replica = pod_to_replica or (lambda pod: pod)
        self._query = query_fn or self._client_query()
        self.last_notes: tuple[str, ...] = ()
        self.read_calls = 0
        self.prefetched_reads = 0  # reads that took a prefetch's answers
        self._prefetched: tuple[float, tuple[ThreadPoolExecutor, list[Future]]] | None = None

    def _client_query(self) -> QueryFn:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        # no client-side retries: the loop retries on the next tick
        prom = PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=0), timeout=self.timeout_s)

        def query(q: str) -> list:
            return prom.custom_query(query=q)

        return query

    def _start(self) -> tuple[ThreadPoolExecutor, list[Future]]:
        """Send every query, ``QUERY_CONCURRENCY`` at a time (Prometheus evaluates them in
        parallel; one after another, 18 round trips are most of a tick at 200 models)."""
        def one(n: str) -> list | BaseException:
            try:
                return self._query(self.queries.render(n, self.window_s)) or []
            except Exception as exc:  # noqa: BLE001 - one failing query is a missing signal, not an outage
                return exc

        # A pool per read: its threads end with the read (no lifecycle to leak), and
        # starting four threads costs about a millisecond against a 5-15 s tick.
        pool = ThreadPoolExecutor(QUERY_CONCURRENCY, thread_name_prefix="prom-query")
        return pool, [pool.submit(one, n) for n in self.NAMES]

    def _collect(self, sent: tuple[ThreadPoolExecutor, list[Future]], notes: list[str]) -> tuple[dict[str, list], int]:
        """The answers of ``_start``, in the order of ``NAMES`` whatever order they came in."""
        pool, futures = sent
        try:
            answers = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False)
        results: dict[str, list] = {}
        failed = 0
        for n, got in zip(self.NAMES, answers):
            if isinstance(got, BaseException):
                failed += 1
                notes.append(f"{Reason.INVALID_METRIC.value}: query {n} failed: {type(got).__name__}: {got}")
            else:
                results[n] = got
        return results, failed

    def prefetch(self, now_s: float) -> None:
        """Send this tick's queries now; the next ``read`` (within ``PREFETCH_MAX_AGE_S``) takes the answers."""
        if self._prefetched is not None:
            _drop(self._prefetched[1])
        self._prefetched = (now_s, self._start())

    def read(
        self, models: Sequence[str], replicas: Sequence[str], now_s: float
    ) -> tuple[Mapping[str, ModelSignals | None], Mapping[str, ReplicaSignals]]:
        self.read_calls += 1
        notes: list[str] = []
        pre, self._prefetched = self._prefetched, None
        if pre is not None and 0.0 <= now_s - pre[0] <= PREFETCH_MAX_AGE_S:
            self.prefetched_reads += 1
            sent = pre[1]
        else:
            if pre is not None:
                _drop(pre[1])
            sent = self._start()
        results, failed = self._collect(sent, notes)
        if failed == len(self.NAMES):
            self.last_notes = tuple(notes)
            raise PrometheusUnavailable(
                f"Prometheus at {self.url}: every query failed ({notes[0] if notes else ''})"
            )
        ml, rl = self.queries.model_label, self.queries.replica_label
        by_model: dict[str, dict[str, tuple[Any, float]]] = {}
        for n in Queries.MODEL_SIGNALS:
            for item in results.get(n, []):
                m = item.get("metric", {}).get(ml)
                if m is None or m not in models:
                    continue
                ts, val = item.get("value", [None, None])
                by_model.setdefault(m, {})[n] = (val, float(ts) if ts is not None else now_s)
        out: dict[str, ModelSignals | None] = {}
        for m in models:
            raw = by_model.get(m)
            if not raw or "request_rate" not in raw and "success_rate" not in raw:
                notes.append(f"{Reason.HOLD_MISSING_METRICS.value}: {m}: no request series in Prometheus")
                out[m] = None
                continue
            out[m] = self._model_signals(m, raw, now_s, notes)
        out_r = self._replica_signals(results, set(replicas), rl, now_s, notes)
        self.last_notes = tuple(notes)
        return out, out_r

    def _model_signals(self, m: str, raw: dict[str, tuple[Any, float]], now_s: float, notes: list[str]):
        t_s = None
        if "sample_time" in raw:
            t_s, note = check_value("sample_time", raw["sample_time"][0], None, now_s, self.metrics_stale_s)
            if note:
                notes.append(f"{m}: {note}")
        if t_s is None:
            t_s = max(ts for _, ts in raw.values())  # evaluation time: the best we know
        if now_s - t_s > self.metrics_stale_s:
            notes.append(
                f"{Reason.INVALID_METRIC.value}: {m}: newest sample is stale "
                f"({now_s - t_s:.0f}s old > {self.metrics_stale_s:g}s)"
            )
            return None
        vals: dict[str, float | None] = {}
        for n in Queries.MODEL_SIGNALS:
            if n == "sample_time":
                continue
            if n not in raw:
                vals[n] = None
                continue
            v, note = check_value(n, raw[n][0], t_s, now_s, self.metrics_stale_s)
            if note:
                notes.append(f"{m}: {note}")
            vals[n] = v
        rate = vals["request_rate"]
        if rate is None and vals["success_rate"] is not None and "request_rate" not in raw:
            rate = vals["success_rate"]
        p50, p95, p99 = vals["p50_ms"], vals["p95_ms"], vals["p99_ms"]
        is_avg = False
        if p99 is None and vals["avg_request_ms"] is not None:
            p50 = p95 = p99 = vals["avg_request_ms"]
            is_avg = True
        rr = vals["ready_replicas"]
        return ModelSignals(
            model=m,
            t_s=t_s,
            request_rate=rate,
            success_rate=vals["success_rate"],
            failure_rate=vals["failure_rate"],
            avg_queue_ms=vals["avg_queue_ms"],
            avg_compute_ms=vals["avg_compute_ms"],
            queue_compute_ratio=vals["queue_compute_ratio"],
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            latency_is_average=is_avg,
            latency_window_s=SUMMARY_WINDOW_S if p99 is not None and not is_avg else None,
            pending=vals["pending"],
            avg_batch=vals["avg_batch"],
            ready_replicas=int(rr) if rr is not None else None,
        )

    def _replica_signals(self, results, replicas: set[str], rl: str, now_s: float, notes: list[str]):
        ml, pl = self.queries.model_label, self.queries.pod_label
        rows: dict[str, dict[str, Any]] = {}
        for item in results.get("replica_sample_time", []):
            lab = item.get("metric", {})
            r = lab.get(rl)
            if r in replicas:
                t, note = check_value(
                    "replica_sample_time", item["value"][1], None, now_s, self.metrics_stale_s
                )
                rows.setdefault(r, {"model": lab.get(ml, "")})["t_s"] = t
        for item in results.get("busy_fraction", []):
            lab = item.get("metric", {})
            r = lab.get(rl)
            if r in replicas:
                row = rows.setdefault(r, {"model": lab.get(ml, "")})
                row["busy"] = (item["value"][1], float(item["value"][0]))
        for item in results.get("gr_engine_active", []):
            pod = item.get("metric", {}).get(pl)
            r = self.pod_to_replica(pod) if pod is not None else None
            if r in replicas:
                row = rows.setdefault(r, {"model": ""})
                row["dcgm"] = (item["value"][1], float(item["value"][0]))
        out: dict[str, ReplicaSignals] = {}
        for r, row in rows.items():
            t_s = row.get("t_s")
            fields: dict[str, float | None] = {}
            for key, name in (("busy", "busy_fraction"), ("dcgm", "gr_engine_active")):
                if key in row:
                    v, note = check_value(name, row[key][0], t_s, now_s, self.metrics_stale_s)
                    if note:
                        notes.append(f"{r}: {note}")
                    fields[name] = v
                    if t_s is None:
                        t_s = row[key][1]
            out[r] = ReplicaSignals(
                replica=r,
                model=row.get("model", ""),
                t_s=t_s,
                busy_fraction=fields.get("busy_fraction"),
                gr_engine_active=fields.get("gr_engine_active"),
            )
        return out
