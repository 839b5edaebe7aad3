"""From validated config to the core's values, and the checks that need both files.

Part of the config edge: ``model_specs`` and ``initial_cluster_state`` build
the ``ModelSpec`` and ``ClusterState`` values the planner (``policy/``) and
the simulator consume; ``validate_pair`` finds what only shows with both
``models.yaml`` and ``cluster.yaml`` (a profile no GPU in the cluster has, a
multinode model without an RDMA pool big enough, a missing model directory).
Import these from ``autoscaler.config``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoscaler.config.io import ConfigError, load_yaml, short
from autoscaler.mig import get_product
from autoscaler.policy.types import ClusterState, GpuState, ModelSpec

if TYPE_CHECKING:
    from autoscaler.config.schema import ClusterConfig, ModelConfig, ModelsConfig
    from autoscaler.policy import hpa
    from autoscaler.policy.state import PolicyConfig


def load_capacity_file(path: str | Path, models: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Read ``{models: {name: {profile: rps}}}`` (written by ``migscale profile``).

    Every profile must be a MIG profile and, when ``models`` is given, every name one of
    them: a misspelt ``2g.20g`` or a model renamed in models.yaml would otherwise drop
    its figures without a word, and the planner would size replicas without them.
    """
    from autoscaler.config.schema import KNOWN_PROFILES, UNKNOWN_PROFILE

    p = Path(path)
    data = load_yaml(p)
    problems: list[str] = []
    table_of = data.get("models") if isinstance(data, dict) else None
    if not isinstance(table_of, dict):
        raise ConfigError(
            [f"{p}: models: must be a mapping of model -> {{profile: req/s}}, got {short(table_of)}"], p
        )
    out: dict[str, dict[str, float]] = {}
    for name, table in table_of.items():
        if models is not None and name not in models:
            problems.append(
                f"{p}: models.{name}: not a model of models.yaml ({', '.join(models)}), got {short(name)}"
            )
            continue
        if not isinstance(table, dict):
            problems.append(f"{p}: models.{name}: must be a mapping profile -> req/s, got {short(table)}")
            continue
        out[str(name)] = {}
        for prof, rps in table.items():
            if prof not in KNOWN_PROFILES:
                hint = difflib.get_close_matches(str(prof), KNOWN_PROFILES, n=1, cutoff=0.8)
                near = f" (did you mean {hint[0]!r}?)" if hint else ""
                problems.append(f"{p}: models.{name}.{prof}: {UNKNOWN_PROFILE}{near}, got {short(prof)}")
            elif not _number(rps, positive=True):
                problems.append(f"{p}: models.{name}.{prof}: req/s must be a number > 0, got {short(rps)}")
            else:
                out[str(name)][str(prof)] = float(rps)
    if problems:
        raise ConfigError(problems, p)
    return out


@dataclass(frozen=True)
class MeasuredReplica:
    """What ``migscale profile`` measured of one replica on one profile (a capacity file's
    ``measured`` block): the world the simulator serves, while the policy plans with the table.

    ``saturation_rps``: the closed-loop sweep's highest error-free throughput, the replica
    flat out. ``poisson_capacity_rps``: with ``--arrivals poisson``, the highest Poisson
    rate whose p99 met ``slo_p99_ms`` -- the arrivals online traffic sends. None: not
    measured. ``poisson_points``: every Poisson rate that search, and the points spread up
    to saturation after it, sent without errors, with the p99 and p50 measured."""

    saturation_rps: float | None
    poisson_capacity_rps: float | None = None
    slo_p99_ms: float | None = None
    poisson_points: tuple[tuple[float, float, float | None], ...] = ()  # (offered req/s, p99 ms, p50 ms)


def _number(v: Any, *, positive: bool) -> bool:
    """A finite int or float (never a bool, never NaN), > 0 or >= 0."""
    return (not isinstance(v, bool) and isinstance(v, (int, float)) and v < float("inf")
            and (v > 0 if positive else v >= 0))


def _measured_replica(result: Any, at: str, problems: list[str]) -> MeasuredReplica | None:
    if not isinstance(result, dict):
        return None
    best = 0.0
    points = result.get("points")
    for i, pt in enumerate(points if isinstance(points, list) else ()):
        thr = pt.get("throughput_rps") if isinstance(pt, dict) else None
        if not _number(thr, positive=False):
            problems.append(f"{at}.points[{i}].throughput_rps: must be a number >= 0, got {short(thr)}")
        elif not pt.get("errors"):
            best = max(best, float(thr))
    poisson = slo = None
    if result.get("arrivals") == "poisson":
        # the profiler's own summary of its Poisson search (``capacity_rps``), never recomputed here
        cap, slo_ms = result.get("capacity_rps"), result.get("slo_p99_ms")
        if cap is not None and not _number(cap, positive=True):
            problems.append(f"{at}.capacity_rps: must be a number > 0 or null, got {short(cap)}")
        elif cap is not None and not _number(slo_ms, positive=True):
            problems.append(f"{at}.slo_p99_ms: must be a number > 0 beside a Poisson capacity, got {short(slo_ms)}")
        elif cap is not None:
            poisson, slo = float(cap), float(slo_ms)
    open_points: list[tuple[float, float, float | None]] = []
    for key in ("poisson_points", "poisson_curve_points"):
        raw = result.get(key) if poisson is not None else None
        for i, pt in enumerate(raw if isinstance(raw, list) else ()):
            if not isinstance(pt, dict):
                problems.append(f"{at}.{key}[{i}]: must be a mapping, got {short(pt)}")
                continue
            rate = pt.get("offered_rps")
            bad = [k for k in ("p99_ms", "p50_ms") if pt.get(k) is not None and not _number(pt.get(k), positive=True)]
            if not _number(rate, positive=True):
                problems.append(f"{at}.{key}[{i}].offered_rps: must be a number > 0, got {short(rate)}")
            elif bad:
                problems.extend(f"{at}.{key}[{i}].{k}: must be a number > 0 or null, got {short(pt[k])}"
                                for k in bad)
            elif pt.get("p99_ms") is not None and not pt.get("errors"):
                p50 = pt.get("p50_ms")
                open_points.append((float(rate), float(pt["p99_ms"]), None if p50 is None else float(p50)))
    if best <= 0 and poisson is None:
        return None
    return MeasuredReplica(best if best > 0 else None, poisson, slo, tuple(open_points))


def measured_replicas(models: ModelsConfig) -> dict[str, dict[str, MeasuredReplica]]:
    """Per model and profile, what the ``measured`` block of its capacity file holds.

    ``migscale profile`` keeps every sweep point; a file without them (hand-written)
    gives nothing, and the table is then both the policy's belief and the world."""
    out: dict[str, dict[str, MeasuredReplica]] = {}
    for m in models.models:
        if not m.capacity_file:
            continue
        path = models.resolve(m.capacity_file)
        if not path.exists():
            continue
        data = load_yaml(path)
        measured = data.get("measured") if isinstance(data, dict) else None
        per_profile = measured.get(m.name) if isinstance(measured, dict) else None
        if not isinstance(per_profile, dict):
            continue
        problems: list[str] = []
        for prof, result in per_profile.items():
            got = _measured_replica(result, f"{path}: measured.{m.name}.{prof}", problems)
            if got is not None:
                out.setdefault(m.name, {})[str(prof)] = got
        if problems:
            raise ConfigError(problems, path)
    return out


_PBTXT_COMMENT = re.compile(r"#[^\n]*")
_MAX_BATCH = re.compile(r"^\s*max_batch_size\s*:\s*(-?\d+)", re.MULTILINE)
_DYNAMIC = re.compile(r"^\s*dynamic_batching\s*\{", re.MULTILINE)


def triton_max_batch(model_dir: str | Path) -> int | None:
    """The largest batch Triton forms from separate requests for the model in ``model_dir``:
    its ``config.pbtxt``'s ``max_batch_size`` when the dynamic batcher is on, else 1 (without
    ``dynamic_batching`` each request runs as sent; ``max_batch_size: 0`` cannot batch).
    None: no ``config.pbtxt`` there. Raises ConfigError on a negative ``max_batch_size``."""
    path = Path(model_dir) / "config.pbtxt"
    if not path.is_file():
        return None
    text = _PBTXT_COMMENT.sub("", path.read_text())
    m = _MAX_BATCH.search(text)
    size = int(m.group(1)) if m else 0
    if size < 0:
        raise ConfigError([f"{path}: max_batch_size: must be >= 0, got {size}"], path)
    return max(size, 1) if _DYNAMIC.search(text) else 1


def model_max_batches(models: ModelsConfig) -> dict[str, int]:
    """``triton_max_batch`` of every model whose ``model_dir`` holds a Triton config."""
    out: dict[str, int] = {}
    for m in models.models:
        b = triton_max_batch(models.resolve(m.model_dir))
        if b is not None:
            out[m.name] = b
    return out


def load_demand(path: str | Path, models: Sequence[str] | None = None) -> dict[str, float]:
    """Read a demand file ``{model: req/s}``; names must be in ``models`` when given."""
    p = Path(path)
    data = load_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError([f"{p}: top level must be a mapping model -> req/s, got {short(data, 40)}"], p)
    problems: list[str] = []
    out: dict[str, float] = {}
    for name, rps in data.items():
        if models is not None and name not in models:
            problems.append(f"{p}: {name}: unknown model (known: {', '.join(models)}), got {short(name)}")
        elif not _number(rps, positive=False):
            problems.append(f"{p}: {name}: req/s must be a number >= 0, got {short(rps)}")
        else:
            out[str(name)] = float(rps)
    if problems:
        raise ConfigError(problems, p)
    return out


# ---------------------------------------------------------------- building core values


def _mig_products(cluster: ClusterConfig) -> list:
    return [get_product(name) for name in cluster.products()]


def capacity_table(models: ModelsConfig, m: ModelConfig) -> dict[str, float]:
    """Req/s per profile for ``m``: its ``capacity_file`` entry (when the file exists), ``capacity`` over it."""
    table: dict[str, float] = {}
    if m.capacity_file:
        path = models.resolve(m.capacity_file)
        if path.exists():
            table.update(load_capacity_file(path, [x.name for x in models.models]).get(m.name, {}))
    table.update(m.capacity or {})
    return table


def _usable_profiles(m: ModelConfig, cluster: ClusterConfig) -> list[str]:
    """Profiles a replica of ``m`` may use on this cluster, smallest first."""
    prods = _mig_products(cluster)
    if m.profiles is not None:
        return [p for p in m.profiles if any(p in prod.profiles for prod in prods)]
    out: list[tuple[int, float, str]] = []
    for prod in prods:
        for prof in prod.standard_profiles():
            if m.memory_gb is None or prof.fit_gib >= m.memory_gb:
                out.append((prof.compute, prof.fit_gib, prof.name))
    return list(dict.fromkeys(name for _, _, name in sorted(out)))


def model_specs(models: ModelsConfig, cluster: ClusterConfig) -> list[ModelSpec]:
    """One ``ModelSpec`` per model, in file order.

    MIG models: ``allowed_profiles`` is the explicit ``profiles`` list, else the
    standard profiles of the cluster's products with enough memory for
    ``memory_gb``; when a capacity table exists (inline ``capacity`` overriding
    ``capacity_file``), profiles without a req/s figure are dropped, because
    the planner cannot size replicas it has no number for. Multinode models
    take whole GPUs: ``allowed_profiles`` and ``capacity`` are empty and
    ``group_capacity_rps`` carries the group's req/s.
    """
    problems: list[str] = []
    specs: list[ModelSpec] = []
    prods = _mig_products(cluster)
    for i, m in enumerate(models.models):
        if m.backend == "multinode":
            mn = m.multinode
            assert mn is not None  # the schema requires it for this backend
            specs.append(
                ModelSpec(
                    name=m.name,
                    capacity={},
                    allowed_profiles=(),
                    min_replicas=m.min_replicas,
                    max_replicas=m.max_replicas,
                    high_availability=m.high_availability,
                    priority=m.priority,
                    memory_gb=m.memory_gb,
                    backend="multinode",
                    nodes_per_group=mn.nodes_per_group,
                    gpus_per_node=mn.gpus_per_node,
                    group_capacity_rps=mn.group_capacity_rps,
                    fabric=mn.fabric,
                )
            )
            continue
        for j, prof in enumerate(m.profiles or ()):
            if not any(prof in prod.profiles for prod in prods):
                problems.append(
                    f"models[{i}].profiles[{j}]: not valid for any GPU product in the cluster "
                    f"({', '.join(cluster.products()) or 'none'}), got {prof!r}"
                )
        try:
            capacity = capacity_table(models, m)
        except ConfigError as exc:
            problems.extend(f"models[{i}].capacity_file: {line}" for line in exc.problems)
            continue
        allowed = _usable_profiles(m, cluster)
        if capacity:
            allowed = [p for p in allowed if p in capacity]
        specs.append(
            ModelSpec(
                name=m.name,
                capacity={p: capacity[p] for p in allowed if p in capacity},
                allowed_profiles=tuple(allowed),
                min_replicas=m.min_replicas,
                max_replicas=m.max_replicas,
                high_availability=m.high_availability,
                priority=m.priority,
                memory_gb=m.memory_gb,
                backend="mig",
            )
        )
    if problems:
        raise ConfigError(problems)
    return specs


def initial_cluster_state(cluster: ClusterConfig) -> ClusterState:
    """GPUs as the config describes them, no replicas. Ids are ``"{node}/{index}"``,
    the index counting per node across entries (two entries for node-a give
    node-a/0..node-a/N)."""
    gpus: list[GpuState] = []
    per_node: dict[str, int] = {}
    for g in cluster.gpus:
        for layout in g.gpu_layouts():
            idx = per_node.get(g.node, 0)
            per_node[g.node] = idx + 1
            gpus.append(
                GpuState(
                    id=f"{g.node}/{idx}",
                    node=g.node,
                    product=g.product,
                    layout=tuple(sorted(layout)),
                    mig_enabled=True,
                    rdma=False,
                    fabric=None,
                    emulated=g.emulated,
                )
            )
    for n in cluster.rdma_pool.nodes if cluster.rdma_pool else ():
        for idx in range(n.gpus):
            gpus.append(
                GpuState(
                    id=f"{n.name}/{idx}",
                    node=n.name,
                    product=n.product,
                    layout=(),
                    mig_enabled=False,
                    rdma=True,
                    fabric=n.fabric,
                    emulated=n.emulated,
                )
            )
    return ClusterState(gpus=tuple(gpus), replicas=())


# ---------------------------------------------------------------- cross-file checks


def validate_pair(
    models: ModelsConfig, cluster: ClusterConfig, *, require_capacity: bool = True, check_dirs: bool = True
) -> list[str]:
    """Problems that only show with both files: profiles vs the cluster's products,
    multinode groups vs the RDMA pool, model directories on disk, capacity tables.

    ``require_capacity=False`` skips the "no req/s figure" checks, for
    ``migscale profile``, which is how those figures come to exist.
    ``check_dirs=False`` skips the model directories, for the Kubernetes
    controller: there the repository is a volume of the Triton pods, not its own.
    """
    out: list[str] = []
    prods = _mig_products(cluster)
    names = ", ".join(cluster.products()) or "none"
    n_mig_gpus = sum(g.count for g in cluster.gpus)
    for i, m in enumerate(models.models):
        at = f"models[{i}]"
        mdir = models.resolve(m.model_dir)
        if not check_dirs:
            pass
        elif not mdir.is_dir():
            out.append(f"{at}.model_dir: no such directory ({mdir}), got {m.model_dir!r}")
        elif not (mdir / "config.pbtxt").is_file():
            out.append(f"{at}.model_dir: no config.pbtxt in {mdir}, got {m.model_dir!r}")
        if m.backend == "multinode":
            out.extend(_multinode_problems(at, m, cluster, require_capacity))
            continue
        if not prods:
            out.append(f"{at}.backend: 'mig' needs MIG GPUs under cluster gpus, got 'mig'")
            continue
        for j, prof in enumerate(m.profiles or ()):
            fits = [prod for prod in prods if prof in prod.profiles]
            if not fits:
                out.append(
                    f"{at}.profiles[{j}]: not valid for any GPU product in the cluster ({names}), "
                    f"got {prof!r}"
                )
            elif m.memory_gb is not None and max(pr.profiles[prof].fit_gib for pr in fits) < m.memory_gb:
                out.append(
                    f"{at}.profiles[{j}]: holds {max(pr.profiles[prof].fit_gib for pr in fits):g} GiB usable, "
                    f"less than memory_gb {m.memory_gb:g}, got {prof!r}"
                )
        for prof in m.capacity or {}:
            if not any(prof in prod.profiles for prod in prods):
                out.append(
                    f"{at}.capacity.{prof}: not valid for any GPU product in the cluster ({names}), "
                    f"got {prof!r}"
                )
        if m.memory_gb is not None and m.profiles is None and not _usable_profiles(m, cluster):
            biggest = max(pr.full.fit_gib for pr in prods)
            out.append(
                f"{at}.memory_gb: no MIG profile in the cluster has that much memory "
                f"(largest {biggest:g} GiB usable), got {m.memory_gb:g}"
            )
        if m.high_availability and n_mig_gpus < 2:
            out.append(f"{at}.high_availability: needs >= 2 MIG GPUs, the cluster has {n_mig_gpus}, got True")
        try:
            capacity = capacity_table(models, m)
        except ConfigError as exc:
            out.extend(f"{at}.capacity_file: {line}" for line in exc.problems)
            continue
        if require_capacity:
            if m.capacity_file and not models.resolve(m.capacity_file).exists() and not m.capacity:
                out.append(
                    f"{at}.capacity_file: file not found ({models.resolve(m.capacity_file)}); "
                    f"run `migscale profile` first, got {m.capacity_file!r}"
                )
            elif not any(p in capacity for p in _usable_profiles(m, cluster)):
                out.append(
                    f"{at}.capacity: no req/s figure for any usable profile "
                    f"({', '.join(_usable_profiles(m, cluster)) or 'none'}); give capacity or capacity_file "
                    f"(`migscale profile` writes one), got {m.capacity!r}"
                )
    return out


def _multinode_problems(at: str, m: ModelConfig, cluster: ClusterConfig, require_capacity: bool) -> list[str]:
    out: list[str] = []
    mn = m.multinode
    assert mn is not None
    pool = cluster.rdma_pool
    if pool is None:
        return [f"{at}.backend: 'multinode' needs an rdma_pool in the cluster file, got 'multinode'"]
    fabrics = sorted({n.fabric for n in pool.nodes})
    if mn.fabric is not None and mn.fabric not in fabrics:
        out.append(
            f"{at}.multinode.fabric: no RDMA node on that fabric (fabrics: {', '.join(fabrics)}), "
            f"got {mn.fabric!r}"
        )
    # One group needs nodes_per_group distinct nodes, each with gpus_per_node GPUs, on one fabric.
    best = max(
        (
            sum(1 for n in pool.nodes if n.fabric == f and n.gpus >= mn.gpus_per_node)
            for f in ([mn.fabric] if mn.fabric else fabrics)
        ),
        default=0,
    )
    if best < mn.nodes_per_group:
        out.append(
            f"{at}.multinode.nodes_per_group: rdma_pool has only {best} node(s) with >= {mn.gpus_per_node} "
            f"GPU(s) on one fabric, got {mn.nodes_per_group}"
        )
    if require_capacity and mn.group_capacity_rps is None:
        out.append(f"{at}.multinode.group_capacity_rps: required to plan a multinode model, got None")
    return out


def rules_from_config(b: Any) -> hpa.ScalingRules:
    """cluster.yaml ``scale_up``/``scale_down`` (pydantic) -> ``hpa.ScalingRules``."""
    from autoscaler.policy import hpa

    return hpa.ScalingRules(
        float(b.stabilization_window_s),
        hpa.SelectPolicy(b.select_policy),
        tuple(hpa.ScalingPolicy(hpa.PolicyType(p.type), int(p.value), float(p.period_s)) for p in b.policies),
    )


def policy_config(models_cfg: Any, cluster_cfg: Any, **overrides: Any) -> PolicyConfig:
    """The pure core's ``PolicyConfig`` from loaded ``models.yaml`` / ``cluster.yaml``.

    Lives here, at the edge, so ``policy/`` never imports the file-reading config layer.
    """
    from autoscaler.policy.state import PolicyConfig

    p = cluster_cfg.policy
    kw: dict[str, Any] = {
        "models": tuple(model_specs(models_cfg, cluster_cfg)),
        "slo_p99_ms": {m.name: float(m.slo.p99_ms) for m in models_cfg.models},
        "tick_s": float(p.tick_s),
        "replan_s": float(p.replan_s),
        "headroom": float(p.headroom),
        "headroom_quantile": None if p.headroom_quantile is None else float(p.headroom_quantile),
        "tolerance": float(p.tolerance),
        "short_window_s": float(p.short_window_s),
        "long_window_s": float(p.long_window_s),
        "panic_threshold": float(p.panic_threshold),
        "churn_budget": p.churn_budget,
        "scale_up": rules_from_config(p.scale_up),
        "scale_down": rules_from_config(p.scale_down),
        "metrics_stale_s": float(p.metrics_stale_s),
        "rightsize_window_s": float(p.rightsize_window_s),
    }
    kw.update(overrides)
    return PolicyConfig(**kw)
