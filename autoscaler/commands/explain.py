"""``migscale explain``: the last decision of the control loop, with its reasons and inputs.

Reads the decision log the loop appends to (``RUN_DIR/decisions.jsonl``, one
JSON object per tick, written by ``autoscaler.loop``) and prints the newest
decision as rich tables: per model the demand windows,
panic, correction, replicas now and wanted, the req/s asked of the planner,
the reasons; the predictive floor (forecast, horizon, learned headroom and
why it is what it is) beside the burst layer's ask; each HPA stage's
outcome; then the actions issued. With a running controller's
``RUN_DIR/status.json`` it adds what is crash-looping and why (restarts, next
restart, last error lines): a model short of replicas for that reason is
explained by it, not only by the planner's reasons.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoscaler.commands._common import fail, print_rows
from autoscaler.config.io import format_errors
from autoscaler.status import crashloop_lines, jsonable

LOG_NAME = "decisions.jsonl"


class _ModelRow(BaseModel):
    """The fields of a model's inputs that ``render`` computes with; the rest it only prints."""

    model_config = ConfigDict(extra="allow", strict=True)
    headroom: float | None = None
    headroom_quantile: float | None = None
    cycle_s: float | None = None
    stages: list[dict[str, Any]] = Field(default_factory=list)


class _Record(BaseModel):
    """The shape of a decision line as ``render`` reads it (``loop.decision_record`` writes it)."""

    model_config = ConfigDict(extra="allow", strict=True)
    t_s: float = Field(allow_inf_nan=False)
    models: dict[str, _ModelRow] | None = None
    reasons: dict[str, list[str]] | None = None
    target_rps: dict[str, Any] | None = None
    actions: list[dict[str, Any]] | None = None
    errors: list[Any] | None = None
    notes: list[Any] | None = None


@dataclass(frozen=True)
class LogRead:
    """The newest well-formed decision, and what was passed over on the way."""

    record: dict[str, Any] | None
    skipped: int = 0  # JSON objects with a t_s whose fields have the wrong shape
    last_problem: str | None = None  # "line N: field: message, got VALUE" of the newest skipped


def read_decisions(path: Path) -> LogRead:
    """Read the decision log; a line cut short by a crash mid-write is passed over silently,
    a whole JSON record of the wrong shape (a hand-edited or foreign file) is counted."""
    last: dict[str, Any] | None = None
    skipped, problem = 0, None
    with path.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if not isinstance(rec, dict) or "t_s" not in rec:
                continue
            try:
                _Record.model_validate(rec)
            except ValidationError as exc:
                skipped += 1
                problem = f"line {lineno}: {format_errors(exc, _Record)[0]}"
                continue
            except RecursionError:
                skipped += 1
                problem = f"line {lineno}: nested too deeply"
                continue
            last = rec
    return LogRead(last, skipped, problem)


def read_last_decision(path: Path) -> dict[str, Any] | None:
    """The newest well-formed decision line; None if none."""
    return read_decisions(path).record


def _utc(t_s: float) -> str | None:
    try:
        return f"{datetime.fromtimestamp(t_s, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    except (OverflowError, OSError, ValueError):  # past year 9999: not a wall-clock time
        return None


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return fmt.format(v)
    return str(v)


def headroom_sentence(name: str, d: dict[str, Any]) -> str:
    """Why a model's headroom is what it is, in one line."""
    h, q, n = d.get("headroom"), d.get("headroom_quantile"), d.get("headroom_samples", 0)
    if h is None:
        return f"{name}: no headroom (no demand measured yet)"
    if q is None:
        return f"{name}: headroom {100 * h:.0f}% is fixed (policy.headroom; learning is off)"
    horizon = _num(d.get("horizon_s"), "{:.0f}")
    if not d.get("headroom_learned"):
        return (f"{name}: headroom {100 * h:.0f}% is the prior (policy.headroom) until 30 samples exist "
                f"({n} so far, one a minute)")
    return (f"{name}: headroom {100 * h:.0f}% = the {100 * q:g}th percentile of {n} samples (last 4 h) of how far "
            f"demand rose above the forecast within one reaction horizon ({horizon} s), bounded to 0-150%")


def cycle_sentence(name: str, d: dict[str, Any]) -> str | None:
    """The recurring rise the floor expects, in one line (None: demand repeats on no period found)."""
    period = d.get("cycle_s")
    if period is None:
        return None
    head = f"{name}: demand repeats every {period / 60:g} min (autocorrelation of the last 6 h)"
    rise = d.get("recurring_rps")
    if rise is None:
        return head + "; no rise is due within the horizon"
    return head + f"; the last two cycles both rose here, so the forecast is at least {_num(rise)} req/s"


def render(rec: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    t_s = rec.get("t_s")
    head = f"decision at t={t_s}"
    if isinstance(t_s, (int, float)) and t_s > 1e9 and (when := _utc(t_s)):
        # the local and Kubernetes controllers tick on the wall clock (the simulator's clock starts at 0)
        head += f" ({when})"
    if not rec.get("source_ok", True):
        head += "  [metrics source unreachable: every model held]"
    console.print(head)
    models = rec.get("models") or {}
    reasons = rec.get("reasons") or {}
    rows = []
    for name in sorted(set(models) | set(reasons)):
        d = models.get(name, {})
        rows.append((
            name,
            _num(d.get("observed_rps")),
            _num(d.get("demand_short_rps")),
            _num(d.get("demand_long_rps")),
            _num(d.get("panicking")) if d else "—",
            _num(d.get("correction"), "{:.3f}"),
            f"{d.get('current_replicas', '—')} → {d.get('desired_replicas', '—')}" if d else "—",
            _num(d.get("current_capacity_rps")),
            _num(d.get("required_rps")),
            _num((rec.get("target_rps") or {}).get(name, d.get("target_rps"))),
            f"{_num(d.get('p99_ms'))} / {_num(d.get('slo_p99_ms'))}" if d else "—",
            ", ".join(reasons.get(name, [])),
        ))
    print_rows(console, "per model", ("model", "observed rps", "short rps", "long rps", "panic", "correction",
                                      "replicas", "capacity rps", "required rps", "target rps", "p99 / SLO ms",
                                      "reasons"), rows)
    rows = []
    why: list[str] = []
    for name in sorted(models):
        d = models[name]
        if d.get("forecast_rps") is None and d.get("burst_rps") is None:
            continue
        h = d.get("headroom")
        rows.append((name, _num(d.get("forecast_rps")), _num(d.get("horizon_s"), "{:.0f}"),
                     "—" if h is None else f"{100 * h:.0f}%", _num(d.get("floor_rps")), _num(d.get("burst_rps")),
                     _num(d.get("hold_rps")), _num(d.get("rise_rps")), _num(d.get("required_rps"))))
        why.append(headroom_sentence(name, d))
        cyc = cycle_sentence(name, d)
        if cyc:
            why.append(cyc)
    if rows:
        print_rows(console, "predictive floor and burst layer (required = max(floor, burst, hold, rise))",
                   ("model", "forecast rps", "horizon s", "headroom", "floor rps", "burst rps", "hold rps",
                    "rise rps", "required rps"), rows)
        for line in why:
            console.print(line)
    rows = [(name, st.get("name", ""), _num(st.get("value")), st.get("reason", ""))
            for name in sorted(models) for st in models[name].get("stages", [])]
    if rows:
        print_rows(console, "HPA stages", ("model", "stage", "value", "reason"), rows)
    actions = rec.get("actions") or []
    if actions:
        cols = ("kind", "model", "replica", "gpu", "profile", "start", "reason")
        print_rows(console, "actions", cols, [tuple(str(a.get(k, "")) for k in cols) for a in actions])
    else:
        console.print("actions: none")
    for e in rec.get("errors") or []:
        console.print(f"error: {e}")
    for n in rec.get("notes") or []:
        console.print(f"note: {n}")


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain(
        run_dir: Annotated[Path, typer.Option("--run-dir", help="the controller's run directory")] = Path(
            ".migscale"
        ),
        log: Annotated[
            Path | None,
            typer.Option("--log", help="a decision log to read instead of RUN_DIR/decisions.jsonl"),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the decision as JSON")] = False,
    ) -> None:
        """Print the last autoscaling decision with its reasons and inputs.

        Example: migscale explain --run-dir .migscale
        """
        path = log if log is not None else run_dir / LOG_NAME
        field = "--log" if log is not None else "--run-dir"
        if not path.is_file():
            fail(
                [
                    (
                        f"{field}: no decision log at {path}, got {str(log if log is not None else run_dir)!r} "
                        "(start the controller with `migscale up` first)"
                    )
                ]
            )
        try:
            got = read_decisions(path)
        except OSError as exc:
            fail([f"{field}: cannot read {path}: {exc}"])
        rec = got.record
        if rec is None and got.skipped:
            fail([(f"{field}: {path} holds no well-formed decision; {got.skipped} malformed, the last at "
                   f"{got.last_problem}")])
        if rec is None:
            fail([f"{field}: {path} holds no decision yet"])
        if got.skipped:
            typer.echo(f"{field}: passed over {got.skipped} malformed decision record(s) in {path}, the last at "
                       f"{got.last_problem}", err=True)
        status = _status(run_dir) if log is None else None
        if as_json:
            if status is not None:
                rec = {**rec, "crashloop": [r for r in status.get("replicas", []) if r.get("state") == "crashloop"],
                       "crashloop_held": status.get("crashloop_held", [])}
            typer.echo(json.dumps(jsonable(rec), indent=2, sort_keys=True, allow_nan=False))
        else:
            render(rec)
            for line in crashloop_lines(status or {}):
                typer.echo(line)


def _status(run_dir: Path) -> dict[str, Any] | None:
    """The running controller's status document, when there is one."""
    try:
        doc = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
