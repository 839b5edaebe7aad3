"""``migscale profile``: measure each model's capacity per MIG profile and write capacity.yaml.

Before the loop: the planner trusts these numbers. For each model x profile a
real replica is started (an emulated slice here; a real MIG instance when NVML
finds one of that profile), swept by ``autoscaler.runtime.profile``, and stopped.
Exit codes: 0 all models have a capacity; 2 bad input; 3 some model's SLO is
met by no profile (the file is still written for the others).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from autoscaler.act.local.pids import owned_tempdir
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.config.io import dump_yaml
from autoscaler.runtime.profile import TritonMeasurer, plot
from autoscaler.runtime.profile_sweep import (
    CURVE_FRACTIONS,
    Arrivals,
    PointRule,
    ProfileResult,
    capacity_document,
    concurrency_levels,
    curve_search,
    rate_search,
    sweep,
    table_capacity,
)

EXIT_NO_PROFILE_MEETS_SLO = 3
# The point rule's defaults: the CLI's options default to them, so there is one owner.
_RULE = PointRule()


_DISCOVERED: list | None = None


def _real_mig_uuid(profile: str) -> str | None:
    """UUID of a real MIG instance of ``profile`` on this host (``autoscaler.observe.nvml``).

    None when there is no driver, no MIG GPU or no such instance: then the slice is emulated.
    NVML is asked once per run (discovery takes ~100 ms per GPU on a real host).
    """
    global _DISCOVERED
    if _DISCOVERED is None:
        from autoscaler.observe.nvml import discover

        _DISCOVERED = discover()
    for gpu in _DISCOVERED:
        for inst in gpu.instances:
            if inst.profile == profile and inst.uuid:
                return str(inst.uuid)
    return None


def _emulated_slot(cluster: Any, profile: str) -> tuple[str, str, int] | None:
    """(product, gpu id, start) of the first emulated cluster GPU whose product has ``profile``."""
    from autoscaler.mig import get_product
    from autoscaler.mig.layout import best_start

    per_node: dict[str, int] = {}
    for g in cluster.gpus:
        idx = per_node.get(g.node, 0)
        per_node[g.node] = idx + g.count
        prod = get_product(g.product)
        if g.emulated and profile in prod.profiles:
            start = best_start(prod, [], profile)
            return g.product, f"{g.node}/{idx}", int(start if start is not None else prod.profile(profile).starts[0])
    return None


def _replica_env(cluster: Any, profile: str, model: str) -> tuple[dict[str, str], str] | None:
    from autoscaler.act.local.emulation import emulation_env, real_mig_env

    uuid = _real_mig_uuid(profile)
    if uuid:
        return real_mig_env(uuid, model), "mig"
    slot = _emulated_slot(cluster, profile)
    if slot is None:
        return None
    product, gpu, start = slot
    return emulation_env(product, profile, gpu, start, model), "emulated"


def _allowed_profiles(models_cfg: Any, cluster_cfg: Any) -> dict[str, list[str]]:
    from autoscaler.config.build import _usable_profiles  # the same rule model_specs applies

    return {m.name: _usable_profiles(m, cluster_cfg) for m in models_cfg.models if m.backend == "mig"}


def run_profile(
    models_cfg: Any,
    cluster_cfg: Any,
    plan: list[tuple[Any, str]],
    rule: PointRule,
    max_concurrency: int,
    workdir: Path,
    tritonserver: str | None = None,
    arrivals: Arrivals = Arrivals.CLOSED,
    refine: int = 4,
) -> list[ProfileResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoscaler.act.local.triton import TritonError, TritonProcess

    levels = concurrency_levels(max_concurrency)
    n_points = len(levels) + (1 + refine + len(CURVE_FRACTIONS) if arrivals is Arrivals.POISSON else 0)
    results: list[ProfileResult] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), transient=False) as progress:
        overall = progress.add_task("all", total=len(plan), status="")
        for i, (m, profile) in enumerate(plan):
            task = progress.add_task(f"{m.name} on {profile}", total=n_points, status="starting replica")
            env, kind = _replica_env(cluster_cfg, profile, m.name) or ({}, "")
            mdir = models_cfg.resolve(m.model_dir).resolve()
            result = ProfileResult(model=m.name, profile=profile, slo_p99_ms=float(m.slo.p99_ms), env=kind,
                                   arrivals=arrivals)
            proc = TritonProcess(mdir.parent, [mdir.name], workdir / f"replica-{i}", env=env,
                                 tritonserver=tritonserver)
            try:
                proc.start()
                result.startup_s = proc.wait_ready(120)
                measurer = TritonMeasurer(proc.url_http, proc.url_metrics, mdir.name, rule)

                def on_point(p, task=task):
                    progress.update(task, advance=1, status=(
                        f"c={p.concurrency} {p.throughput_rps:.0f} req/s p99 "
                        f"{p.p99_ms if p.p99_ms is not None else float('nan'):.0f} ms "
                        f"batch {p.avg_batch or 0:.1f}"))

                result.points, result.stop = sweep(measurer.measure, result.slo_p99_ms, levels, on_point)
                upper = result.closed_capacity_rps
                if arrivals is Arrivals.POISSON and upper:
                    def on_rate(p, task=task):
                        progress.update(task, advance=1, status=(
                            f"Poisson {p.offered_rps:.1f} req/s p99 "
                            f"{p.p99_ms if p.p99_ms is not None else float('nan'):.0f} ms"))

                    result.open_points = rate_search(measurer.measure_rate, result.slo_p99_ms, upper, refine,
                                                     on_rate)
                    saturation = max((p.throughput_rps for p in result.points if not p.errors), default=0.0)
                    result.curve_points = curve_search(measurer.measure_rate, result.slo_p99_ms, saturation,
                                                       result.open_points, on_point=on_rate)
            except TritonError as e:
                progress.console.print(f"[red]{m.name} on {profile}: replica failed: {e}")
            finally:
                proc.stop()
            cap = result.capacity_rps
            progress.update(task, completed=n_points, status=(
                f"capacity {table_capacity(cap):.1f} req/s ({result.stop.value if result.stop else 'failed'})"
                if cap is not None else f"no point within p99 {result.slo_p99_ms:g} ms"))
            progress.advance(overall)
            results.append(result)
    return results


def profile(
    models_yaml: Annotated[Path, typer.Argument(metavar="MODELS", help="models.yaml")],
    cluster_yaml: Annotated[Path, typer.Argument(metavar="CLUSTER", help="cluster.yaml (the emulated GPUs to profile on)")],
    models: Annotated[str, typer.Option(help="only these models, comma list (default: every MIG model)")] = "",
    profiles: Annotated[str, typer.Option(help="only these profiles, e.g. 1g.10gb,3g.40gb (default: all allowed)")] = "",
    out: Annotated[Path, typer.Option(help="capacity table to write")] = Path("capacity.yaml"),
    plot_path: Annotated[Path | None, typer.Option("--plot", help="PNG: throughput vs p99 (default: OUT with .png)")] = None,
    point_s: Annotated[float, typer.Option(help="minimum seconds per concurrency point")] = _RULE.point_s,
    min_requests: Annotated[int, typer.Option(help="minimum requests per concurrency point")] = _RULE.min_requests,
    warmup_s: Annotated[float, typer.Option(help="warm-up seconds before each point is measured")] = _RULE.warmup_s,
    max_concurrency: Annotated[int, typer.Option(help="highest client concurrency tried")] = 64,
    arrivals: Annotated[Arrivals, typer.Option(help=(
        "closed: capacity from N requests in flight; poisson: then search the highest Poisson rate "
        "meeting the SLO, as independent users send (lower, and what online traffic gets)"))] = Arrivals.CLOSED,
    open_requests: Annotated[int, typer.Option(help="poisson: requests per offered rate (fewer read the p99 "
                                                     "low: the queue starts empty)")] = _RULE.open_requests,
    refine: Annotated[int, typer.Option(help="poisson: bisection steps below the closed-loop capacity "
                                             "(resolution capacity / 2**refine)")] = 4,
) -> None:
    """Measure req/s at the SLO for each model x MIG profile; write capacity.yaml and a plot.

    Example:

        migscale profile examples/models.yaml examples/cluster.yaml \\
            --models resnet --profiles 1g.10gb,3g.40gb \\
            --out capacity.yaml --plot capacity.png

    For online traffic add `--arrivals poisson`: the capacity is then the highest
    Poisson rate meeting the SLO, which is lower than N requests in flight give.

    Reference the result from models.yaml with `capacity_file: capacity.yaml`.
    Exit 3 when a model's SLO is met on no profile (the file is still written).
    """
    models_cfg, cluster_cfg = load_or_exit(models_yaml, cluster_yaml, require_capacity=False)
    problems: list[str] = []
    if point_s <= 0:
        problems.append(f"--point-s: must be > 0, got {point_s}")
    if min_requests < 1:
        problems.append(f"--min-requests: must be >= 1, got {min_requests}")
    if warmup_s < 0:
        problems.append(f"--warmup-s: must be >= 0, got {warmup_s}")
    if max_concurrency < 1:
        problems.append(f"--max-concurrency: must be >= 1, got {max_concurrency}")
    if open_requests < 100:
        problems.append(f"--open-requests: must be >= 100 (a p99 needs 100 samples), got {open_requests}")
    if not 0 <= refine <= 8:
        problems.append(f"--refine: must be within 0..8, got {refine}")
    inputs = {models_yaml.resolve(): "MODELS", cluster_yaml.resolve(): "CLUSTER"}
    for flag, path in (("--out", out), ("--plot", plot_path or out.with_suffix(".png"))):
        if path.resolve() in inputs:  # the table would be written over the file it was read from
            problems.append(f"{flag}: {path} is {inputs[path.resolve()]}; give another file, got {str(path)!r}")
    allowed = _allowed_profiles(models_cfg, cluster_cfg)
    wanted = [x.strip() for x in models.split(",") if x.strip()] or list(allowed)
    for name in wanted:
        if name not in allowed:
            problems.append(f"--models: {name!r} is not a MIG model in {models_yaml} "
                            f"(known: {', '.join(allowed) or 'none'}), got {models!r}")
    want_profiles = [x.strip() for x in profiles.split(",") if x.strip()]
    plan: list[tuple[Any, str]] = []
    for name in wanted:
        if name not in allowed:
            continue
        m = models_cfg.get(name)
        chosen = want_profiles or allowed[name]
        for prof in chosen:
            if prof not in allowed[name]:
                problems.append(f"--profiles: {prof!r} is not allowed for {name} on this cluster "
                                f"(allowed: {', '.join(allowed[name]) or 'none'}), got {profiles!r}")
            elif _real_mig_uuid(prof) is None and _emulated_slot(cluster_cfg, prof) is None:
                problems.append(f"--profiles: no emulated GPU in {cluster_yaml} offers {prof!r} and NVML found "
                                f"no such MIG instance, got {prof!r}")
            else:
                plan.append((m, prof))
    if problems:
        fail(problems)
    rule = PointRule(point_s=point_s, min_requests=min_requests, warmup_s=warmup_s, open_requests=open_requests)
    started = time.perf_counter()
    tritonserver = getattr(getattr(cluster_cfg, "local", None), "tritonserver", None)
    with owned_tempdir("migscale-profile-") as tmp:
        results = run_profile(models_cfg, cluster_cfg, plan, rule, max_concurrency, tmp, tritonserver,
                              arrivals, refine)
    elapsed = time.perf_counter() - started
    doc = capacity_document(results)
    doc["run"] = {"seconds": round(elapsed, 1), "point_s": point_s, "min_requests": min_requests,
                               "warmup_s": warmup_s, "max_concurrency": max_concurrency, "arrivals": arrivals.value}
    if arrivals is Arrivals.POISSON:
        doc["run"].update(open_requests=open_requests, refine=refine)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# written by `migscale profile`; reference it from models.yaml as capacity_file\n"
                   + dump_yaml(doc, sort_keys=False))
    png = plot_path or out.with_suffix(".png")
    plot(results, str(png))
    typer.echo(f"wrote {out} and {png} in {elapsed:.1f}s")
    for name in wanted:
        table = doc["models"].get(name, {})
        typer.echo(f"  {name}: " + (", ".join(f"{p} {v:g} req/s" for p, v in table.items()) or "no capacity"))
    unmet = [name for name in wanted if not doc["models"].get(name)]
    if unmet:
        for name in unmet:
            m = models_cfg.get(name)
            best = [(r.profile, min((p.p99_ms for p in r.points if p.p99_ms is not None), default=None))
                    for r in results if r.model == name]
            detail = ", ".join(f"{p}: best p99 {v:.1f} ms" if v is not None else f"{p}: no measurement"
                               for p, v in best)
            typer.echo(f"{name}: no profile meets its SLO p99 <= {m.slo.p99_ms:g} ms ({detail}); "
                       "relax the SLO or allow a larger profile", err=True)
        raise typer.Exit(EXIT_NO_PROFILE_MEETS_SLO)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
