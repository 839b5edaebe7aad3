"""Environment that pins a replica to its (emulated or real) MIG slice.

The act/ edge of the local backend calls this when it starts a replica:

* an **emulated** slice gets ``MIGSCALE_EMULATE=1`` plus the product, profile,
  profile kind, GPU id and start slot; the example models in ``triton_models/``
  read them and pad each batch to the slice's measured time
  (``emulation.json``, see ``triton_models/README.md``);
* a **real** MIG slice gets ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` and
  ``MIGSCALE_EMULATE=0``: the hardware is the slice, nothing is added.

``expected_batch_ms`` is the same formula the models apply, for the profiling
helper and for tests (``tests/unit/test_emulation.py`` pins the two together).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autoscaler.mig.products import get_product

KINDS = ("1g", "2g", "3g", "4g", "7g")
# 1g double-memory and 1g+me have one compute slice each: they run the 1g curve.
KIND_ALIASES = {"1g.dbl": "1g", "1g+me": "1g"}


def curve_kind(kind: str) -> str:
    """The emulation curve a profile kind uses; ValueError for an unknown kind."""
    k = KIND_ALIASES.get(kind, kind)
    if k not in KINDS:
        raise ValueError(
            f"profile kind {kind!r} has no emulation curve; known: {', '.join(KINDS + tuple(KIND_ALIASES))}"
        )
    return k


def emulation_env(
    product: str, profile: str, gpu_id: str, start: int, model: str | None = None
) -> dict[str, str]:
    """Env for a replica on an emulated slice; raises KeyError for an unknown product/profile."""
    prof = get_product(product).profile(profile)
    env = {
        "MIGSCALE_EMULATE": "1",
        "MIGSCALE_PRODUCT": product,
        "MIGSCALE_PROFILE": profile,
        "MIGSCALE_PROFILE_KIND": prof.kind,
        "MIGSCALE_GPU": str(gpu_id),
        "MIGSCALE_START": str(int(start)),
        # An emulated host has no GPU; make sure nothing in the stub finds a real one.
        "CUDA_VISIBLE_DEVICES": "",
    }
    if model:
        env["MIGSCALE_MODEL"] = model
    return env


def real_mig_env(mig_uuid: str, model: str | None = None) -> dict[str, str]:
    """Env for a replica on a real MIG instance (uuid with or without the ``MIG-`` prefix)."""
    uuid = mig_uuid if mig_uuid.startswith("MIG-") else f"MIG-{mig_uuid}"
    env = {"CUDA_VISIBLE_DEVICES": uuid, "MIGSCALE_EMULATE": "0"}
    if model:
        env["MIGSCALE_MODEL"] = model
    return env


def load_curve(model_dir: str | os.PathLike) -> dict:
    path = Path(model_dir) / "emulation.json"
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no emulation curve for this model") from None


def expected_batch_ms(model_dir: str | os.PathLike, kind: str, batch: int) -> float:
    """Emulated accelerator time of one batch: ``batch1_ms[kind] + (batch-1) * per_item_ms[kind]``.

    E.g. resnet on 1g, batch 8: 31.44 + 7 * 9.524 = 98.1 ms, i.e. ~82 req/s per slice.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    curve = load_curve(model_dir)
    k = curve_kind(kind)
    return float(curve["batch1_ms"][k]) + (batch - 1) * float(curve["per_item_ms"][k])
