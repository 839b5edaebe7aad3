"""Real MIG GPUs on this host, read through NVML (observe/; read-only).

For each GPU: NVML's name mapped to a product key (``NVML_NAME_ALIASES``),
whether MIG mode is on, and its GPU instances with profile name, start slot
and the MIG device UUID a replica is pinned to (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``).
Nothing is created or destroyed here. Without a driver (``nvmlInit`` fails,
or nvidia-ml-py is missing) ``discover()`` returns ``[]``: the local backend
then runs on the emulated GPUs of cluster.yaml alone.

The NVML module is injected (``nvml=``) so tests drive the mapping with a
small fake of the pynvml functions used below.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from autoscaler.mig.layout import Placement
from autoscaler.mig.products import NVML_NAME_ALIASES, PRODUCTS, Product
from autoscaler.policy.types import GpuState


@dataclass(frozen=True)
class NvmlInstance:
    profile: str  # our profile name, e.g. "3g.40gb"
    start: int  # first memory slot (NVML placement.start)
    gi_id: int  # GPU instance id
    uuid: str | None  # "MIG-..." of its MIG device, None if no compute instance yet


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str  # as NVML reports it, e.g. "NVIDIA A100-SXM4-80GB"
    product: str | None  # our product key, None when unknown
    uuid: str
    mig_enabled: bool
    instances: tuple[NvmlInstance, ...] = ()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def product_for(name: str) -> str | None:
    """NVML device name -> product key: the alias table, else the name itself without "NVIDIA "."""
    if name in NVML_NAME_ALIASES:
        return NVML_NAME_ALIASES[name]
    bare = name.removeprefix("NVIDIA ").strip()
    return bare if bare in PRODUCTS else None


def _instances(nvml: Any, handle: Any, product: Product) -> tuple[NvmlInstance, ...]:
    # MIG device UUIDs, keyed by GPU instance id (a GI with one CI = one MIG device).
    uuids: dict[int, str] = {}
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except nvml.NVMLError:
        count = 0
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:
            continue  # empty index
        uuids[nvml.nvmlDeviceGetGpuInstanceId(mig)] = _text(nvml.nvmlDeviceGetUUID(mig))
    out: list[NvmlInstance] = []
    for prof in product.profiles.values():
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, prof.nvml_index)
            gis = nvml.nvmlDeviceGetGpuInstances(handle, info.id)
        except nvml.NVMLError:
            continue  # profile not supported on this GPU/driver
        for gi in gis:
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            out.append(
                NvmlInstance(
                    prof.name, int(gi_info.placement.start), int(gi_info.id), uuids.get(int(gi_info.id))
                )
            )
    return tuple(sorted(out, key=lambda x: x.start))


def discover(nvml: Any = None) -> list[NvmlGpu]:
    """Every GPU NVML sees; [] when there is no driver or no nvidia-ml-py."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : no GPU here
        return []
    try:
        gpus: list[NvmlGpu] = []
        for idx in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(idx)
            name = _text(nvml.nvmlDeviceGetName(h))
            product = product_for(name)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
                mig = current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
            except nvml.NVMLError:
                mig = False  # not MIG-capable
            inst = _instances(nvml, h, PRODUCTS[product]) if (mig and product) else ()
            gpus.append(NvmlGpu(idx, name, product, _text(nvml.nvmlDeviceGetUUID(h)), mig, inst))
        return gpus
    finally:
        # A shutdown that fails leaves nothing for us to undo; the inventory stands.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def gpu_states(node: str, gpus: list[NvmlGpu]) -> tuple[list[GpuState], dict[tuple[str, int], str]]:
    """GpuStates (ids ``"{node}/{index}"``, ``emulated=False``) for the MIG-enabled GPUs of a
    known product, and the MIG device UUID of each (gpu id, start)."""
    states: list[GpuState] = []
    uuids: dict[tuple[str, int], str] = {}
    for g in gpus:
        if not g.mig_enabled or g.product is None:
            continue
        gid = f"{node}/{g.index}"
        states.append(
            GpuState(
                id=gid,
                node=node,
                product=g.product,
                layout=tuple(sorted(Placement(i.start, i.profile) for i in g.instances)),
                mig_enabled=True,
                emulated=False,
            )
        )
        for i in g.instances:
            if i.uuid:
                uuids[(gid, i.start)] = i.uuid
    return states, uuids
