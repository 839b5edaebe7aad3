"""The demo's report: a timeline PNG and a one-screen summary (pure functions of samples).

``autoscaler/runtime/demo.py`` records one ``Sample`` a second while the real stack
runs; this module turns the samples, locust's per-second stats history and its
SLO verdict into ``timeline.png`` and ``summary.md``/``summary.json``. Kept
apart from the orchestration so it can be tested on synthetic samples.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoscaler.mig.products import get_product


@dataclass
class Sample:
    t_s: float  # seconds since the load started
    offered_rps: dict[str, float] = field(default_factory=dict)  # the load shape's target
    served_rps: dict[str, float | None] = field(default_factory=dict)  # Triton's success rate
    p99_ms: dict[str, float | None] = field(default_factory=dict)  # server-side (Triton summaries)
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> profile -> ready
    gpus_in_use: int = 0
    slices_in_use: int = 0  # compute slices of instances that host a replica


def slices_in_use(status: Mapping) -> tuple[int, int]:
    """(GPUs, compute slices) occupied by replicas in a ``migscale status --json`` document."""
    gpus: set[str] = set()
    slices = 0
    products = {g["id"]: g.get("product") for g in status.get("gpus", []) if isinstance(g, dict)}
    for r in status.get("replicas", []):
        if r.get("state") not in ("ready", "starting", "draining"):
            continue
        if r.get("gpus"):  # a multinode group, listed once: every member holds a whole GPU
            gpus.update(r["gpus"])
            slices += sum(get_product(products[g]).compute_slices if g in products else 7 for g in r["gpus"])
            continue
        gpus.add(r["gpu"])
        prod = products.get(r["gpu"])
        try:
            slices += get_product(prod).profile(r["profile"]).compute if prod else 0
        except KeyError:
            slices += 7  # a whole GPU not listed as a group counts as all its slices
    return len(gpus), slices


def reaction_windows(offered: Sequence[tuple[float, Mapping[str, float]]], reaction_s: float,
                     min_rise: float = 0.2) -> list[tuple[float, float]]:
    """Windows [t, t+reaction_s] after every rise of a model's offered rate by > min_rise (20%).

    The SLO is judged outside these: no reactive autoscaler can serve a step
    before it has seen it, started a replica, and that replica is ready.
    """
    out: list[tuple[float, float]] = []
    if not offered:
        return out
    prev: Mapping[str, float] = offered[0][1]  # the starting rates are the baseline, not a rise
    for t, rates in offered[1:]:
        for m, r in rates.items():
            before = prev.get(m, 0.0)
            if r > before * (1 + min_rise) and r - before > 1.0:
                out.append((t, t + reaction_s))
                break
        prev = rates
    merged: list[tuple[float, float]] = []
    for a, b in sorted(out):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def slice_hours(samples: Sequence[Sample]) -> tuple[float, float]:
    """(used, static-peak): integral of slices in use vs the peak held for the whole run."""
    if len(samples) < 2:
        return 0.0, 0.0
    used = 0.0
    for a, b in itertools.pairwise(samples):
        used += a.slices_in_use * (b.t_s - a.t_s)
    span = samples[-1].t_s - samples[0].t_s
    peak = max(s.slices_in_use for s in samples)
    return used / 3600.0, peak * span / 3600.0


def locust_p99_history(csv_path: Path) -> dict[str, list[tuple[float, float]]]:
    """Per-model (t, p99 ms) from locust's ``--csv-full-history`` file (its ~10 s sliding window)."""
    out: dict[str, list[tuple[float, float]]] = {}
    if not csv_path.exists():
        return out
    t0: float | None = None
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            name = row.get("Name", "")
            if name in ("Aggregated", "") or row.get("99%", "N/A") in ("N/A", ""):
                continue
            t = float(row["Timestamp"])
            t0 = t if t0 is None else min(t0, t)
            out.setdefault(name, []).append((t, float(row["99%"])))
    if t0 is not None:
        out = {m: [(t - t0, v) for t, v in pts] for m, pts in out.items()}
    return out


def plot_timeline(samples: Sequence[Sample], slo_ms: Mapping[str, float], windows: Sequence[tuple[float, float]],
                  out: Path, client_p99: Mapping[str, list[tuple[float, float]]] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({m for s in samples for m in s.offered_rps} | {m for s in samples for m in s.replicas})
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(models)}
    t = [s.t_s for s in samples]
    fig, ax = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    for a in ax:
        for lo, hi in windows:
            a.axvspan(lo, hi, color="0.9", zorder=0)
    for m in models:
        c = colors[m]
        ax[0].plot(t, [s.offered_rps.get(m, 0.0) for s in samples], "--", color=c, lw=1, label=f"{m} offered")
        ax[0].plot(t, [s.served_rps.get(m) if s.served_rps.get(m) is not None else float("nan") for s in samples],
                   color=c, lw=1.8, label=f"{m} served")
        pts = (client_p99 or {}).get(m)
        if pts:
            ax[1].plot([p[0] for p in pts], [p[1] for p in pts], color=c, lw=1.8, label=f"{m} p99 (client)")
        else:
            ax[1].plot(t, [s.p99_ms.get(m) if s.p99_ms.get(m) is not None else float("nan") for s in samples],
                       color=c, lw=1.8, label=f"{m} p99 (server)")
        if m in slo_ms:
            ax[1].axhline(slo_ms[m], color=c, ls=":", lw=1.2)
        profiles = sorted({p for s in samples for p in s.replicas.get(m, {})})
        for p in profiles:
            ax[2].step(t, [s.replicas.get(m, {}).get(p, 0) for s in samples], where="post", color=c,
                       lw=1.6, ls="-" if p.startswith(("1g", "2g")) else "-.", label=f"{m} {p}")
    ax[3].step(t, [s.slices_in_use for s in samples], where="post", color="tab:purple", label="compute slices in use")
    ax3b = ax[3].twinx()
    ax3b.step(t, [s.gpus_in_use for s in samples], where="post", color="tab:gray", label="GPUs in use")
    ax[0].set_ylabel("req/s")
    ax[1].set_ylabel("p99 ms (dotted: SLO)")
    ax[1].set_yscale("log")
    ax[2].set_ylabel("ready replicas")
    ax[3].set_ylabel("slices")
    ax3b.set_ylabel("GPUs")
    ax[3].set_xlabel("seconds since load start (grey: reaction windows, not judged)")
    ax[0].set_title("migscale demo: load, latency, replicas by MIG profile, capacity in use")
    for a in ax[:3]:
        a.legend(fontsize=7, ncol=4, loc="upper left")
    h1, l1 = ax[3].get_legend_handles_labels()
    h2, l2 = ax3b.get_legend_handles_labels()
    ax[3].legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def first_ready_after_rise(samples: Sequence[Sample], model: str, rise_at_s: float) -> float | None:
    """Seconds from ``rise_at_s`` until ``model`` first has more READY replicas than it had
    at the rise (one-second samples, so within 1 s); None: no new replica became ready."""
    before = [s for s in samples if s.t_s <= rise_at_s]
    if not before:
        return None
    n0 = sum(before[-1].replicas.get(model, {}).values())
    for s in samples:
        if s.t_s > rise_at_s and sum(s.replicas.get(model, {}).values()) > n0:
            return round(s.t_s - rise_at_s, 1)
    return None


def p99_over_slo(checks: Sequence[Mapping]) -> dict[str, float]:
    """Per model, the client-side p99 outside the reaction windows over its SLO (locust's checks)."""
    out: dict[str, float] = {}
    for c in checks:
        try:
            if c.get("metric") == "p99_ms" and float(c["target"]) > 0:
                out[str(c["model"])] = round(float(c["actual"]) / float(c["target"]), 3)
        except (KeyError, TypeError, ValueError):
            continue  # a check without a number (no requests) has no ratio
    return out


def summarize(samples: Sequence[Sample], slo_verdict: Mapping | None, windows: Sequence[tuple[float, float]],
              decisions: int, scale_events: Sequence[str]) -> dict:
    used, static = slice_hours(samples)
    peak_replicas: dict[str, dict[str, int]] = {}
    for s in samples:
        for m, by in s.replicas.items():
            for p, n in by.items():
                peak_replicas.setdefault(m, {})[p] = max(peak_replicas.get(m, {}).get(p, 0), n)
    checks = list((slo_verdict or {}).get("checks", []))
    return {
        "slo_met_outside_reaction_windows": bool(slo_verdict and slo_verdict.get("passed")),
        "slo_checks": checks,
        "p99_over_slo_outside_windows": p99_over_slo(checks),
        "reaction_windows_s": [list(w) for w in windows],
        "slice_hours_used": round(used, 4),
        "slice_hours_static_peak": round(static, 4),
        "slice_hours_saved_ratio": round(1 - used / static, 3) if static > 0 else None,
        "peak_replicas_by_profile": peak_replicas,
        "duration_s": round(samples[-1].t_s - samples[0].t_s, 1) if samples else 0.0,
        "decisions": decisions,
        "scale_events": list(scale_events),
    }


def summary_markdown(summary: Mapping) -> str:
    lines = ["# migscale demo summary", ""]
    verdict = "MET" if summary["slo_met_outside_reaction_windows"] else "MISSED"
    lines.append(f"**SLO outside the reaction windows: {verdict}**  ")
    wins = ", ".join(f"{a:.0f}-{b:.0f} s" for a, b in summary["reaction_windows_s"]) or "none"
    lines.append(f"reaction windows (not judged): {wins}")
    if summary.get("first_new_replica_ready_after_rise_s") is not None:
        lines.append(f"first new {summary.get('hot_model')} replica ready "
                     f"{summary['first_new_replica_ready_after_rise_s']:g} s after the rise  ")
    ratios = summary.get("p99_over_slo_outside_windows") or {}
    if ratios:
        lines.append("p99 / SLO outside the windows: " + ", ".join(f"{m} {r:.2f}" for m, r in sorted(ratios.items())))
    lines.append("")
    lines.append("| model | metric | target | measured | ok |")
    lines.append("|---|---|---|---|---|")
    for c in summary["slo_checks"]:
        lines.append(f"| {c.get('model')} | {c.get('metric')} | {c.get('target')} | {c.get('actual')} | "
                     f"{'yes' if c.get('ok') else 'NO'} |")
    lines.append("")
    saved = summary["slice_hours_saved_ratio"]
    lines.append(
        f"slice-hours used: {summary['slice_hours_used']:.4f} vs static peak allocation "
        f"{summary['slice_hours_static_peak']:.4f}"
        + (f" ({saved:.0%} saved)" if saved is not None else "")
    )
    lines.append(f"decisions: {summary['decisions']}; scale events: {len(summary['scale_events'])}")
    for e in summary["scale_events"][:20]:
        lines.append(f"- {e}")
    return "\n".join(lines) + "\n"


def write_samples(samples: Sequence[Sample], path: Path) -> None:
    path.write_text("\n".join(json.dumps(asdict(s)) for s in samples) + "\n")
