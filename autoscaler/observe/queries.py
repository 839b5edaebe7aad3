"""Every PromQL expression migscale runs, in one configurable place.

Used by ``observe.prometheus.PrometheusSource`` (the observe stage of the
loop) and by the Kubernetes manifests' recording rules. Each template is a
``string.Template``: ``$window`` is the rate window (e.g. ``30s``; the loop's
short and long windows are both rendered from the same template) and
``$sel`` the label matchers every Triton series gets (default: none).
PromQL's own braces stay literal, which is why this is not ``str.format``.

Triton metric names and NVIDIA's queue:compute signal: docs/metrics.md; DCGM on
MIG: docs/metrics.md. Results are grouped ``by (model)`` for model signals and
``by (model, replica)`` for replica signals; ``replica`` is the label the
controller's scrape configuration (file SD or PodMonitor relabelling) puts
on every Triton target, so rename ``replica_label`` if yours differs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from string import Template

# Triton keeps its latency summaries' quantiles (``summary_latencies=true``) over a
# sliding window of about a minute, longer than any rate window: a p99 read from them
# still holds a burst or an overload that the rates have forgotten (docs/metrics.md).
SUMMARY_WINDOW_S = 60.0


def promql_duration(seconds: float) -> str:
    """30 -> ``30s``; PromQL durations are integers with a unit."""
    s = max(1, round(seconds))
    return f"{s}s"


@dataclass(frozen=True)
class Queries:
    """Templates keyed by signal. Override any field to adapt to another setup."""

    model_label: str = "model"
    replica_label: str = "replica"
    pod_label: str = "pod"  # DCGM exporter's pod label (with --kubernetes=true)
    sel: str = ""  # extra matchers, e.g. 'job="triton"' -> {job="triton"}

    # requests/s: success + failure; "or" keeps the success rate when a model
    # has no failure series yet (Triton creates them lazily per reason)
    request_rate: str = (
        "(sum by (model) (rate(nv_inference_request_success$sel[$window]))"
        " + sum by (model) (rate(nv_inference_request_failure$sel[$window])))"
        " or sum by (model) (rate(nv_inference_request_success$sel[$window]))"
    )
    success_rate: str = "sum by (model) (rate(nv_inference_request_success$sel[$window]))"
    failure_rate: str = "sum by (model) (rate(nv_inference_request_failure$sel[$window]))"
    # average queue time per request, ms. No clamp on the divisor: an idle model's
    # average is undefined, and PromQL's 0/0 = NaN becomes None (never a fake 0).
    avg_queue_ms: str = (
        "sum by (model) (rate(nv_inference_queue_duration_us$sel[$window]))"
        " / sum by (model) (rate(nv_inference_request_success$sel[$window])) / 1000"
    )
    # average compute time per request (input + infer + output), ms
    avg_compute_ms: str = (
        "(sum by (model) (rate(nv_inference_compute_input_duration_us$sel[$window]))"
        " + sum by (model) (rate(nv_inference_compute_infer_duration_us$sel[$window]))"
        " + sum by (model) (rate(nv_inference_compute_output_duration_us$sel[$window])))"
        " / sum by (model) (rate(nv_inference_request_success$sel[$window])) / 1000"
    )
    # NVIDIA's reference HPA signal (Triton tutorials): triton:queue_compute:ratio
    queue_compute_ratio: str = (
        "sum by (model) (rate(nv_inference_queue_duration_us$sel[$window]))"
        " / clamp_min(sum by (model) (rate(nv_inference_compute_infer_duration_us$sel[$window])), 1)"
    )
    # quantiles need `--metrics-config summary_latencies=true`; worst replica wins
    p50_ms: str = 'max by (model) (nv_inference_request_summary_us{quantile="0.5"$and_sel}) / 1000'
    p95_ms: str = 'max by (model) (nv_inference_request_summary_us{quantile="0.95"$and_sel}) / 1000'
    p99_ms: str = 'max by (model) (nv_inference_request_summary_us{quantile="0.99"$and_sel}) / 1000'
    # fallback when there are no summaries: the mean end-to-end time, flagged as such
    avg_request_ms: str = (
        "sum by (model) (rate(nv_inference_request_duration_us$sel[$window]))"
        " / sum by (model) (rate(nv_inference_request_success$sel[$window])) / 1000"
    )
    pending: str = "sum by (model) (nv_inference_pending_request_count$sel)"
    avg_batch: str = (
        "sum by (model) (rate(nv_inference_count$sel[$window]))"
        " / sum by (model) (rate(nv_inference_exec_count$sel[$window]))"
    )
    # replicas that reported the success counter within the lookback
    ready_replicas: str = "count by (model) (count by (model, $replica) (nv_inference_request_success$sel))"
    # newest sample time per model: the signal's sample time (staleness check)
    sample_time: str = "max by (model) (timestamp(nv_inference_request_success$sel))"
    # per replica: seconds of compute per second = busy fraction
    busy_fraction: str = (
        "sum by (model, $replica) (rate(nv_inference_compute_infer_duration_us$sel[$window])) / 1e6"
    )
    replica_sample_time: str = "max by (model, $replica) (timestamp(nv_inference_request_success$sel))"
    # DCGM per MIG instance, joined to the replica by the pod label
    gr_engine_active: str = "max by ($pod) (DCGM_FI_PROF_GR_ENGINE_ACTIVE)"

    # names of the model-level templates PrometheusSource evaluates
    MODEL_SIGNALS = (
        "request_rate",
        "success_rate",
        "failure_rate",
        "avg_queue_ms",
        "avg_compute_ms",
        "queue_compute_ratio",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "avg_request_ms",
        "pending",
        "avg_batch",
        "ready_replicas",
        "sample_time",
    )
    REPLICA_SIGNALS = ("busy_fraction", "replica_sample_time", "gr_engine_active")

    def render(self, name: str, window_s: float = 30.0) -> str:
        """The PromQL for ``name`` over ``window_s``; KeyError for an unknown name."""
        if name not in {f.name for f in fields(self)} or name in (
            "model_label",
            "replica_label",
            "pod_label",
            "sel",
        ):
            raise KeyError(name)
        tpl = Template(getattr(self, name))
        sel = self.sel.strip()
        text = tpl.substitute(
            window=promql_duration(window_s),
            sel="{" + sel + "}" if sel else "",
            and_sel="," + sel if sel else "",
            replica=self.replica_label,
            pod=self.pod_label,
        )
        if self.model_label != "model":
            text = text.replace("by (model", f"by ({self.model_label}")
        return text

    def all_rendered(self, window_s: float = 30.0) -> dict[str, str]:
        return {n: self.render(n, window_s) for n in self.MODEL_SIGNALS + self.REPLICA_SIGNALS}
