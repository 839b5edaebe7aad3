"""GPU products and their MIG profiles (pure data).

Source: NVIDIA MIG User Guide, "Supported MIG Profiles" (see docs/mig-geometry.md).
Placements are identical on A100, H100, H100 NVL and H200: 7 compute slices,
8 memory slots; a GPU instance occupies ``mem_slots`` contiguous memory slots
starting at one of ``starts``. A30 has 4 compute slices and 4 memory slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Kinds are product-independent names for a placement class; profile names
# ("3g.40gb") are product-specific because they carry the memory size.
STANDARD_KINDS: tuple[str, ...] = ("1g", "2g", "3g", "4g", "7g")


@dataclass(frozen=True)
class Profile:
    """One MIG GPU-instance profile of one product."""

    name: str  # e.g. "3g.40gb"
    kind: str  # "1g", "1g+me", "1g.dbl", "2g", "3g", "4g", "7g"
    compute: int  # compute slices (of 7, or 4 on A30)
    mem_slots: int  # memory slots (of 8, or 4 on A30)
    memory_gb: float
    starts: tuple[int, ...]  # allowed start memory slots
    nvsmi_id: int  # nvidia-smi -lgip profile ID
    nvml_index: int  # NVML_GPU_INSTANCE_PROFILE_* index used to create it
    sms: int | None = None  # streaming multiprocessors, where published
    # GiB a process can use in the instance, as NVML reports it (``nvidia-smi mig -lgip``);
    # the name's "gb" is a label: H200's 1g.18gb holds 16.00 GiB. ``usable_read``: False
    # where no reading is published and the figure is the conservative estimate
    # (``_estimate_usable``).
    usable_gib: float | None = None
    usable_read: bool = False

    @property
    def fit_gib(self) -> float:
        """The memory a replica may count on here: what fit checks compare a model's
        ``memory_gb`` with (the usable GiB; the name's GB only before estimates are filled)."""
        return self.usable_gib if self.usable_gib is not None else self.memory_gb

    def span(self, start: int) -> range:
        """Memory slots an instance of this profile occupies when placed at ``start``."""
        return range(start, start + self.mem_slots)


@dataclass(frozen=True)
class Product:
    name: str
    compute_slices: int
    mem_slots: int
    memory_gb: float
    profiles: dict[str, Profile] = field(default_factory=dict, hash=False, compare=False)

    def __hash__(self) -> int:
        # Equal products have equal names; the planner's caches hash one per GPU.
        return hash(self.name)

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            raise KeyError(
                f"profile {name!r} is not valid for {self.name}; valid: {', '.join(self.profiles)}"
            ) from None

    def by_kind(self, kind: str) -> Profile | None:
        for p in self.profiles.values():
            if p.kind == kind:
                return p
        return None

    def standard_profiles(self) -> list[Profile]:
        return [p for k in STANDARD_KINDS if (p := self.by_kind(k)) is not None]

    @property
    def full(self) -> Profile:
        """The whole-GPU profile (7g, or 4g on A30)."""
        return max(self.profiles.values(), key=lambda p: (p.compute, p.mem_slots))


def _seven_slice(name: str, mem_gb: float, sizes: dict[str, float], sms: dict[str, int] | None = None,
                 usable: dict[str, float] | None = None) -> Product:
    sms = sms or {}
    usable = usable or {}
    # kind -> (compute, mem_slots, starts, nvsmi id, nvml index)
    geo = {
        "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6), 19, 0),
        "1g+me": (1, 1, (0, 1, 2, 3, 4, 5, 6), 20, 7),
        "1g.dbl": (1, 2, (0, 2, 4, 6), 15, 9),
        "2g": (2, 2, (0, 2, 4), 14, 1),
        "3g": (3, 4, (0, 4), 9, 2),
        "4g": (4, 4, (0,), 5, 3),
        "7g": (7, 8, (0,), 0, 4),
    }
    profiles: dict[str, Profile] = {}
    for kind, (c, m, starts, sid, nidx) in geo.items():
        gb = sizes[kind]
        base = f"{kind[0]}g.{gb:g}gb" if kind not in ("1g+me",) else f"1g.{sizes['1g']:g}gb+me"
        if kind == "1g.dbl":
            base = f"1g.{gb:g}gb"
        profiles[base] = Profile(base, kind, c, m, gb, starts, sid, nidx, sms.get(kind), usable.get(kind),
                                 kind in usable)
    return Product(name, 7, 8, sizes["7g"], profiles)


A100_SMS = {"1g": 14, "1g+me": 14, "1g.dbl": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
# H200 read on a real one (docs/mig-geometry.md): the same as H100's
H100_SMS = {"1g": 16, "1g+me": 16, "1g.dbl": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}

# Usable GiB per instance from ``nvidia-smi mig -lgip`` (docs/mig-geometry.md gives each
# source). Drivers differ by a fraction of a GiB (A100-80GB's 1g: 9.50 and 9.75 are both
# published): the lower reading is kept, so a model that fits here fits on either.
USABLE_GIB: dict[str, dict[str, float]] = {
    "A100-SXM4-40GB": {"1g": 4.75, "1g+me": 4.75, "1g.dbl": 9.75, "2g": 9.75, "3g": 19.62, "7g": 39.50},
    "A100-SXM4-80GB": {"1g": 9.50, "1g+me": 9.50, "1g.dbl": 19.50, "2g": 19.50, "3g": 39.25, "4g": 39.25,
                       "7g": 79.00},
    "H100-SXM5-80GB": {"1g": 9.75, "1g+me": 9.75, "1g.dbl": 19.62, "2g": 19.62, "3g": 39.50, "4g": 39.50,
                       "7g": 79.25},
    "H200-141GB": {"1g": 16.00, "1g+me": 16.00, "1g.dbl": 32.50, "2g": 32.50, "3g": 69.75, "4g": 69.75,
                   "7g": 140.00},
    "A30-24GB": {"1g": 5.81},
}


def _estimate_usable(products: tuple[Product, ...]) -> dict[str, Product]:
    """Fill the profiles without a reading: the name's GB times the lowest usable share read
    for that kind on any product (1g: 16.00 of H200's 18 -> 0.889), so an estimate never
    promises more than the worst product read so far."""
    share: dict[str, float] = {}
    for prod in products:
        for p in prod.profiles.values():
            if p.usable_read and p.usable_gib is not None:
                share[p.kind] = min(share.get(p.kind, 1.0), p.usable_gib / p.memory_gb)
    out: dict[str, Product] = {}
    for prod in products:
        for name, p in list(prod.profiles.items()):
            if p.usable_gib is None:
                prod.profiles[name] = replace(p, usable_gib=round(p.memory_gb * share.get(p.kind, min(share.values())), 2))
        out[prod.name] = prod
    return out


def _a30() -> Product:
    read = USABLE_GIB["A30-24GB"]
    return Product("A30-24GB", 4, 4, 24, {
        "1g.6gb": Profile("1g.6gb", "1g", 1, 1, 6, (0, 1, 2, 3), 14, 0, None, read.get("1g"), "1g" in read),
        "2g.12gb": Profile("2g.12gb", "2g", 2, 2, 12, (0, 2), 5, 1),
        "4g.24gb": Profile("4g.24gb", "4g", 4, 4, 24, (0,), 0, 3),
    })


PRODUCTS: dict[str, Product] = _estimate_usable((
    _seven_slice("A100-SXM4-40GB", 40, {"1g": 5, "1g+me": 5, "1g.dbl": 10, "2g": 10, "3g": 20, "4g": 20, "7g": 40},
                 A100_SMS, USABLE_GIB["A100-SXM4-40GB"]),
    _seven_slice("A100-SXM4-80GB", 80, {"1g": 10, "1g+me": 10, "1g.dbl": 20, "2g": 20, "3g": 40, "4g": 40, "7g": 80},
                 A100_SMS, USABLE_GIB["A100-SXM4-80GB"]),
    _seven_slice("H100-SXM5-80GB", 80, {"1g": 10, "1g+me": 10, "1g.dbl": 20, "2g": 20, "3g": 40, "4g": 40, "7g": 80},
                 H100_SMS, USABLE_GIB["H100-SXM5-80GB"]),
    _seven_slice("H100-NVL-94GB", 94, {"1g": 12, "1g+me": 12, "1g.dbl": 24, "2g": 24, "3g": 47, "4g": 47, "7g": 94},
                 H100_SMS),
    _seven_slice("H200-141GB", 141, {"1g": 18, "1g+me": 18, "1g.dbl": 35, "2g": 35, "3g": 71, "4g": 71, "7g": 141},
                 H100_SMS, USABLE_GIB["H200-141GB"]),
    _a30(),
))

# Names NVML / nvidia-smi report (``nvmlDeviceGetName``) mapped to our product keys.
NVML_NAME_ALIASES: dict[str, str] = {
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe": "A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-SXM4-40GB",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "NVIDIA H100 NVL": "H100-NVL-94GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA A30": "A30-24GB",
}


def get_product(name: str) -> Product:
    try:
        return PRODUCTS[name]
    except KeyError:
        raise KeyError(f"unknown GPU product {name!r}; known: {', '.join(PRODUCTS)}") from None
