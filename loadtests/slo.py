"""The SLO verdict of a load test: did every model meet its latency and error targets?

This sits *after* the loop: it judges what the autoscaler delivered. During a
locust run, ``SloRecorder`` counts only requests outside the excluded windows
(warm-up, and the reaction windows in which the autoscaler is expected to be
catching up with a spike), and keeps the successful ones' latencies to 0.1%
(``LatencyHistogram``: locust's own percentiles are rounded to 10 ms above
100 ms, which a ``<=`` comparison would read as a pass). At the
``quitting`` event the verdict is printed as a table, written as JSON to the
results directory, and a miss sets ``environment.process_exit_code = 1``.

The verdict itself (``verdict``) is pure and unit-tested without locust.
Missing data is never a pass: a model with an SLO but no judged requests fails
with "no requests measured".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class SloSpecError(ValueError):
    """A malformed SLO argument; the message names the argument and the value."""


@dataclass(frozen=True)
class SloTarget:
    p99_ms: float | None = None
    p95_ms: float | None = None
    p50_ms: float | None = None
    # 1% failed requests: a replica restart during a spike can fail a handful of
    # in-flight requests; more than 1 in 100 is an outage, not a blip.
    max_error_rate: float = 0.01


@dataclass(frozen=True)
class ModelResult:
    model: str
    requests: int
    failures: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @property
    def error_rate(self) -> float | None:
        return self.failures / self.requests if self.requests else None


@dataclass(frozen=True)
class Check:
    model: str
    metric: str
    target: float | None
    actual: float | None
    ok: bool
    note: str = ""


@dataclass
class Verdict:
    passed: bool
    checks: list[Check] = field(default_factory=list)
    results: dict[str, ModelResult] = field(default_factory=dict)
    excluded_windows_s: list[tuple[float, float]] = field(default_factory=list)

    @property
    def missed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "excluded_windows_s": [list(w) for w in self.excluded_windows_s],
            "models": {
                m: {**asdict(r), "error_rate": r.error_rate} for m, r in sorted(self.results.items())
            },
            "checks": [asdict(c) for c in self.checks],
        }

    def table(self) -> str:
        rows = [("model", "metric", "target", "actual", "verdict")]
        for c in self.checks:
            rows.append((
                c.model,
                c.metric,
                _fmt(c.target, c.metric),
                _fmt(c.actual, c.metric) if c.actual is not None else (c.note or "n/a"),
                "ok" if c.ok else "MISS",
            ))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"SLO verdict: {'PASS' if self.passed else 'FAIL'}"
                     + (f" ({len(self.missed)} missed)" if not self.passed else ""))
        return "\n".join(lines)


def _fmt(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    if metric == "error_rate":
        return f"{100 * v:.2f}%"
    if metric == "run_s":
        return f"{v:.0f} s"
    return f"{v:.1f} ms"


def verdict(
    results: Mapping[str, ModelResult],
    targets: Mapping[str, SloTarget],
    excluded_windows_s: Sequence[tuple[float, float]] = (),
    ran_s: float | None = None,
    planned_s: float | None = None,
) -> Verdict:
    """Check each model that has a target; models without a target are reported but not judged.
    With no target at all the verdict fails: nothing was judged. A run that stopped more than a
    second before ``planned_s`` (Ctrl-C, SIGTERM) fails as interrupted: the part it never sent
    (a spike) is no pass."""
    checks: list[Check] = []
    for model in sorted(targets):
        t = targets[model]
        r = results.get(model)
        if r is None or r.requests == 0:
            checks.append(Check(model, "requests", None, None, False, "no requests measured"))
            continue
        for metric in ("p50_ms", "p95_ms", "p99_ms"):
            target = getattr(t, metric)
            if target is None:
                continue
            actual = getattr(r, metric)
            checks.append(Check(model, metric, target, actual, actual is not None and actual <= target,
                                "" if actual is not None else "no successful requests"))
        er = r.error_rate
        checks.append(Check(model, "error_rate", t.max_error_rate, er, er is not None and er <= t.max_error_rate))
    if not checks:  # nothing judged is no pass
        checks.append(Check("-", "models", None, None, False, "no model has a target to judge"))
    if ran_s is not None and planned_s is not None and ran_s < planned_s - 1.0:
        checks.append(Check("-", "run_s", planned_s, ran_s, False, "interrupted"))
    return Verdict(passed=all(c.ok for c in checks), checks=checks, results=dict(results),
                   excluded_windows_s=list(excluded_windows_s))


# ---------------------------------------------------------------- argument parsing


def parse_windows(text: str | None) -> list[tuple[float, float]]:
    """``"0-10,48-60"`` -> [(0, 10), (48, 60)]: seconds since the test started, end exclusive."""
    out: list[tuple[float, float]] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            a, b = (float(x) for x in part.split("-", 1))
        except ValueError:
            raise SloSpecError(f"slo-ignore: each window must be START-END in seconds, got {part!r}") from None
        if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b <= a:
            raise SloSpecError(f"slo-ignore: window must have 0 <= START < END, got {part!r}")
        out.append((a, b))
    return out


def in_windows(t_s: float, windows: Iterable[tuple[float, float]]) -> bool:
    return any(a <= t_s < b for a, b in windows)


def parse_slo_overrides(text: str | None) -> dict[str, dict[str, float]]:
    """``"resnet:p99_ms=5;bert:p99_ms=40,max_error_rate=0"`` -> per-model target fields."""
    allowed = {"p50_ms", "p95_ms", "p99_ms", "max_error_rate"}
    out: dict[str, dict[str, float]] = {}
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            raise SloSpecError(f"slo: each item must be MODEL:key=value[,key=value], got {part!r}")
        model, kvs = part.split(":", 1)
        fields: dict[str, float] = {}
        for kv in kvs.split(","):
            if "=" not in kv:
                raise SloSpecError(f"slo.{model}: expected key=value, got {kv!r}")
            k, v = (x.strip() for x in kv.split("=", 1))
            if k not in allowed:
                raise SloSpecError(f"slo.{model}.{k}: unknown target (allowed: {sorted(allowed)}), got {k!r}")
            try:
                fv = float(v)
            except ValueError:
                raise SloSpecError(f"slo.{model}.{k}: must be a number, got {v!r}") from None
            if not math.isfinite(fv) or fv < 0:
                raise SloSpecError(f"slo.{model}.{k}: must be >= 0, got {v!r}")
            fields[k] = fv
        out[model.strip()] = fields
    return out


def targets_from_models(
    models_yaml: str | None,
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    only: Iterable[str] | None = None,
    max_error_rate: float = 0.01,
) -> dict[str, SloTarget]:
    """SLO targets from ``models.yaml`` (via ``autoscaler.config.schema.load_models``), then overrides."""
    base: dict[str, dict[str, float | None]] = {}
    if models_yaml:
        from autoscaler.config import load_models

        cfg = load_models(models_yaml)
        for m in cfg.models:
            slo = getattr(m, "slo", None)
            base[m.name] = {k: getattr(slo, k, None) for k in ("p50_ms", "p95_ms", "p99_ms")}
    for model, fields in (overrides or {}).items():
        base.setdefault(model, {}).update(fields)
    wanted = set(only) if only is not None else None
    out = {}
    for model, fields in base.items():
        if wanted is not None and model not in wanted:
            continue
        f = dict(fields)
        f.setdefault("max_error_rate", max_error_rate)
        out[model] = SloTarget(**{k: (float(v) if v is not None else None) for k, v in f.items()})
    return out


# ---------------------------------------------------------------- locust side


class LatencyHistogram:
    """Latencies in buckets 0.1% wide, read back at each bucket's upper edge.

    locust's own percentiles round a response time to 1 ms below 100 ms, to 10 ms
    below 1 s and to 100 ms above, and a verdict compares with ``<=``: a p99 of
    154.9 ms would read 150 and pass a 150 ms target. Here a percentile is never
    below the true one and at most 0.1% above it, so a miss is never read as a pass;
    memory is bounded by the range (about 21,000 buckets from 1 us to 10^4 s).
    """

    STEP = 1.001
    FLOOR_MS = 0.001

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0

    def add(self, ms: float) -> None:
        b = math.ceil(math.log(max(ms, self.FLOOR_MS)) / math.log(self.STEP) - 1e-9)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1

    def percentile(self, q: float) -> float | None:
        """The nearest-rank q-quantile (0 < q <= 1), as its bucket's upper edge; None when empty."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n - 1e-9))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return self.STEP ** b
        raise AssertionError("unreachable: the ranks add up to n")


class SloRecorder:
    """Counts only the requests outside excluded windows, per model: requests, failures, and the
    latencies of the successful ones (``LatencyHistogram``): a failed request's time is no latency
    the model served, so a model whose every request failed has no percentile to pass.

    The window clock starts at ``test_start`` (the first tick of the load shape), so
    ``--slo-warmup-s 5`` means "ignore requests sent in the first 5 s of load".
    """

    def __init__(self, windows: Sequence[tuple[float, float]]) -> None:
        self.windows = list(windows)
        self.requests: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.latency: dict[str, LatencyHistogram] = {}
        self.started: float | None = None
        self.excluded = 0

    def start(self, **_kw: Any) -> None:
        if self.started is None:
            self.started = time.time()

    def on_request(self, request_type: str, name: str, response_time: float, response_length: int,
                   exception: BaseException | None = None, **_kw: Any) -> None:
        t = time.time() - (self.started if self.started is not None else time.time())
        # judge by when the request was sent, not when it came back
        t -= (response_time or 0) / 1000.0
        if in_windows(t, self.windows):
            self.excluded += 1
            return
        # one model over several request types (http and grpc in one run) is judged as one
        self.requests[name] = self.requests.get(name, 0) + 1
        if exception is not None:
            self.failures[name] = self.failures.get(name, 0) + 1
        else:
            self.latency.setdefault(name, LatencyHistogram()).add(float(response_time or 0.0))

    def results(self) -> dict[str, ModelResult]:
        out = {}
        for name, n in self.requests.items():
            h = self.latency.get(name) or LatencyHistogram()
            p50, p95, p99 = (h.percentile(q) for q in (0.5, 0.95, 0.99))
            out[name] = ModelResult(name, n, self.failures.get(name, 0), p50, p95, p99)
        return out


def install(environment: Any, targets: Mapping[str, SloTarget], windows: Sequence[tuple[float, float]],
            results_dir: str | None, planned_s: float | None = None) -> SloRecorder:
    """Hook the recorder into a locust Environment; the verdict is taken at ``quitting``, of what
    ran against ``planned_s`` (``verdict``)."""
    rec = SloRecorder(windows)
    if results_dir:  # an earlier run's verdict must never stand for this one
        (Path(results_dir) / "slo.json").unlink(missing_ok=True)
    environment.events.test_start.add_listener(rec.start)
    environment.events.request.add_listener(rec.on_request)

    def on_quitting(environment: Any, **_kw: Any) -> None:
        ran_s = time.time() - rec.started if rec.started is not None else 0.0
        opts = getattr(environment, "parsed_options", None)
        if getattr(opts, "csv_prefix", None):
            # locust rewrites its CSV files once a second (CSV_STATS_INTERVAL_SEC) and does not
            # write them again at exit; one more interval makes the files hold the final counts
            import gevent
            from locust.stats import CSV_STATS_INTERVAL_SEC

            gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)
        if not targets:
            # locust run by hand as a plain load generator: no verdict, locust's own exit code
            print("SLO verdict: none (no targets: --models-yaml or --slo gives them)", flush=True)
            return
        v = verdict(rec.results(), targets, windows, ran_s=ran_s, planned_s=planned_s)
        interrupted = any(c.metric == "run_s" for c in v.checks)
        print(v.table(), flush=True)
        if results_dir:
            p = Path(results_dir)
            p.mkdir(parents=True, exist_ok=True)
            doc = v.to_json() | {"requests_excluded": rec.excluded, "interrupted": interrupted,
                                 "ran_s": round(ran_s, 1), "planned_s": planned_s}
            tmp = p / ".slo.json.tmp"
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            tmp.replace(p / "slo.json")  # whole or not at all
        # every judged model met its targets, including the error budget: a few failed
        # requests inside that budget must not fail the run through locust's own rule
        environment.process_exit_code = 0 if v.passed else 1

    environment.events.quitting.add_listener(on_quitting)
    return rec
