"""NVML discovery: name -> product, MIG mode, instances with profile/start/uuid (fake pynvml)."""

from __future__ import annotations

from types import SimpleNamespace

from autoscaler.mig.layout import Placement
from autoscaler.observe.nvml import discover, gpu_states, product_for


class FakeNvml:
    """The pynvml functions discover() uses, over an in-memory host description."""

    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus, init_error=False):
        # gpus: list of dict(name, uuid, mig, instances=[(nvml_profile_index, gi_id, start, uuid)])
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return self.gpus[h[1]]["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h):
        if h[0] == "mig":
            return self.gpus[h[1]]["instances"][h[2]][3]
        return self.gpus[h[1]]["uuid"]

    def nvmlDeviceGetMigMode(self, h):
        g = self.gpus[h[1]]
        if g["mig"] is None:
            raise self.NVMLError("Not Supported")
        return (1 if g["mig"] else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i >= len(self.gpus[h[1]]["instances"]):
            raise self.NVMLError("Not Found")
        return ("mig", h[1], i)

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return self.gpus[mig[1]]["instances"][mig[2]][1]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, profile_index):
        if profile_index == 9 and self.gpus[h[1]].get("no_dbl"):
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(id=100 + profile_index)

    def nvmlDeviceGetGpuInstances(self, h, profile_id):
        return [
            ("gi", h[1], k)
            for k, inst in enumerate(self.gpus[h[1]]["instances"])
            if 100 + inst[0] == profile_id
        ]

    def nvmlGpuInstanceGetInfo(self, gi):
        inst = self.gpus[gi[1]]["instances"][gi[2]]
        return SimpleNamespace(id=inst[1], placement=SimpleNamespace(start=inst[2], size=0))


def test_no_driver_means_no_gpus_not_an_error():
    fake = FakeNvml([], init_error=True)
    assert discover(fake) == []
    assert fake.calls == ["init"]


def test_product_names_map_through_aliases():
    assert product_for("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert product_for("NVIDIA H100 80GB HBM3") == "H100-SXM5-80GB"
    assert product_for("NVIDIA GeForce RTX 4090") is None


def test_mig_instances_are_read_with_profile_start_and_uuid():
    fake = FakeNvml(
        [
            # 3g at 4 (NVML profile index 2), two 1g at 0 and 1 (index 0)
            {
                "name": "NVIDIA A100-SXM4-80GB",
                "uuid": "GPU-a",
                "mig": True,
                "instances": [(2, 1, 4, "MIG-3g"), (0, 9, 0, "MIG-1a"), (0, 10, 1, "MIG-1b")],
            },
            {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-b", "mig": False, "instances": []},
            {"name": "Tesla T4", "uuid": "GPU-c", "mig": None, "instances": []},
        ]
    )
    gpus = discover(fake)
    assert [g.mig_enabled for g in gpus] == [True, False, False]
    assert gpus[2].product is None
    a = gpus[0]
    assert [(i.profile, i.start, i.uuid) for i in a.instances] == [
        ("1g.10gb", 0, "MIG-1a"),
        ("1g.10gb", 1, "MIG-1b"),
        ("3g.40gb", 4, "MIG-3g"),
    ]
    assert fake.calls[-1] == "shutdown"

    states, uuids = gpu_states("host", gpus)
    assert [s.id for s in states] == ["host/0"]  # only MIG-enabled GPUs of a known product
    assert states[0].emulated is False
    assert states[0].layout == (Placement(0, "1g.10gb"), Placement(1, "1g.10gb"), Placement(4, "3g.40gb"))
    assert uuids == {("host/0", 0): "MIG-1a", ("host/0", 1): "MIG-1b", ("host/0", 4): "MIG-3g"}


def test_unsupported_profile_is_skipped_not_fatal():
    fake = FakeNvml(
        [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-h",
                "mig": True,
                "no_dbl": True,
                "instances": [(4, 0, 0, "MIG-7g")],
            }
        ]
    )
    (g,) = discover(fake)
    assert g.product == "H100-SXM5-80GB"
    assert [(i.profile, i.start) for i in g.instances] == [("7g.80gb", 0)]


class ReadingNvml:
    """NVML answering the profile queries from a recorded reading of a real GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, profiles):
        import pynvml

        self.c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
        self.by_index = {p["nvml_index"]: p for p in profiles}
        self.by_id = {p["id"]: p for p in profiles}

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, index):
        p = self.by_index[index]
        return SimpleNamespace(id=p["id"], name=p["name"].encode(), sliceCount=p["slices"],
                               memorySizeMB=p["memory_mb"], multiprocessorCount=p["sms"], instanceCount=p["instances"])

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h, profile_id, arr, count_ref):
        import ctypes

        rows = self.by_id[profile_id]["placements"]
        for i, (start, size) in enumerate(rows):
            arr[i].start, arr[i].size = start, size
        ctypes.cast(count_ref, ctypes.POINTER(ctypes.c_uint)).contents.value = len(rows)


def test_the_h200_table_matches_a_real_h200_read_through_nvml():
    """The MIG geometry of H200-141GB (ids, names, slices, placements, SMs, usable memory)
    against what a real H200's driver reported (tests/unit/data/nvml-h200.json); a table that
    promised more memory than the driver gives would be listed."""
    import dataclasses
    import json
    import sys
    from pathlib import Path

    from autoscaler.mig.products import PRODUCTS, Product

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from mig_check import profile_report

    reading = json.loads((Path(__file__).parent / "data" / "nvml-h200.json").read_text())
    assert product_for(reading["name"]) == "H200-141GB"
    fake = ReadingNvml(reading["profiles"])
    h200 = PRODUCTS["H200-141GB"]
    rows, mismatches = profile_report(fake, None, h200)
    assert mismatches == [] and len(rows) == len(h200.profiles) == 7
    # the check can fail: a table that took the name's 18 GB for 1g would be caught
    named = {k: dataclasses.replace(p, usable_gib=p.memory_gb) for k, p in h200.profiles.items()}
    _, bad = profile_report(fake, None, Product(h200.name, 7, 8, h200.memory_gb, named))
    assert any(m.startswith("H200-141GB 1g.18gb: usable memory table 18") for m in bad)
