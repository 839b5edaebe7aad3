"""``migscale render``: print every Kubernetes object the backend would apply.

The review step before ``kubectl apply`` (or before letting the controller
act): it builds the same dicts ``act/kubernetes/backend.py`` sends, for the replica
counts the planner picks for a demand file (no demand file: demand 0, so each
model's ``min_replicas`` as far as the GPUs hold them), and prints them as
multi-document YAML. A model the GPUs cannot give its ``min_replicas`` is named
on stderr with the count wanted and the count rendered; the render still
exits 0, as the controller would run that plan. Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from autoscaler.act.kubernetes.config import mig_configs, render_config
from autoscaler.act.kubernetes.migparted import mig_parted_configmap
from autoscaler.act.kubernetes.render import MODEL_LABEL, image_problem, render_all
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.commands.migmodel import render_migmodels
from autoscaler.config import ClusterConfig, ConfigError, initial_cluster_state, load_demand, model_specs
from autoscaler.config.io import dump_yaml_all
from autoscaler.policy.types import ModelSpec


def planned_desired(
    specs: list[ModelSpec], demand: Mapping[str, float] | None, cluster: ClusterConfig
) -> dict[tuple[str, str], int]:
    """The planner's replica counts for demand x (1 + headroom), as ``migscale plan`` gives them
    (no demand: 0 req/s, so each model's min_replicas where the GPUs hold them)."""
    from autoscaler.policy.planner import plan

    rps = {s.name: (demand or {}).get(s.name, 0.0) * (1 + cluster.policy.headroom) for s in specs}
    result = plan(specs, rps, initial_cluster_state(cluster), churn_budget=None)
    return {k: v for k, v in result.desired.items() if v > 0}


def rendered_replicas(objs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Replicas (multinode: groups) per model in the rendered workloads."""
    out: dict[str, int] = {}
    for o in objs:
        if o.get("kind") in ("Deployment", "LeaderWorkerSet"):
            name = o["metadata"]["labels"][MODEL_LABEL]
            out[name] = out.get(name, 0) + int(o["spec"]["replicas"])
    return out


def short_of_minimum(specs: Sequence[ModelSpec], objs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per model rendered with fewer replicas than its min_replicas."""
    got = rendered_replicas(objs)
    return [
        f"render: {s.name}: min_replicas {s.min_replicas}, rendered {got.get(s.name, 0)} "
        "(the cluster's GPUs hold no more beside the other models)"
        for s in specs
        if got.get(s.name, 0) < s.min_replicas
    ]


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
    force: Annotated[
        bool,
        typer.Option("--force", help="with --out-dir: also replace files render --migmodels did not write"),
    ] = False,
) -> None:
    """Print, as multi-document YAML, every Kubernetes object migscale would apply.

    No HorizontalPodAutoscaler: migscale owns the replicas of these workloads
    (through the scale subresource); an HPA on them would be a second writer.
    A model the GPUs cannot give its min_replicas is named on stderr (wanted and
    rendered); the exit status is still 0.

    With --migmodels --out-dir, no file is written unless every one can be: an
    existing migmodel-NAME.yaml is replaced only when render --migmodels wrote it
    (its first line says so) or with --force.

    Example:

      migscale render examples/models.yaml examples/cluster.yaml \\
          --demand examples/demand.yaml > objects.yaml
    """
    if migmodels:
        if demand is not None:
            fail([f"--demand: MigModels carry no replica counts (the controller decides), got {demand!r}"])
        return render_migmodels(models, cluster, namespace, out_dir, force)
    if namespace is not None or out_dir is not None or force:
        fail(["--namespace, --out-dir and --force go with --migmodels"])
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
    typer.echo(dump_yaml_all(objs), nl=False)
    for line in short_of_minimum(specs, objs):
        typer.echo(line, err=True)


def register(app: typer.Typer) -> None:
    app.command("render")(render)
