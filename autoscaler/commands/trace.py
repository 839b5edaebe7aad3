"""CLI: ``migscale trace generate`` and ``migscale trace show`` -- demand traces for the simulator.

Traces sit before the loop: they are the load the simulator (and a locust
``trace`` shape) replays. Bad arguments exit 2 with the field and value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.commands._common import fail
from autoscaler.sim import traces as tr

trace_app = typer.Typer(help="Generate and inspect demand traces (CSV t_s,model,rps).", no_args_is_help=True)


def _models(text: str) -> list[str]:
    if text.endswith((".yaml", ".yml")):
        from autoscaler.commands._common import load_models_or_exit

        return [m.name for m in load_models_or_exit(text).models]
    return [m.strip() for m in text.split(",") if m.strip()]


def _mean(text: str, models: list[str]) -> float | dict[str, float]:
    """``--mean-rps``: one rate for all, or NAME=RPS pairs (``*=RPS`` for the rest, else 100)."""
    try:
        if "=" not in text:
            return float(text)
        out: dict[str, float] = {}
        for part in text.split(","):
            k, _, v = part.partition("=")
            out[k.strip()] = float(v)
    except ValueError:
        fail([f"--mean-rps: expected a number or NAME=RPS,..., got {text!r}"])
    # a misspelt name would otherwise leave its model at the default without a word
    stray = [k for k in out if k != "*" and k not in models]
    if stray:
        fail([f"--mean-rps: {', '.join(stray)} not among --models ({', '.join(models)}), got {text!r}"])
    return {m: out.get(m, out.get("*", 100.0)) for m in models}


def out_problem(flag: str, out: str) -> str | None:
    """Why ``out`` cannot take a new file, or None; checked before any work is done."""
    p = Path(out)
    if p.is_dir():
        return f"{flag}: is a directory, expected a file path, got {out!r}"
    if os.path.lexists(p) and not p.is_file():
        return f"{flag}: exists and is not a regular file, got {out!r}"
    if not p.parent.is_dir():
        return f"{flag}: no such directory {str(p.parent)!r}, got {out!r}"
    return None


def generate(
    kind: Annotated[str, typer.Argument(metavar="KIND", help=f"one of: {', '.join(tr.KINDS)}")],
    models: Annotated[str, typer.Option("--models", help="comma-separated names, or a models.yaml")] = "model",
    duration: Annotated[str, typer.Option("--duration", help="e.g. 24h, 90m, 3600")] = "24h",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    mean_rps: Annotated[str, typer.Option("--mean-rps", help="req/s per model: 100, or a=50,b=200")] = "100",
    step: Annotated[str, typer.Option("--step", help="sample period, e.g. 60s (per-minute counts)")] = "60s",
    out: Annotated[str, typer.Option("--out", help="CSV path; '-' prints to stdout")] = "-",
) -> None:
    """Write a seeded synthetic trace of one of the KIND shapes (the benchmark's families among them)."""
    names = _models(models)
    if out != "-" and (bad := out_problem("--out", out)):
        fail([bad])
    try:
        trace = tr.generate(kind, names, tr.parse_duration(duration, "--duration"), seed, _mean(mean_rps, names),
                            tr.parse_duration(step, "--step"))
    except tr.TraceError as exc:
        # the generator names its arguments; here they are these options
        flags = {"duration_s:": "--duration:", "step_s:": "--step:", "mean_rps.": "--mean-rps ", "models:": "--models:",
                 "seed:": "--seed:"}
        fail([next((f + p[len(a):] for a, f in flags.items() if p.startswith(a)), p) for p in exc.problems])
    try:
        text = tr.write_csv(trace, None if out == "-" else out)
    except OSError as exc:
        fail([f"--out: cannot write {out}: {exc.strerror or exc}"])
    if out == "-":
        typer.echo(text, nl=False)
    else:
        typer.echo(f"wrote {out}: {len(trace.models)} models x {len(trace.t_s)} samples, "
                   f"{trace.duration_s:.0f} s, {trace.total_requests():.0f} requests", err=True)


def show(path: Annotated[str, typer.Argument(metavar="TRACE", help="trace CSV")],
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Validate a trace and print per-model mean and peak req/s."""
    try:
        trace = tr.read_csv(path)
    except tr.TraceError as exc:
        fail(exc.problems)
    mean, peak = trace.mean_rps(), trace.peak_rps()
    data = {"duration_s": trace.duration_s, "samples": len(trace.t_s),
            "models": {m: {"mean_rps": round(mean[m], 3), "peak_rps": round(peak[m], 3)} for m in trace.models}}
    if as_json:
        typer.echo(json.dumps(data))
        return
    typer.echo(f"{path}: {trace.duration_s:g} s, {len(trace.t_s)} samples")
    for m in trace.models:
        typer.echo(f"  {m:<24} mean {mean[m]:10.2f} req/s   peak {peak[m]:10.2f} req/s")


def register(app: typer.Typer) -> None:
    trace_app.command(
        "generate",
        epilog="Example:\n\n  migscale trace generate mixed --models resnet,bert --duration 24h \\\n"
        "      --seed 1 --out trace.csv",
    )(generate)
    trace_app.command("show", epilog="Example: migscale trace show trace.csv --json")(show)
    app.add_typer(trace_app, name="trace")
