"""Typed configuration: ``models.yaml`` and ``cluster.yaml``, validated with precise errors.

``schema`` holds the pydantic models, ``io`` the bounded YAML reader and the
error formatting, ``build`` turns validated config into the core's values
(``ModelSpec``, ``PolicyConfig``, the initial ``ClusterState``) and runs the
cross-file checks. Import the public API from here.
"""

from autoscaler.config.build import (
    MeasuredReplica,
    capacity_table,
    initial_cluster_state,
    load_capacity_file,
    load_demand,
    measured_replicas,
    model_max_batches,
    model_specs,
    policy_config,
    triton_max_batch,
    validate_pair,
)
from autoscaler.config.schema import (
    ClusterConfig,
    ConfigError,
    GpuConfig,
    ModelConfig,
    ModelsConfig,
    PolicyConfig,
    load_cluster,
    load_models,
    load_yaml,
    parse_cluster,
    parse_models,
)

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "GpuConfig",
    "MeasuredReplica",
    "ModelConfig",
    "ModelsConfig",
    "PolicyConfig",
    "capacity_table",
    "initial_cluster_state",
    "load_capacity_file",
    "load_cluster",
    "load_demand",
    "load_models",
    "load_yaml",
    "measured_replicas",
    "model_max_batches",
    "model_specs",
    "parse_cluster",
    "parse_models",
    "policy_config",
    "triton_max_batch",
    "validate_pair",
]
