"""CLI commands for the foundation: ``validate``, ``schema`` and ``layouts``.

These are the checks a person runs before the loop starts: is my config
right (``validate``), what may it contain (``schema``), and how may this GPU
be cut (``layouts``). They only read files and ask ``autoscaler.mig``; nothing
here touches a GPU or a server. Bad input exits 2 with one line per problem.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoscaler.act.local.preflight import preflight as local_preflight
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.config import ClusterConfig, ModelsConfig, initial_cluster_state, model_specs
from autoscaler.mig import (
    PRODUCTS,
    LayoutError,
    Placement,
    Product,
    check_layout,
    free_starts,
    is_maximal,
    maximal_layouts,
    parse_layout,
)


class Which(str, Enum):
    models = "models"
    cluster = "cluster"
    both = "both"


def _find_product(name: str) -> Product:
    if name in PRODUCTS:
        return PRODUCTS[name]
    for key, prod in PRODUCTS.items():  # be forgiving about case: "a100-sxm4-80gb"
        if key.lower() == name.lower():
            return prod
    fail([f"product: unknown GPU product, got {name!r}; valid products: {', '.join(PRODUCTS)}"])


def _mix(layout: tuple[Placement, ...]) -> str:
    counts: dict[str, int] = {}
    for pl in sorted(layout, key=lambda p: (-int(p.profile.split("g")[0]), p.start)):
        counts[pl.profile] = counts.get(pl.profile, 0) + 1
    return " + ".join(f"{n}x {prof}" if n > 1 else prof for prof, n in counts.items())


def validate(
    models: Annotated[str, typer.Argument(metavar="MODELS", help="models.yaml")],
    cluster: Annotated[str, typer.Argument(metavar="CLUSTER", help="cluster.yaml")],
    preflight: Annotated[bool, typer.Option(
        "--preflight/--no-preflight",
        help="also check what the local backend needs: tritonserver, config.pbtxt, torch for multinode models",
    )] = True,
) -> None:
    """Check MODELS and CLUSTER alone and together; print what they describe.

    Exit 0 when both are valid, 2 with one line per problem (file, field path,
    offending value; a missing dependency with its install command) otherwise.
    """
    models_cfg, cluster_cfg = load_or_exit(models, cluster)
    if preflight:
        problems = local_preflight(models_cfg, cluster_cfg, import_modules=False)
        if problems:
            fail([f"{models}: {p}" if p.startswith("models[") else f"{cluster}: {p}" for p in problems])
    _summary(models_cfg, cluster_cfg)


def _summary(models_cfg: ModelsConfig, cluster_cfg: ClusterConfig) -> None:
    console = Console()
    specs = {s.name: s for s in model_specs(models_cfg, cluster_cfg)}
    mt = Table(title="models", title_justify="left")
    for col in ("name", "backend", "p99 SLO", "replicas", "usable profiles (req/s per replica)"):
        mt.add_column(col)
    for m in models_cfg.models:
        spec = specs[m.name]
        if m.backend == "multinode" and m.multinode is not None:
            mn = m.multinode
            prof = (
                f"group of {mn.nodes_per_group} node(s) x {mn.gpus_per_node} GPU, {mn.group_capacity_rps:g}/s"
            )
        else:
            prof = ", ".join(
                f"{p} {spec.capacity[p]:g}" if p in spec.capacity else p for p in spec.allowed_profiles
            )
        reps = f"{m.min_replicas}..{m.max_replicas}" + (" HA" if m.high_availability else "")
        mt.add_row(m.name, m.backend, f"{m.slo.p99_ms:g} ms", reps, prof, end_section=False)
    gt = Table(title="GPUs", title_justify="left")
    for col in ("id", "product", "kind", "initial layout"):
        gt.add_column(col)
    state = initial_cluster_state(cluster_cfg)
    for g in state.gpus:
        kind = ("emulated " if g.emulated else "") + (
            "MIG" if g.mig_enabled else f"RDMA pool, fabric {g.fabric}"
        )
        gt.add_row(g.id, g.product, kind, ", ".join(map(str, g.layout)) or "-")
    console.print(mt)
    console.print(gt)
    pol = cluster_cfg.policy
    console.print(
        f"policy: tick {pol.tick_s:g} s, headroom {pol.headroom:.0%}, tolerance {pol.tolerance:.0%}, "
        f"churn budget {pol.churn_budget}/tick, "
        f"scale-down stabilization {pol.scale_down.stabilization_window_s:g} s"
    )
    n_rdma = sum(1 for g in state.gpus if g.rdma)
    console.print(
        f"[green]valid:[/] {len(models_cfg.models)} models, {len(state.gpus)} GPUs "
        f"({len(state.gpus) - n_rdma} MIG, {n_rdma} RDMA pool)"
    )


def schema(
    which: Annotated[Which, typer.Option("--which", help="models, cluster or both")] = Which.both,
) -> None:
    """Print the JSON Schema of models.yaml and/or cluster.yaml."""
    from autoscaler.config import ClusterConfig as C
    from autoscaler.config import ModelsConfig as M

    if which is Which.models:
        out: dict = M.model_json_schema()
    elif which is Which.cluster:
        out = C.model_json_schema()
    else:
        out = {"models.yaml": M.model_json_schema(), "cluster.yaml": C.model_json_schema()}
    typer.echo(json.dumps(out, indent=2))


def layouts(
    product: Annotated[str, typer.Argument(metavar="PRODUCT", help=f"one of: {', '.join(PRODUCTS)}")],
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of layouts")] = False,
    check: Annotated[
        str | None,
        typer.Option("--check", metavar="LAYOUT", help='check one layout, e.g. "3g.40gb@0,3g.40gb@4"'),
    ] = None,
) -> None:
    """List the maximal MIG layouts of PRODUCT's standard profiles, or check one layout.

    A layout is maximal when no further 1g/2g/3g/4g/7g instance fits. With
    --check: exit 0 when the layout is valid, 1 with the reasons when not,
    2 when it cannot be parsed.
    """
    prod = _find_product(product)
    if check is not None:
        _check(prod, check, as_json)
        return
    found = maximal_layouts(prod)
    if as_json:
        typer.echo(json.dumps([[pl.to_json() for pl in lay] for lay in found]))
        return
    table = Table(
        title=f"{prod.name}: {len(found)} maximal layouts of the standard profiles", title_justify="left"
    )
    for col in ("#", "layout (profile@start)", "mix", "compute", "memory slots"):
        table.add_column(col)
    for i, lay in enumerate(found, 1):
        compute = sum(prod.profiles[pl.profile].compute for pl in lay)
        slots = sum(prod.profiles[pl.profile].mem_slots for pl in lay)
        table.add_row(
            str(i),
            ", ".join(map(str, lay)),
            _mix(lay),
            f"{compute}/{prod.compute_slices}",
            f"{slots}/{prod.mem_slots}",
        )
    Console().print(table)


def _check(prod: Product, text: str, as_json: bool) -> None:
    try:
        layout = parse_layout(text)
    except LayoutError as exc:
        fail([f"--check: {exc}"])
    problems = check_layout(prod, layout)
    room: list[str] = []
    if not problems:
        room = [f"{p.name}@{s}" for p in prod.standard_profiles() for s in free_starts(prod, layout, p.name)]
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "product": prod.name,
                    "layout": [pl.to_json() for pl in layout],
                    "valid": not problems,
                    "problems": problems,
                    "maximal": not problems and is_maximal(prod, layout),
                    "room_for": room,
                }
            )
        )
    elif problems:
        for line in problems:
            typer.echo(f"invalid: {line}", err=True)
    else:
        maximal = "maximal" if not room else f"not maximal, room for {', '.join(room)}"
        typer.echo(f"valid on {prod.name}: {', '.join(map(str, layout)) or '(empty)'} ({maximal})")
    if problems:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("validate", epilog="Example: migscale validate examples/models.yaml examples/cluster.yaml")(
        validate
    )
    app.command("schema", epilog="Example: migscale schema --which models > models.schema.json")(schema)
    app.command(
        "layouts",
        epilog="Examples:\n\n  migscale layouts A100-SXM4-80GB --json\n"
        '  migscale layouts A100-SXM4-80GB --check "3g.40gb@0,3g.40gb@4"',
    )(layouts)
