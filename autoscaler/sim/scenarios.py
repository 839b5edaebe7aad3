"""Synthetic model fleets and clusters for the simulator's benchmark and tests.

Place in the loop: input fixtures -- the ``models.yaml`` / ``cluster.yaml``
content a benchmark would otherwise read from disk, built programmatically so
the fleet's size and spread are parameters.

Capacity tables follow the *shapes* of the MIGPerf measurements on
A100-80GB (docs/profile-throughput.md), scaled per model:

- ``cnn-b1`` (ResNet-50 at batch 1): 1g 127, 2g 171, 3g 191, 7g 192 req/s --
  small slices are 4.6x more efficient per slice than a whole GPU;
- ``bert-b1`` (BERT-base at batch 1, ~11 ms on every profile): flat, so seven
  1g slices give ~7x one 7g;
- ``cnn-batch`` (ResNet-50 at large batch): 420/840/1479/3070, about linear;
- ``vit`` (ViT at large batch): 59.8/118/182/422;
- ``bert-batch`` (BERT-base at large batch): 642/1350/2245/4835.

4g is interpolated (4/3 of 3g, capped by 7g). Scale factors keep each model's
rates plausible for its SLO; the shape across profiles is what matters to
the policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoscaler.mig import get_product

SHAPES: dict[str, dict[str, float]] = {
    "cnn-b1": {"1g": 127, "2g": 171, "3g": 191, "7g": 192},
    "bert-b1": {"1g": 90, "2g": 90, "3g": 90, "7g": 90},
    "cnn-batch": {"1g": 420, "2g": 840, "3g": 1479, "7g": 3070},
    "vit": {"1g": 59.8, "2g": 118, "3g": 182, "7g": 422},
    "bert-batch": {"1g": 642, "2g": 1350, "3g": 2245, "7g": 4835},
}
SLO_MS = {"cnn-b1": 100.0, "bert-b1": 100.0, "cnn-batch": 100.0, "vit": 200.0, "bert-batch": 100.0}
A100_80 = {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb", "4g": "4g.40gb", "7g": "7g.80gb"}
A100_80GB = get_product("A100-SXM4-80GB")

# (shape, scale, memory_gb): 12 models, light ones dominate as in production fleets. Scales
# stand for dynamic batching at the SLO and keep capacity x SLO >= ~18 requests on the smallest
# slice: below that a p99 target leaves almost no room for queueing (see sim/queueing.py).
FLEET_12: tuple[tuple[str, float, float], ...] = (
    ("cnn-b1", 2.0, 4), ("cnn-b1", 3.0, 4), ("cnn-b1", 1.6, 6),
    ("bert-b1", 2.0, 4), ("bert-b1", 2.4, 6), ("bert-b1", 2.0, 8),
    ("cnn-batch", 1.0, 8), ("cnn-batch", 0.6, 12),
    ("vit", 2.0, 16), ("vit", 3.0, 18),
    ("bert-batch", 0.5, 8), ("bert-batch", 0.6, 14),
)


def capacity_table(shape: str, scale: float) -> dict[str, float]:
    s = SHAPES[shape]
    four = min(s["3g"] * 4 / 3, s["7g"])
    kinds = {**s, "4g": four}
    return {A100_80[k]: round(v * scale, 2) for k, v in kinds.items()}


def fleet(n: int = 12, max_replicas: int = 48) -> list[dict[str, Any]]:
    """``models.yaml`` entries for ``n`` models cycling through ``FLEET_12``."""
    out = []
    for i in range(n):
        shape, scale, mem = FLEET_12[i % len(FLEET_12)]
        cap = capacity_table(shape, scale)
        # a profile that holds less than the model's memory cannot host it
        allowed = [p for p in cap if A100_80GB.profile(p).fit_gib >= mem]
        out.append({
            "name": f"{shape}-{i}",
            "model_dir": f"triton_models/{shape}-{i}",
            "slo": {"p99_ms": SLO_MS[shape]},
            "profiles": allowed,
            "memory_gb": mem,
            "min_replicas": 1,
            "max_replicas": max_replicas,
            "capacity": {p: cap[p] for p in allowed},
        })
    return out


def cluster(n_gpus: int = 16, product: str = "A100-SXM4-80GB", policy: dict[str, Any] | None = None,
            layout: Sequence[str] | None = None) -> dict[str, Any]:
    """``cluster.yaml`` content: ``n_gpus`` GPUs on 8-GPU nodes, optional policy overrides."""
    gpus = []
    left, node = n_gpus, 0
    while left > 0:
        count = min(8, left)
        g: dict[str, Any] = {"node": f"node-{node}", "product": product, "count": count}
        if layout is not None:
            g["layout"] = list(layout)
        gpus.append(g)
        left -= count
        node += 1
    out: dict[str, Any] = {"gpus": gpus}
    if policy:
        out["policy"] = policy
    return out


def best_slice_rps(model: dict[str, Any]) -> float:
    """req/s per compute slice of the model's most efficient profile."""
    return max(c / int(p.split("g")[0]) for p, c in model["capacity"].items())
