"""Read-only check of the MIG geometry table against a real GPU, through NVML.

Where it sits: ``autoscaler/mig/products.py`` is the table the planner packs
with (profiles, memory slots, allowed starts, NVML and nvidia-smi ids) and
``autoscaler/observe/nvml.py`` maps a real GPU onto it. On a machine with an
NVIDIA driver this script runs that discovery and asks NVML, profile by
profile, what the driver itself says: the GPU-instance profile info (id,
name, compute slices, memory, multiprocessors, instance count) and the
possible placements (start and size in memory slots). Every field that
differs from the table is listed under ``mismatches``, and so is usable memory
the table promises beyond what the driver reports.

Only ``nvmlDeviceGet*`` queries are made: nothing is created, destroyed or
switched (MIG mode, clocks and power are left as they are). Without a driver
or nvidia-ml-py it says so and exits 0. Where MIG mode is off the driver may
refuse the profile queries; the refusal is reported per profile.

Prints ONE JSON object. Run: ``python3 benchmarks/mig_check.py`` (seconds).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.mig.products import PRODUCTS, Product
from autoscaler.observe.nvml import discover, product_for

MAX_PLACEMENTS = 16


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _err(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def profile_report(nvml: Any, handle: Any, product: Product) -> tuple[list[dict[str, Any]], list[str]]:
    """NVML's view of each profile in the table, and the fields that differ from it."""
    rows: list[dict[str, Any]] = []
    mismatches: list[str] = []
    for prof in product.profiles.values():
        row: dict[str, Any] = {"profile": prof.name, "nvml_index": prof.nvml_index}
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, prof.nvml_index)
        except nvml.NVMLError as e:
            row["error"] = _err(e)
            rows.append(row)
            continue
        row.update(id=int(info.id), name=_text(getattr(info, "name", b"")), slices=int(info.sliceCount),
                   memory_mb=int(info.memorySizeMB), sms=int(info.multiprocessorCount),
                   instances=int(info.instanceCount))
        try:
            arr = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
            count = ctypes.c_uint(MAX_PLACEMENTS)
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, arr, ctypes.byref(count))
            row["placements"] = [[int(arr[i].start), int(arr[i].size)] for i in range(count.value)]
        except nvml.NVMLError as e:
            row["placements_error"] = _err(e)
        rows.append(row)
        at = f"{product.name} {prof.name}"
        expect = {"id": prof.nvsmi_id, "slices": prof.compute}
        if prof.sms is not None:
            expect["sms"] = prof.sms
        for k, v in expect.items():
            if row[k] != v:
                mismatches.append(f"{at}: {k} table {v}, NVML {row[k]}")
        if row["name"] and row["name"].removeprefix("MIG ") != prof.name:
            mismatches.append(f"{at}: name table {prof.name}, NVML {row['name']!r}")
        # what fit checks use must not promise more than the driver gives (readings are to 0.01 GiB)
        if row["memory_mb"] / 1024.0 < prof.fit_gib - 0.005:
            kind = "read" if prof.usable_read else "estimated"
            mismatches.append(f"{at}: usable memory table {prof.fit_gib} GiB ({kind}), NVML {row['memory_mb']} MiB")
        if "placements" in row:
            starts = sorted(s for s, _ in row["placements"])
            sizes = {z for _, z in row["placements"]}
            if starts != sorted(prof.starts):
                mismatches.append(f"{at}: starts table {sorted(prof.starts)}, NVML {starts}")
            if sizes and sizes != {prof.mem_slots}:
                mismatches.append(f"{at}: memory slots table {prof.mem_slots}, NVML {sorted(sizes)}")
    return rows, mismatches


def main() -> int:
    try:
        import pynvml as nvml  # nvidia-ml-py
    except ImportError:
        print(json.dumps({"nvml": None, "reason": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}))
        return 0
    out: dict[str, Any] = {"discovered": [], "gpus": [], "mismatches": []}
    out["discovered"] = [
        {"index": g.index, "name": g.name, "product": g.product, "mig_enabled": g.mig_enabled,
         "instances": [[i.profile, i.start, i.gi_id, i.uuid] for i in g.instances]}
        for g in discover(nvml)
    ]
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        out["nvml"] = None
        out["reason"] = _err(e)
        print(json.dumps(out))
        return 0
    try:
        out["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        out["nvml_version"] = _text(nvml.nvmlSystemGetNVMLVersion())
        for idx in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(idx)
            name = _text(nvml.nvmlDeviceGetName(h))
            g: dict[str, Any] = {"index": idx, "name": name, "product": product_for(name),
                                 "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20}
            try:
                cur, pend = nvml.nvmlDeviceGetMigMode(h)
                g["mig_mode"] = {"current": int(cur), "pending": int(pend)}
            except nvml.NVMLError as e:
                g["mig_mode"] = _err(e)
            if g["product"] is None:
                out["mismatches"].append(f"GPU {idx}: NVML name {name!r} maps to no product in the table")
            else:
                g["profiles"], bad = profile_report(nvml, h, PRODUCTS[g["product"]])
                out["mismatches"].extend(bad)
            out["gpus"].append(g)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
