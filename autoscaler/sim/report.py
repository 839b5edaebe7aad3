"""Simulation results as text, JSON and a PNG (after the loop: what a run amounted to).

The plot has three panels over time: total demand vs the capacity-at-SLO of
READY replicas, GPUs in use, and the worst model's p99 as a multiple of its
SLO (1.0 = at target). Several results (one per policy) share the axes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autoscaler.sim.run import Result

COLORS = {"migscale": "tab:green", "hpa-queue": "tab:orange", "hpa-util": "tab:red",
          "static-peak": "tab:gray", "oracle": "tab:blue"}


def to_json(result: Result) -> str:
    return json.dumps(result.to_json(), sort_keys=False)


def table(results: Sequence[Result]) -> str:
    """One line per policy: the headline numbers, aligned, and the model furthest from its SLO
    (the overall figure is request-weighted, so a small model's misses hide in it)."""
    head = (f"{'policy':<12} {'SLO':>9} {'GPU-h':>9} {'slice-h':>9} {'reconf':>7} {'recov_s':>8} {'GPUs':>5}"
            "  worst model")
    lines = [head]
    for r in results:
        worst = min(r.per_model.items(), key=lambda kv: kv[1], default=None)
        lines.append(f"{r.policy:<12} {r.slo_attainment * 100:8.3f}% {r.gpu_hours:9.2f} {r.slice_hours:9.2f} "
                     f"{r.reconfigurations:7d} {r.recovery_s:8.0f} {r.gpus_provisioned:5d}"
                     + (f"  {worst[0]} {worst[1] * 100:.2f}%" if worst else ""))
    return "\n".join(lines)


def _bin(t: np.ndarray, y: np.ndarray, width_s: float, how: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """Downsample for plotting (a day at 5 s is 17,280 points)."""
    if len(t) == 0:
        return t, y
    step = t[1] - t[0] if len(t) > 1 else width_s
    k = max(1, round(width_s / step))
    n = len(y) // k * k
    if n == 0:
        return t, y
    yy = y[:n].reshape(-1, k)
    out = np.nanmax(yy, axis=1) if how == "max" else np.nanmean(yy, axis=1)
    return t[:n:k], out


def plot(results: Sequence[Result], out: str | Path, title: str = "") -> Path:
    """Write the three-panel PNG, 5-minute bins. static-peak is drawn but the axes are scaled to
    the dynamic policies (its level is in the legend); the oracle draws its GPU line only."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    width = 300.0
    demand_drawn = False
    top_rps, top_gpus = 0.0, 0.0
    for r in results:
        tl = r.timeline
        if tl is None:
            continue
        color = COLORS.get(r.policy)
        if not demand_drawn:
            t, d = _bin(tl.t_s, tl.demand_rps.sum(axis=0), width)
            ax[0].plot(t / 3600.0, d, color="black", lw=1.2, label="demand")
            top_rps = max(top_rps, float(np.nanmax(d)) * 2.5)
            demand_drawn = True
        t, g = _bin(tl.t_s, tl.gpus_in_use, width)
        ls = "--" if r.policy == "oracle" else "-"
        ax[1].plot(t / 3600.0, g, color=color, lw=0.9, ls=ls, label=f"{r.policy} ({r.gpu_hours:.0f} GPU-h, "
                   f"peak {float(np.max(tl.gpus_in_use)):.0f})")
        if r.policy != "static-peak":
            top_gpus = max(top_gpus, float(np.nanmax(g)) * 1.3)
        if r.policy == "oracle":
            continue
        t, c = _bin(tl.t_s, tl.capacity_rps.sum(axis=0), width)
        ax[0].plot(t / 3600.0, c, color=color, lw=0.9, label=f"{r.policy} capacity at SLO")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ratio = tl.p99_ms / tl.slo_ms[:, None]
            # per model: mean over the bin; then the worst model of the bin
            per_model = np.array([_bin(tl.t_s, row, width)[1] for row in ratio])
            t = _bin(tl.t_s, ratio[0], width)[0]
            worst = np.nanmax(per_model, axis=0)
        ax[2].plot(t / 3600.0, worst, color=color, lw=0.9,
                   label=f"{r.policy} (SLO attainment {r.slo_attainment * 100:.2f}%)")
    if top_rps:
        ax[0].set_ylim(0, top_rps)
    if top_gpus:
        ax[1].set_ylim(0, top_gpus)
    ax[0].set_ylabel("req/s (sum of models)")
    ax[0].set_title(title or "demand vs capacity at SLO")
    ax[1].set_ylabel("GPUs in use")
    ax[2].set_ylabel("worst model: p99 / SLO")
    ax[2].axhline(1.0, color="black", ls="--", lw=0.8)
    ax[2].set_yscale("log")
    ax[2].set_xlabel("hours")
    for a in ax:
        a.legend(fontsize=7, loc="upper right")
        a.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
