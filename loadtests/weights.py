"""Per-model traffic weights from the command line or a file (which share of requests goes where).

Input to the load generators outside the loop; no locust import, so unit tests
and the simulator can use it without gevent's monkey-patching.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def parse_weights(text: str | None) -> dict[str, float]:
    """``"resnet:3,bert:1"`` -> {"resnet": 3.0, "bert": 1.0}; a bare name has weight 1."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, w = part.partition(":")
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            raise ValueError(f"models: weight of {name!r} must be a number, got {w!r}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"models: weight of {name!r} must be >= 0, got {w!r}")
        out[name.strip()] = weight
    return out


def weights_from_file(path: str) -> dict[str, float]:
    """A YAML/JSON mapping ``{model: weight}``, or a models.yaml (every model, weight 1 or its
    ``weight`` field when present)."""
    from autoscaler.config.io import load_yaml  # the one YAML reader: YAML 1.2 numbers, size and alias limits

    doc = load_yaml(path)
    if isinstance(doc, Mapping) and "models" in doc and isinstance(doc["models"], list):
        return {str(m["name"]): float(m.get("weight", 1.0)) for m in doc["models"] if "name" in m}
    if isinstance(doc, Mapping) and isinstance(doc.get("weights", None), Mapping):
        doc = doc["weights"]
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: expected a mapping of model -> weight, got {type(doc).__name__}")  # noqa: TRY004 - bad input, reported as a usage error
    return {str(k): float(v) for k, v in doc.items()}
