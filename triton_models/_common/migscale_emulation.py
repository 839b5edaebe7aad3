"""Emulated MIG-slice accelerator time for the example models (runs inside the Triton Python stub).

On a machine without a MIG GPU each replica is told which slice it pretends to
run on (``MIGSCALE_PROFILE_KIND``, set by ``autoscaler.act.local.emulation``). After
the model's real numpy work, the batch is held until the slice's measured
latency for that batch size has passed: ``batch1_ms[kind] + (batch-1) *
per_item_ms[kind]`` from the model's ``emulation.json``. The wait is a sleep,
not a busy loop, so a 2-core machine can host many emulated slices. With
``MIGSCALE_EMULATE`` unset or ``0`` (a real MIG slice) nothing is added.

Standalone on purpose (stdlib only): the model repository must also load in a
stock Triton container where the ``autoscaler`` package is not installed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

KINDS = ("1g", "2g", "3g", "4g", "7g")
# 1g.dbl (double memory) and 1g+me have one compute slice: same curve as 1g.
KIND_ALIASES = {"1g.dbl": "1g", "1g+me": "1g"}


def kind_of(profile_kind: str | None, profile: str | None = None) -> str | None:
    """Normalise a profile kind (``1g+me`` -> ``1g``); fall back to the profile name's prefix."""
    k = (profile_kind or "").strip()
    if not k and profile:
        # "3g.40gb" -> "3g"; "1g.10gb+me" -> "1g"
        k = profile.split(".", 1)[0].strip()
    k = KIND_ALIASES.get(k, k)
    return k if k in KINDS else None


def load_curve(model_dir: str | os.PathLike) -> dict:
    with open(Path(model_dir) / "emulation.json", encoding="utf-8") as f:
        return json.load(f)


def batch_ms(curve: dict, kind: str, batch: int) -> float:
    """Emulated accelerator time of one batch of ``batch`` items on a ``kind`` slice."""
    kind = KIND_ALIASES.get(kind, kind)
    return float(curve["batch1_ms"][kind]) + max(0, int(batch) - 1) * float(curve["per_item_ms"][kind])


class Emulator:
    """Pads each batch to the emulated slice time; a no-op when emulation is off."""

    def __init__(self, model_dir: str | os.PathLike, env: dict | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.enabled = env.get("MIGSCALE_EMULATE", "0").strip() == "1"
        self.kind = kind_of(env.get("MIGSCALE_PROFILE_KIND"), env.get("MIGSCALE_PROFILE"))
        self.profile = env.get("MIGSCALE_PROFILE")
        self.curve: dict | None = None
        if self.enabled:
            if self.kind is None:
                raise ValueError(
                    "MIGSCALE_EMULATE=1 needs MIGSCALE_PROFILE_KIND (1g/2g/3g/4g/7g) or "
                    f"MIGSCALE_PROFILE, got {env.get('MIGSCALE_PROFILE_KIND')!r}/{self.profile!r}"
                )
            self.curve = load_curve(model_dir)

    def target_ms(self, batch: int) -> float:
        if not self.enabled or self.curve is None or self.kind is None:
            return 0.0
        return batch_ms(self.curve, self.kind, batch)

    def pad(self, batch: int, started: float) -> float:
        """Sleep until ``started + target``; returns the seconds slept (0 when compute overran)."""
        target_s = self.target_ms(batch) / 1000.0
        left = started + target_s - time.perf_counter()
        if left > 0:
            time.sleep(left)
            return left
        return 0.0
