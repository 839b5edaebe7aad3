"""Typed configuration: ``models.yaml`` (what to serve) and ``cluster.yaml`` (where).

This is the edge where a person's files enter the loop. Everything downstream
-- the planner (``policy/``), the local emulation and the Kubernetes renderer --
receives validated, frozen pydantic objects or the ``ModelSpec`` /
``ClusterState`` values built from them, never raw dicts.

Errors are data: every problem becomes one line ``path.to.field: message, got
VALUE`` inside a ``ConfigError``; the CLI prints them and exits 2, never a
traceback. YAML is read with size, alias and depth limits (``config/io.py``),
so a hostile file cannot hang the loader or eat memory. Building the core's
values and the cross-file checks live in ``config/build.py``; the package
``autoscaler.config`` re-exports both.

The models also define the MigModel CRD's schema (``act/kubernetes/crd.py``
generates it from their JSON Schema), so each cross-field check of a model
carries its CEL twin beside it (``_cel``). The module is longer than ~450
lines because both files' schemas live here, each next to its checks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autoscaler.config.io import ConfigError, Problems, format_errors, load_yaml, short
from autoscaler.mig import PRODUCTS, LayoutError, check_layout, get_product, parse_layout
from autoscaler.policy.forecast import HeadroomConfig

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "GpuConfig",
    "ModelConfig",
    "ModelsConfig",
    "PolicyConfig",
    "load_cluster",
    "load_models",
    "load_yaml",
    "parse_cluster",
    "parse_models",
]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A model's name also names its Kubernetes Service, whose name must be a DNS-1035 label:
# "9resnet" is a valid namespace but no Service.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN = re.compile(f"^{_SUBDOMAIN}$")
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
# A label key or an extended resource name: [DNS-1123 subdomain "/"] name (apimachinery's IsQualifiedName).
QUALIFIED_NAME = re.compile(f"^({_SUBDOMAIN}/)?{_LABEL_NAME}$")
EXTENDED_RESOURCE = re.compile(f"^{_SUBDOMAIN}/{_LABEL_NAME}$")
LABEL_VALUE = re.compile(f"^{_LABEL_NAME}$")  # a non-empty one; a label value may also be ""


# ---------------------------------------------------------------- schema: models.yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


def _dns_label(value: str) -> str:
    if not DNS_LABEL.match(value):
        raise PydanticCustomError(
            "dns_label", "must be a DNS-1123 label (lowercase letters, digits and '-', 1-63 characters)"
        )
    return value


def _model_name(value: str) -> str:
    if not DNS_1035_LABEL.match(value):
        raise PydanticCustomError(
            "dns_1035_label",
            "must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
            "1-63 characters): it also names the model's Kubernetes Service",
        )
    return value


def _node_name(value: str) -> str:
    if len(value) > 63 or not DNS_SUBDOMAIN.match(value):
        raise PydanticCustomError(
            "node_name",
            "must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.') of at most 63 "
            "characters: it is also the node's kubernetes.io/hostname label value",
        )
    return value


def _label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise PydanticCustomError(
            "label_value",
            "must be a Kubernetes label value (letters, digits, '-', '_' and '.', starting and ending "
            "with a letter or digit, 1-63 characters): it is the node label the pods select",
        )
    return value


def _qualified_name(value: str) -> tuple[str, str] | None:
    """(prefix, name) of a valid label key / resource name, else None."""
    prefix, _, name = value.rpartition("/")
    if not QUALIFIED_NAME.match(value) or len(name) > 63 or len(prefix) > 253:
        return None
    return prefix, name


def _label_key(value: str) -> str:
    if _qualified_name(value) is None:
        raise PydanticCustomError(
            "label_key",
            "must be a Kubernetes label key: an optional DNS-1123 subdomain prefix and '/', then a "
            "name of 1-63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit",
        )
    return value


# Resources a device plugin for RDMA must not be: the render puts rdma_resource beside
# nvidia.com/gpu in one limits map, so the GPU's own name would overwrite the GPU count.
_GPU_RESOURCES = re.compile(r"^nvidia\.com/(gpu|mig-.*)$")


def _extended_resource(value: str) -> str:
    parts = _qualified_name(value)
    # apimachinery's IsExtendedResourceName: a domain, not kubernetes.io's, no "requests." quota prefix
    if parts is None or not parts[0] or parts[0].endswith("kubernetes.io") or value.startswith("requests."):
        raise PydanticCustomError(
            "extended_resource",
            "must be an extended resource name, DOMAIN/NAME (a DNS-1123 subdomain outside "
            "kubernetes.io, '/', a name of 1-63 letters, digits, '-', '_' and '.')",
        )
    if _GPU_RESOURCES.match(value):
        raise PydanticCustomError(
            "gpu_resource",
            "is a GPU resource; give the RDMA device plugin's resource (it would replace the "
            "pods' GPU limit)",
        )
    return value


def _schema(pattern: re.Pattern[str], max_length: int) -> Any:
    """JSON Schema keywords (for editors and the MigModel CRD) of a string a validator above
    checks; the validator, not pydantic's pattern check, words the refusal."""
    return Field(json_schema_extra={"pattern": pattern.pattern, "maxLength": max_length})


ModelName = Annotated[str, AfterValidator(_model_name), _schema(DNS_1035_LABEL, 63)]
NodeName = Annotated[str, AfterValidator(_node_name), _schema(DNS_SUBDOMAIN, 63)]
Namespace = Annotated[str, AfterValidator(_dns_label), _schema(DNS_LABEL, 63)]
FabricName = Annotated[str, AfterValidator(_label_value), _schema(LABEL_VALUE, 63)]
LabelKey = Annotated[str, AfterValidator(_label_key), _schema(QUALIFIED_NAME, 317)]
ExtendedResource = Annotated[str, AfterValidator(_extended_resource), _schema(EXTENDED_RESOURCE, 317)]


def _known_profile(name: str) -> bool:
    return name in KNOWN_PROFILES


# Every MIG profile of every known product, sorted (30 names). The JSON Schema
# carries them as an enum so that a schema-only consumer (the MigModel CRD,
# an editor) rejects "9g.90gb" as the validators below do; a list of profiles
# or a capacity table longer than this must repeat or invent a name.
KNOWN_PROFILES: tuple[str, ...] = tuple(sorted({p for prod in PRODUCTS.values() for p in prod.profiles}))
UNKNOWN_PROFILE = "not a MIG profile of any known product (e.g. 1g.10gb, 3g.40gb)"
_PROFILE_NAME = Annotated[str, Field(json_schema_extra={"enum": list(KNOWN_PROFILES)})]


def _cel(rule: str, field: str, message: str, *, expression: bool = False) -> dict[str, str]:
    """One Kubernetes CEL validation rule (``x-kubernetes-validations``) for the MigModel CRD.

    The cross-field checks below are Python; the CRD carries each again as CEL
    so the API server refuses what ``migscale validate`` refuses, on the same
    field and with the same words. ``expression``: ``message`` is a CEL string
    expression (``messageExpression``) that can quote the offending value.
    tests/kubernetes/test_migmodel_crd.py evaluates both on the same inputs.
    """
    key = "messageExpression" if expression else "message"
    return {"rule": rule, "fieldPath": f".{field}", key: message}


def _or(field: str, fallback: str) -> str:
    return f"(has(self.{field}) ? self.{field} : self.{fallback})"


_TP, _PP = _or("tensor_parallel", "gpus_per_node"), _or("pipeline_parallel", "nodes_per_group")
_MULTINODE_ONLY = (
    "not used by backend 'multinode' (it takes whole GPUs; give multinode.group_capacity_rps)"
)


class SloConfig(_Strict):
    p99_ms: float = Field(gt=0, le=600_000, description="99th-percentile end-to-end latency target, ms")


class MultinodeConfig(_Strict):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(
            f"{_TP} * {_PP} == self.nodes_per_group * self.gpus_per_node",
            "tensor_parallel",
            f"'tensor_parallel x pipeline_parallel (' + string({_TP}) + ' x ' + string({_PP}) + "
            "') must equal nodes_per_group x gpus_per_node (' + "
            "string(self.nodes_per_group * self.gpus_per_node) + '), got ' + "
            "(has(self.tensor_parallel) ? string(self.tensor_parallel) : 'None')",
            expression=True,
        ),
    ]})

    nodes_per_group: int = Field(ge=1, le=64, description="nodes in one serving group (leader + workers)")
    gpus_per_node: int = Field(default=1, ge=1, le=16)
    tensor_parallel: int | None = Field(default=None, ge=1, le=1024, description="default: gpus_per_node")
    pipeline_parallel: int | None = Field(default=None, ge=1, le=1024, description="default: nodes_per_group")
    fabric: FabricName | None = Field(
        default=None, description="RDMA fabric every node of a group shares (rdma_pool's fabric label value)"
    )
    group_capacity_rps: float | None = Field(
        default=None, gt=0, description="req/s one group sustains at the SLO"
    )

    @model_validator(mode="after")
    def _world_size(self) -> MultinodeConfig:
        p = Problems()
        world = self.nodes_per_group * self.gpus_per_node
        tp = self.tensor_parallel or self.gpus_per_node
        pp = self.pipeline_parallel or self.nodes_per_group
        if tp * pp != world:
            p.add(
                "tensor_parallel",
                f"tensor_parallel x pipeline_parallel ({tp} x {pp}) must equal "
                f"nodes_per_group x gpus_per_node ({world})",
                self.tensor_parallel,
            )
        p.raise_if_any()
        return self


class ModelConfig(_Strict):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(
            "self.min_replicas <= self.max_replicas",
            "min_replicas",
            "'must be <= max_replicas (' + string(self.max_replicas) + '), got ' + string(self.min_replicas)",
            expression=True,
        ),
        _cel(
            "!self.high_availability || self.max_replicas >= 2",
            "max_replicas",
            "'high_availability needs max_replicas >= 2, got ' + string(self.max_replicas)",
            expression=True,
        ),
        _cel("self.backend != 'multinode' || has(self.multinode)", "multinode",
             "required when backend is 'multinode', got None"),
        _cel("!has(self.multinode) || self.backend == 'multinode'", "multinode",
             "\"only valid with backend: multinode, got '\" + self.backend + \"'\"", expression=True),
        _cel("self.backend != 'multinode' || !has(self.profiles)", "profiles", _MULTINODE_ONLY),
        _cel("self.backend != 'multinode' || !has(self.capacity)", "capacity", _MULTINODE_ONLY),
        _cel("self.backend != 'multinode' || !has(self.capacity_file)", "capacity_file",
             f"\"{_MULTINODE_ONLY}, got '\" + self.capacity_file + \"'\"", expression=True),
    ]})

    name: ModelName = Field(
        description="unique DNS-1035 label, the Triton model name and the name of its Service"
    )
    model_dir: str = Field(min_length=1, description="Triton model directory, relative to models.yaml")
    slo: SloConfig
    profiles: list[_PROFILE_NAME] | None = Field(
        default=None,
        min_length=1,
        max_length=len(KNOWN_PROFILES),
        description="allowed MIG profiles",
        json_schema_extra={"uniqueItems": True},
    )
    memory_gb: float | None = Field(default=None, gt=0, le=10_000, description="GiB one replica needs (as nvidia-smi reports a process's memory); compared with each MIG profile's usable GiB, not the GB in its name")
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=8, ge=1, le=1000)
    high_availability: bool = Field(default=False, description=">= 2 replicas on distinct GPUs")
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher wins when the cluster is short")
    backend: Literal["mig", "multinode"] = "mig"
    multinode: MultinodeConfig | None = None
    capacity: dict[str, Annotated[float, Field(gt=0, le=1e9)]] | None = Field(
        default=None,
        max_length=len(KNOWN_PROFILES),
        description="profile -> req/s one replica sustains at the SLO",
        json_schema_extra={"propertyNames": {"enum": list(KNOWN_PROFILES), "description": UNKNOWN_PROFILE}},
    )
    capacity_file: str | None = Field(
        default=None, min_length=1, description="YAML written by `migscale profile`"
    )

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, value: list[str] | None) -> list[str] | None:
        p = Problems()
        for i, prof in enumerate(value or ()):
            if not _known_profile(prof):
                p.add(i, UNKNOWN_PROFILE, prof)
            elif prof in value[:i]:
                p.add(i, "listed twice", prof)
        p.raise_if_any()
        return value

    @field_validator("capacity")
    @classmethod
    def _capacity_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        p = Problems()
        for prof in value or {}:
            if not _known_profile(prof):
                p.add(prof, UNKNOWN_PROFILE, prof)
        p.raise_if_any()
        return value

    @model_validator(mode="after")
    def _cross_fields(self) -> ModelConfig:
        p = Problems()
        if self.min_replicas > self.max_replicas:
            p.add("min_replicas", f"must be <= max_replicas ({self.max_replicas})", self.min_replicas)
        if self.high_availability and self.max_replicas < 2:
            p.add("max_replicas", "high_availability needs max_replicas >= 2", self.max_replicas)
        if self.backend == "multinode":
            if self.multinode is None:
                p.add("multinode", "required when backend is 'multinode'", None)
            for fld in ("profiles", "capacity", "capacity_file"):
                if getattr(self, fld) is not None:
                    p.add(fld, _MULTINODE_ONLY, getattr(self, fld))
        elif self.multinode is not None:
            p.add("multinode", "only valid with backend: multinode", self.backend)
        p.raise_if_any()
        return self


class ModelsConfig(_Strict):
    models: list[ModelConfig] = Field(min_length=1)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @model_validator(mode="after")
    def _unique(self) -> ModelsConfig:
        p = Problems()
        seen: dict[str, int] = {}
        for i, m in enumerate(self.models):
            if m.name in seen:
                p.add(("models", i, "name"), f"duplicate model name (also models[{seen[m.name]}])", m.name)
            seen.setdefault(m.name, i)
        p.raise_if_any()
        return self

    @property
    def base_dir(self) -> Path:
        """Folder relative paths in the file resolve against (the YAML's folder)."""
        return self._base_dir

    def resolve(self, relpath: str) -> Path:
        p = Path(relpath)
        return p if p.is_absolute() else (self._base_dir / p)

    def get(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


# ---------------------------------------------------------------- schema: cluster.yaml


def _as_tuple(field: Any) -> tuple:
    return field if isinstance(field, tuple) else (field,)


def _product(value: str) -> str:
    if value not in PRODUCTS:
        raise PydanticCustomError(
            "product", "unknown GPU product; known: {known}", {"known": ", ".join(PRODUCTS)}
        )
    return value


_PRODUCT = Field(json_schema_extra={"enum": list(PRODUCTS)})


class GpuConfig(_Strict):
    node: NodeName
    product: Annotated[str, _PRODUCT]
    count: int = Field(default=1, ge=1, le=64)
    emulated: bool = True
    layout: list[str] | None = Field(
        default=None, description='initial layout of every GPU, e.g. ["3g.40gb@0"]'
    )
    layouts: list[list[str]] | None = Field(
        default=None, description="initial layout per GPU (count entries)"
    )

    _prod = field_validator("product")(_product)

    def gpu_layouts(self) -> list[tuple]:
        """The parsed initial layout of each of the ``count`` GPUs."""
        raw = self.layouts if self.layouts is not None else [self.layout or []] * self.count
        return [parse_layout(",".join(lay)) for lay in raw]

    @model_validator(mode="after")
    def _check_layouts(self) -> GpuConfig:
        p = Problems()
        if self.layout is not None and self.layouts is not None:
            p.add(
                "layouts",
                "give either layout (same for every GPU) or layouts (one per GPU), not both",
                self.layouts,
            )
        if self.layouts is not None and len(self.layouts) != self.count:
            p.add(
                "layouts",
                f"needs one layout per GPU: {self.count} (count), not {len(self.layouts)}",
                self.layouts,
            )
        product = get_product(self.product)
        entries: list[tuple[Any, list[str]]] = []
        if self.layout is not None:
            entries.append(("layout", self.layout))
        for i, lay in enumerate(self.layouts or ()):
            entries.append((("layouts", i), lay))
        for field, lay in entries:
            placements = []
            index: dict[str, int] = {}  # "3g.40gb@4" -> position in the list, to name the entry
            for j, item in enumerate(lay):
                try:
                    parsed = parse_layout(item)
                except LayoutError as exc:
                    p.add((*_as_tuple(field), j), f"bad placement: {exc}", item)
                    continue
                placements.extend(parsed)
                index.update({str(pl): j for pl in parsed})
            for problem in check_layout(product, placements):
                head, sep, rest = problem.partition(": ")
                if sep and head in index:
                    # check_layout ends some messages with its own ", got START"; the entry is quoted instead
                    rest = re.sub(r", got \S+$", "", rest)
                    p.add(
                        (*_as_tuple(field), index[head]),
                        f"impossible on {self.product}: {rest}",
                        lay[index[head]],
                    )
                else:
                    p.add(field, f"impossible layout on {self.product}: {problem}", lay)
        p.raise_if_any()
        return self


class RdmaNode(_Strict):
    name: NodeName
    product: Annotated[str, _PRODUCT]
    gpus: int = Field(default=1, ge=1, le=16)
    fabric: FabricName = Field(description="this node's value of the rdma_pool's fabric_label")
    emulated: bool = True

    _prod = field_validator("product")(_product)


class NcclConfig(_Strict):
    ib_hca: str = "mlx5_0:1"
    net_gdr_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] = "PHB"
    socket_ifname: str = "eth0"
    ib_gid_index: int = Field(default=3, ge=0, le=255)


class RdmaPool(_Strict):
    fabric_label: LabelKey = Field(default="migscale.io/fabric", description="node label naming the RDMA fabric")
    nodes: list[RdmaNode] = Field(min_length=1)
    nccl: NcclConfig = NcclConfig()
    rdma_resource: ExtendedResource = Field(
        default="rdma/rdma_shared_device_a", description="extended resource of the RDMA device plugin"
    )

    @model_validator(mode="after")
    def _unique(self) -> RdmaPool:
        p = Problems()
        seen: set[str] = set()
        for i, n in enumerate(self.nodes):
            if n.name in seen:
                p.add(("nodes", i, "name"), "duplicate RDMA node name", n.name)
            seen.add(n.name)
        p.raise_if_any()
        return self


class ScalingPolicy(_Strict):
    """One HPA ``behavior`` policy: change at most ``value`` pods or percent per ``period_s``."""

    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0, le=100_000)
    period_s: float = Field(gt=0, le=1800)  # HPA caps periodSeconds at 1800


class ScalingBehavior(_Strict):
    """HPA ``behavior.scaleUp``/``scaleDown``. A field left out takes the Kubernetes default
    for its direction (``PolicyConfig`` fills it), as the API server's defaulting does."""

    stabilization_window_s: float = Field(default=0, ge=0, le=3600)  # HPA cap: 3600 s
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    policies: list[ScalingPolicy] = Field(default_factory=list)

    @field_validator("policies")
    @classmethod
    def _some(cls, v: list[ScalingPolicy]) -> list[ScalingPolicy]:
        # Kubernetes rejects an empty list ("at least one Policy"); here it would freeze the
        # direction silently. Leave the key out for the defaults, or use select_policy: Disabled.
        if not v:
            raise ValueError("must list at least one policy (leave it out for the Kubernetes default, "
                             "or set select_policy: Disabled)")
        return v


def _hpa_up() -> ScalingBehavior:
    # Kubernetes defaults (docs/hpa.md): no stabilization, +100% or +4 pods per 15 s.
    return ScalingBehavior(
        stabilization_window_s=0,
        select_policy="Max",
        policies=[
            ScalingPolicy(type="Percent", value=100, period_s=15),
            ScalingPolicy(type="Pods", value=4, period_s=15),
        ],
    )


def _hpa_down() -> ScalingBehavior:
    # Kubernetes defaults: 300 s stabilization, -100% per 15 s.
    return ScalingBehavior(
        stabilization_window_s=300,
        select_policy="Max",
        policies=[ScalingPolicy(type="Percent", value=100, period_s=15)],
    )


class PolicyConfig(_Strict):
    tick_s: float = Field(default=5, gt=0, le=3600)
    replan_s: float = Field(default=60, gt=0, le=3600,
                            description="the planner runs at least this often; in between only when a model is "
                                        "short of its target, a replica failed or the fleet changed")
    headroom: float = Field(default=0.2, ge=0, le=10,
                            description="plan capacity = forecast * (1 + headroom) until a headroom is learned, "
                                        "and always when headroom_quantile is null")
    headroom_quantile: float | None = Field(
        default=HeadroomConfig.quantile, ge=0.5, le=0.999,
        description="learn each model's headroom as this quantile of how far demand rose above the forecast "
                    "within one reaction horizon (last 4 h); null = the fixed headroom",
    )
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    short_window_s: float = Field(default=10, gt=0, le=3600)
    long_window_s: float = Field(default=60, gt=0, le=86_400)
    panic_threshold: float = Field(default=2.0, ge=1, le=100)
    churn_budget: int = Field(default=4, ge=1, le=1000,
                              description="max create+delete actions per tick that stop or move a running replica "
                                          "(a scale-up that deletes nothing is not counted)")
    scale_up: ScalingBehavior = Field(default_factory=_hpa_up)
    scale_down: ScalingBehavior = Field(default_factory=_hpa_down)

    @field_validator("scale_up", "scale_down", mode="before")
    @classmethod
    def _defaults_per_field(cls, v: Any, info: Any) -> Any:
        # `scale_down: {stabilization_window_s: 120}` keeps the default policies (Kubernetes
        # defaulting works field by field), instead of ending up with none.
        if isinstance(v, dict):
            base = (_hpa_up if info.field_name == "scale_up" else _hpa_down)().model_dump()
            return {**base, **v}
        return v
    metrics_stale_s: float = Field(default=60, gt=0, le=86_400)
    rightsize_window_s: float = Field(
        default=1800, ge=0, le=86_400,
        description="swap a replica for a smaller MIG profile once demand has stayed low this long; 0 = never",
    )

    @model_validator(mode="after")
    def _windows(self) -> PolicyConfig:
        p = Problems()
        if self.short_window_s > self.long_window_s:
            p.add("short_window_s", f"must be <= long_window_s ({self.long_window_s:g})", self.short_window_s)
        p.raise_if_any()
        return self


class RestartBackoffConfig(_Strict):
    """Restart back-off of the local backend's processes: kubelet's CrashLoopBackOff defaults
    (10 s doubling to 5 min, reset after 10 min of running)."""

    initial_s: float = Field(default=10, ge=0, le=3600)
    max_s: float = Field(default=300, ge=0, le=86_400)
    reset_after_s: float = Field(default=600, ge=0, le=86_400, description="running this long resets it")

    @model_validator(mode="after")
    def _order(self) -> RestartBackoffConfig:
        p = Problems()
        if self.initial_s > self.max_s:
            p.add("initial_s", f"must be <= max_s ({self.max_s:g})", self.initial_s)
        p.raise_if_any()
        return self


class LocalConfig(_Strict):
    tritonserver: str | None = Field(default=None, description="path; default: the nvidia-pytriton wheel's")
    run_dir: str = ".migscale"
    frontdoor_port: int = Field(default=8000, ge=0, le=65535, description="0 = pick a free port")
    api_port: int = Field(default=8080, ge=0, le=65535, description="0 = pick a free port")
    prometheus: Literal["auto", "off"] = "auto"
    model_repository: str = "triton_models"
    restart_backoff: RestartBackoffConfig = Field(default_factory=RestartBackoffConfig)

    @model_validator(mode="after")
    def _ports(self) -> LocalConfig:
        p = Problems()
        if self.frontdoor_port and self.frontdoor_port == self.api_port:
            p.add("api_port", "must differ from frontdoor_port", self.api_port)
        p.raise_if_any()
        return self


class ClusterConfig(_Strict):
    namespace: Namespace = "default"
    gpus: list[GpuConfig] = Field(default_factory=list)
    rdma_pool: RdmaPool | None = None
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)

    @model_validator(mode="after")
    def _cross(self) -> ClusterConfig:
        p = Problems()
        if not self.gpus and self.rdma_pool is None:
            p.add("gpus", "the cluster has no GPUs (give gpus or rdma_pool)", self.gpus)
        mig_nodes = {g.node for g in self.gpus}
        for i, n in enumerate(self.rdma_pool.nodes if self.rdma_pool else ()):
            if n.name in mig_nodes:
                p.add(
                    ("rdma_pool", "nodes", i, "name"),
                    "also listed under gpus; a node is MIG or RDMA pool, not both",
                    n.name,
                )
        p.raise_if_any()
        return self

    def products(self) -> list[str]:
        """Products of the MIG GPUs, in file order, without duplicates."""
        return list(dict.fromkeys(g.product for g in self.gpus))


# ---------------------------------------------------------------- loading


def _validate(cls: type[BaseModel], data: Any, path: Path | None) -> Any:
    where = f"{path}: " if path else ""
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{where}(top level): must be a mapping, got {type(data).__name__} {short(data, 40)}"], path
        )
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, cls), path) from None
    except RecursionError:
        raise ConfigError([f"{where}structure too deeply nested"], path) from None


def parse_models(data: Any, base_dir: str | Path | None = None) -> ModelsConfig:
    """Validate an already-parsed models document (tests, API); ConfigError on problems."""
    cfg = _validate(ModelsConfig, data, None)
    cfg._base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
    return cfg


def parse_cluster(data: Any) -> ClusterConfig:
    return _validate(ClusterConfig, data, None)


def load_models(path: str | Path) -> ModelsConfig:
    """Read and validate ``models.yaml``; relative paths in it resolve against its folder."""
    p = Path(path)
    cfg = _validate(ModelsConfig, load_yaml(p), p)
    cfg._base_dir = p.resolve().parent
    return cfg


def load_cluster(path: str | Path) -> ClusterConfig:
    p = Path(path)
    return _validate(ClusterConfig, load_yaml(p), p)
