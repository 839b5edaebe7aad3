"""CLI: ``migscale plan MODELS CLUSTER --demand DEMAND.yaml [--json]`` -- one planner call.

The planner (``autoscaler.policy.planner.core.plan``) run once on the cluster as
``cluster.yaml`` declares it (initial layouts, no replicas yet), for the
demand in ``DEMAND.yaml`` (model -> req/s, before headroom; the policy's
``headroom`` is added as the control loop does). Prints the assignments, the
layout of every GPU, the ordered actions, the shortfall, the cost and the
reasons -- as rich tables, or as one JSON object. Bad input exits 2.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from autoscaler.commands._common import fail, load_or_exit, print_rows


def plan_to_json(p: Any) -> dict[str, Any]:
    """The plan as plain JSON types (keys: assignments, layouts, actions, shortfall, cost, reasons, ...)."""
    return {
        "t_s": p.t_s,
        "assignments": [
            {"model": a.model, "profile": a.profile, "gpu": a.gpu, "start": a.start, "replica": a.replica}
            for a in p.assignments
        ],
        "layouts": {g: [str(pl) for pl in layout] for g, layout in p.layouts.items()},
        "actions": [
            {
                "kind": a.kind.value,
                "reason": a.reason.value,
                **{k: v for k, v in (("gpu", a.gpu), ("model", a.model), ("profile", a.profile),
                                      ("start", a.start), ("replica", a.replica)) if v is not None},
                **({"layout": [str(pl) for pl in a.layout]} if a.layout is not None else {}),
            }
            for a in p.actions
        ],
        "shortfall": dict(p.shortfall),
        "cost": {
            "gpus_used": p.cost.gpus_used,
            "slices_used": p.cost.slices_used,
            "instances_created": p.cost.instances_created,
            "instances_destroyed": p.cost.instances_destroyed,
            "gpus_repartitioned": p.cost.gpus_repartitioned,
        },
        "reasons": {m: [r.value for r in rs] for m, rs in p.reasons.items()},
        "desired": [{"model": m, "profile": pr, "replicas": n} for (m, pr), n in p.desired.items()],
        "capacity_rps": dict(p.capacity_rps),
        "target_rps": dict(p.target_rps),
    }


def _render(p: Any) -> None:
    from rich.console import Console

    console = Console()
    print_rows(console, "assignments", ("model", "profile", "gpu", "start", "replica"),
               [(a.model, a.profile, a.gpu, str(a.start), a.replica or "(new)") for a in p.assignments])
    print_rows(console, "layouts", ("gpu", "layout"),
               [(g, ", ".join(str(pl) for pl in layout) or "(empty / whole GPU)") for g, layout in p.layouts.items()])
    rows = []
    for i, a in enumerate(p.actions, 1):
        extra = a.profile or ("layout " + ",".join(str(pl) for pl in a.layout) if a.layout is not None else "")
        rows.append((str(i), a.kind.value, a.reason.value, a.gpu or "", a.model or "", extra or "",
                     "" if a.start is None else str(a.start), a.replica or ""))
    print_rows(console, "actions (in order)",
               ("#", "kind", "reason", "gpu", "model", "profile", "start", "replica"), rows)
    print_rows(console, "per model", ("model", "target req/s", "planned req/s", "shortfall req/s", "reasons"),
               [(m, f"{p.target_rps.get(m, 0.0):.1f}", f"{p.capacity_rps.get(m, 0.0):.1f}",
                 f"{p.shortfall.get(m, 0.0):.1f}", ", ".join(r.value for r in p.reasons[m])) for m in p.reasons])
    c = p.cost
    console.print(
        f"cost: {c.gpus_used} GPUs, {c.slices_used} slices, {c.instances_created} MIG instances created, "
        f"{c.instances_destroyed} destroyed, {c.gpus_repartitioned} GPUs repartitioned"
    )


def plan_cmd(
    models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml (with capacity tables)")],
    cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml (GPUs, initial layouts, policy)")],
    demand: Annotated[str, typer.Option("--demand", help="DEMAND.yaml: model -> req/s (before headroom)")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    churn_budget: Annotated[
        int | None, typer.Option("--churn-budget", min=0, help="cap CREATE+DELETE actions (default: no cap)")
    ] = None,
) -> None:
    """Plan MIG slices for a demand and print assignments, layouts, actions, shortfall and cost.

    Example:

      migscale plan examples/models.yaml examples/cluster.yaml \\
          --demand examples/demand.yaml --json
    """
    from autoscaler.config import ConfigError, initial_cluster_state, load_demand, model_specs
    from autoscaler.policy.planner import plan

    models_cfg, cluster_cfg = load_or_exit(models, cluster)
    specs = model_specs(models_cfg, cluster_cfg)
    try:
        wanted = load_demand(demand, [s.name for s in specs])
    except ConfigError as exc:
        fail(exc.problems)
    headroom = float(getattr(cluster_cfg.policy, "headroom", 0.0) or 0.0)
    # Every declared model gets a figure: one missing from the file asks for 0 req/s
    # (its min_replicas still hold), so the plan never "holds blind" here.
    target = {s.name: wanted.get(s.name, 0.0) * (1.0 + headroom) for s in specs}
    p = plan(specs, target, initial_cluster_state(cluster_cfg), churn_budget=churn_budget)
    if as_json:
        typer.echo(json.dumps(plan_to_json(p), indent=2))
    else:
        _render(p)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
