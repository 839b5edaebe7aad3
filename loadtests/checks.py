"""The load test's options checked against the models they name, before any load is sent.

Outside the loop, at the load generator's start. ``migscale loadtest`` runs
these before it creates the results folder or starts locust, and the
locustfile runs them again at ``init`` (it can be started by hand): a run that
could only end "no requests measured", judge nothing, or exclude every request
is refused with one line per problem, naming the option and the value.
No locust import: the CLI calls this without gevent's monkey-patching.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from loadtests.slo import SloSpecError, parse_slo_overrides, parse_windows
from loadtests.weights import parse_weights


def _unknown(option: str, names: Iterable[str], known: Collection[str]) -> list[str]:
    have = ", ".join(sorted(known)) or "none"
    return [f"{option}: {n!r} is not a model of MODELS (it has {have})" for n in names if n not in known]


def option_problems(
    known: Collection[str] | None,
    *,
    models: str = "",
    slo: str = "",
    slo_models: str = "",
    slo_ignore: str = "",
    user_rps: float = 10.0,
    warmup_s: float = 0.0,
    duration_s: float | None = None,
    max_error_rate: float = 0.01,
    trace_models: Collection[str] | None = None,
) -> list[str]:
    """One line per problem; ``known``: the models of models.yaml (None: not given, names unchecked)."""
    out: list[str] = []
    try:
        weights = parse_weights(models)
    except ValueError as e:
        out.append(f"--{e}")
        weights = {}
    if weights and not any(w > 0 for w in weights.values()):
        out.append(f"--models: at least one weight must be > 0, got {models!r}")
    try:
        overrides = parse_slo_overrides(slo)
    except SloSpecError as e:
        out.append(f"--{e}")
        overrides = {}
    for model, fields in overrides.items():
        rate = fields.get("max_error_rate")
        if rate is not None and rate > 1:
            out.append(f"--slo: {model}: max_error_rate is a fraction <= 1, got {rate:g}")
    only = [m.strip() for m in slo_models.split(",") if m.strip()]
    if known is not None:
        out += _unknown("--models", weights, known)
        out += _unknown("--slo", overrides, known)
        out += _unknown("--slo-models", only, known)
        out += _unknown("--shape-args path (the trace)", sorted(trace_models or ()), known)
    try:
        parse_windows(slo_ignore)
    except SloSpecError as e:
        out.append(f"--{e}")
    if not math.isfinite(user_rps) or user_rps <= 0:
        out.append(f"--user-rps: must be a finite number > 0, got {user_rps}")
    if not math.isfinite(max_error_rate) or not 0 <= max_error_rate <= 1:
        out.append(f"--max-error-rate: must be a fraction in [0, 1], got {max_error_rate}")
    if duration_s is not None and warmup_s >= duration_s:
        out.append(f"--warmup: must be shorter than --duration ({duration_s:g}s): every request would be "
                   f"excluded, got {warmup_s:g}s")
    return out
