"""MIG geometry: GPU products, profiles, placements and valid layouts.

Pure data and math (zero I/O). Everything that reasons about how a GPU may be
cut -- the config validator, the planner, the simulator, the local emulation
and the Kubernetes renderer -- asks this package, so the placement rules live
in exactly one place.
"""

from autoscaler.mig.layout import (
    LayoutError,
    Placement,
    best_start,
    check_layout,
    free_starts,
    is_maximal,
    maximal_layouts,
    parse_layout,
)
from autoscaler.mig.products import PRODUCTS, STANDARD_KINDS, Product, Profile, get_product

__all__ = [
    "PRODUCTS",
    "STANDARD_KINDS",
    "LayoutError",
    "Placement",
    "Product",
    "Profile",
    "best_start",
    "check_layout",
    "free_starts",
    "get_product",
    "is_maximal",
    "maximal_layouts",
    "parse_layout",
]
