"""``migscale render``: print every Kubernetes object the backend would apply.

The review step before ``kubectl apply`` (or before letting the controller
act): it builds the same dicts ``act/kubernetes/backend.py`` sends, for the replica
counts the planner picks for a demand file (or each model's ``min_replicas``
when no demand is given), and prints them as multi-document YAML. Nothing
here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import typer
import yaml

from autoscaler.act.kubernetes.config import mig_configs, render_config
from autoscaler.act.kubernetes.migparted import mig_parted_configmap
from autoscaler.act.kubernetes.render import image_problem, min_replicas_desired, render_all
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.commands.migmodel import render_migmodels
from autoscaler.config import ClusterConfig, ConfigError, initial_cluster_state, load_demand, model_specs
from autoscaler.policy.types import ModelSpec


def planned_desired(
    specs: list[ModelSpec], demand: Mapping[str, float] | None, cluster: ClusterConfig
) -> dict[tuple[str, str], int]:
    """Replica counts from the planner (demand x (1 + headroom)); min_replicas without one."""
    try:
        from autoscaler.policy.planner import plan
    except ImportError:
        return min_replicas_desired(specs)
    rps = {s.name: (demand or {}).get(s.name, 0.0) * (1 + cluster.policy.headroom) for s in specs}
    result = plan(specs, rps, initial_cluster_state(cluster), churn_budget=None)
    desired = {k: v for k, v in result.desired.items() if v > 0}
    return desired or min_replicas_desired(specs)


def render(
    models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml")],
    cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
    demand: Annotated[
        str | None, typer.Option("--demand", help="YAML {model: req/s}; replica counts come from the planner")
    ] = None,
    image: Annotated[str, typer.Option(help="Triton image")] = "nvcr.io/nvidia/tritonserver:24.10-py3",
    migmodels: Annotated[
        bool, typer.Option("--migmodels", help="print one MigModel per model instead (for kubectl apply)")
    ] = False,
    namespace: Annotated[
        str | None, typer.Option(help="with --migmodels: their namespace (default: cluster.yaml's)")
    ] = None,
    out_dir: Annotated[
        str | None, typer.Option("--out-dir", help="with --migmodels: write migmodel-NAME.yaml files here")
    ] = None,
) -> None:
    """Print, as multi-document YAML, every Kubernetes object migscale would apply.

    No HorizontalPodAutoscaler: migscale owns the replicas of these workloads
    (through the scale subresource); an HPA on them would be a second writer.

    Example:

      migscale render examples/models.yaml examples/cluster.yaml \\
          --demand examples/demand.yaml > objects.yaml
    """
    if migmodels:
        if demand is not None:
            fail([f"--demand: MigModels carry no replica counts (the controller decides), got {demand!r}"])
        return render_migmodels(models, cluster, namespace, out_dir)
    if namespace is not None or out_dir is not None:
        fail(["--namespace and --out-dir go with --migmodels"])
    models_cfg, cluster_cfg = load_or_exit(models, cluster)
    specs = model_specs(models_cfg, cluster_cfg)
    rps = None
    if demand is not None:
        try:
            rps = load_demand(demand, [s.name for s in specs])
        except ConfigError as exc:
            fail(exc.problems)
    desired = planned_desired(specs, rps, cluster_cfg)
    if (bad := image_problem(image)) is not None:
        fail([f"--image: {bad}"])
    cfg = render_config(cluster_cfg, image=image)
    objs = render_all(specs, desired, cfg)
    entries = mig_configs(cluster_cfg)
    if entries:
        objs.append(mig_parted_configmap(entries, cfg))
    typer.echo(yaml.safe_dump_all(objs, sort_keys=False, default_flow_style=False), nl=False)


def register(app: typer.Typer) -> None:
    app.command("render")(render)
