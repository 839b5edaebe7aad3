"""The mig-parted ConfigMap: how migscale tells the GPU Operator's mig-manager to cut a node.

Part of the Kubernetes "act" edge, pure (dicts only). ``k8s_repartition``
writes an entry here before it sets ``nvidia.com/mig.config`` on a node, and
``migscale render`` prints the entries of cluster.yaml's declared layouts.
The format is mig-parted's (docs/gpu-operator.md): per named config, a list of
``{devices, mig-enabled, mig-devices: {profile: count}}``. mig-parted takes
counts, not placements, and places them itself.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autoscaler.act.kubernetes.render import Obj, RenderConfig, _meta, labels
from autoscaler.config.io import dump_yaml
from autoscaler.mig.layout import Placement


def mig_devices(layout: Iterable[Placement]) -> dict[str, int]:
    counts = Counter(p.profile for p in layout)
    return {k: counts[k] for k in sorted(counts)}


def mig_config_entry(gpu_layouts: Sequence[Sequence[Placement] | None]) -> list[Obj]:
    """One mig-parted config: GPUs with the same counts share a device list.

    ``None`` for a GPU means MIG disabled (a whole GPU, e.g. for multinode).
    """
    groups: dict[str, list[int]] = {}
    shapes: dict[str, Obj] = {}
    for idx, layout in enumerate(gpu_layouts):
        shape: Obj = (
            {"mig-enabled": False}
            if layout is None
            else {"mig-enabled": True, "mig-devices": mig_devices(layout)}
        )
        key = json.dumps(shape, sort_keys=True)
        groups.setdefault(key, []).append(idx)
        shapes[key] = shape
    return [{"devices": devs, **shapes[k]} for k, devs in groups.items()]


def mig_config_name(entry: Sequence[Mapping[str, Any]]) -> str:
    """A content-addressed name (<= 63 chars, a valid label value) for the node label."""
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:12]
    return f"migscale-{digest}"


def mig_parted_configmap(entries: Mapping[str, Sequence[Mapping[str, Any]]], cfg: RenderConfig) -> Obj:
    doc = {"version": "v1", "mig-configs": {name: list(e) for name, e in sorted(entries.items())}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            cfg.mig_parted_configmap, cfg, labels(component="mig-parted"), namespace=cfg.mig_parted_namespace
        ),
        "data": {"config.yaml": dump_yaml(doc, sort_keys=True)},
    }
