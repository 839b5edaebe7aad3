"""Read one local replica's Triton ``/metrics`` directly (act/ side of the local backend).

Two consumers: the drain (is the replica idle: nothing pending, no request
finishing any more?) and ``migscale status`` (req/s and p99 per replica).
This is deliberately tiny and separate from the observe/ adapters, which
build the policy's Observation; a missing series is ``None``, never 0.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class ReplicaCounters:
    t_s: float
    pending: float | None  # nv_inference_pending_request_count (queued requests)
    completed: float | None  # nv_inference_request_success + nv_inference_request_failure
    p99_us: float | None  # nv_inference_request_summary_us{quantile="0.99"}, if summaries are on


@dataclass(frozen=True)
class ReplicaLoad:
    req_s: float | None
    p99_ms: float | None


def parse_counters(text: str, t_s: float) -> ReplicaCounters:
    sums: dict[str, float] = {}
    seen: set[str] = set()
    p99: float | None = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # prometheus_client names counter samples "<family>_total" even when
            # Triton's text has no suffix.
            name = s.name.removesuffix("_total")
            if name in (
                "nv_inference_pending_request_count",
                "nv_inference_request_success",
                "nv_inference_request_failure",
            ):
                seen.add(name)
                sums[name] = sums.get(name, 0.0) + s.value
            elif (
                name == "nv_inference_request_summary_us"
                and s.labels.get("quantile") in ("0.99", "0.990000")
                and not math.isnan(s.value)
            ):
                p99 = s.value if p99 is None else max(p99, s.value)
    completed = None
    if "nv_inference_request_success" in seen:
        completed = sums["nv_inference_request_success"] + sums.get("nv_inference_request_failure", 0.0)
    return ReplicaCounters(
        t_s=t_s,
        pending=sums.get("nv_inference_pending_request_count")
        if "nv_inference_pending_request_count" in seen
        else None,
        completed=completed,
        p99_us=p99,
    )


def scrape(url_metrics: str, t_s: float, timeout_s: float = 1.0) -> ReplicaCounters | None:
    """None when the replica cannot be read (down, timeout, garbage)."""
    try:
        with urllib.request.urlopen(url_metrics, timeout=timeout_s) as r:
            text = r.read().decode("utf-8", errors="replace")
        return parse_counters(text, t_s)
    except (OSError, ValueError):
        return None


def load_between(prev: ReplicaCounters | None, cur: ReplicaCounters | None) -> ReplicaLoad:
    """req/s from two counter samples (None across a restart or a gap); p99 from the newest."""
    if cur is None:
        return ReplicaLoad(None, None)
    p99_ms = cur.p99_us / 1000.0 if cur.p99_us is not None else None
    if prev is None or prev.completed is None or cur.completed is None or cur.t_s <= prev.t_s:
        return ReplicaLoad(None, p99_ms)
    delta = cur.completed - prev.completed
    if delta < 0:  # counter reset: the process restarted
        return ReplicaLoad(None, p99_ms)
    return ReplicaLoad(delta / (cur.t_s - prev.t_s), p99_ms)
