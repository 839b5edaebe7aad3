"""The status document of a running controller (``migscale status --json``, ``/v1/status``).

A pure function of the cluster state, the URLs and the per-replica numbers,
so the controller (writing ``run_dir/status.json`` every second) and the
metrics API (serving ``/v1/status``) produce the same JSON. Unknown numbers
stay ``null``: a replica without a second metrics sample has no req/s yet.

A multinode group is several planner replicas (one per whole GPU) but ONE
entry here: id = the group id, ``gpus`` = its GPUs, ``members`` = one row per
process (rank, pid, port, state, role, gpu); port/pid are the leader's.

A crash-looping replica (state ``crashloop``) carries ``restarts``,
``next_restart_in_s`` and ``last_error`` (the last error lines of its log);
``infrastructure`` says the same of nginx and Prometheus, and ``crashloop_held``
lists the models that get no more replacements until one of theirs is ready.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoscaler.policy.types import ClusterState


@dataclass(frozen=True)
class ReplicaEndpoint:
    port: int | None  # HTTP port of its tritonserver
    pid: int | None


@dataclass(frozen=True)
class GroupView:
    """A multinode group as status shows it; keyed by group id in ``build_status(groups=)``."""

    member_ids: tuple[str, ...]  # the planner's replica ids, rank order
    gpus: tuple[str, ...]  # rank order; gpus[0] is the leader's
    members: tuple[Mapping, ...] = field(default=())  # {rank, pid, port, state, role, gpu}


@dataclass(frozen=True)
class ReplicaHealth:
    """How a replica has been faring: restarts, and when crash-looping, why and until when."""

    restarts: int = 0
    next_restart_in_s: float | None = None
    last_error: tuple[str, ...] = ()
    exit_code: int | None = None


@dataclass(frozen=True)
class ReplicaNumbers:
    req_s: float | None = None
    p99_ms: float | None = None


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def build_status(
    cluster: ClusterState,
    *,
    frontdoor: str | None,
    metrics_api: str | None,
    prometheus: str | None,
    endpoints: Mapping[str, ReplicaEndpoint] | None = None,
    numbers: Mapping[str, ReplicaNumbers] | None = None,
    groups: Mapping[str, GroupView] | None = None,
    metrics_mode: str | None = None,
    controller_pid: int | None = None,
    t_s: float | None = None,
    health: Mapping[str, ReplicaHealth] | None = None,
    infrastructure: Mapping[str, Mapping] | None = None,
    crashloop_held: tuple[str, ...] = (),
) -> dict:
    endpoints = endpoints or {}
    health = health or {}
    numbers = numbers or {}
    groups = groups or {}
    group_of = {mid: gid for gid, g in groups.items() for mid in g.member_ids}
    listed: set[str] = set()
    replicas = []
    for r in sorted(cluster.replicas, key=lambda r: (r.model, r.gpu, r.start, r.id)):
        gid = group_of.get(r.id)
        rid = gid or r.id
        if rid in listed:
            continue  # a group is listed once, at its first member
        listed.add(rid)
        ep = endpoints.get(rid, ReplicaEndpoint(None, None))
        n = numbers.get(rid, ReplicaNumbers())
        row = {
            "id": rid,
            "model": r.model,
            "profile": r.profile,
            "gpu": groups[gid].gpus[0] if gid else r.gpu,
            "start": r.start,
            "port": ep.port,
            "state": r.state.value,
            "pid": ep.pid,
            "req_s": _round(n.req_s, 2),
            "p99_ms": _round(n.p99_ms, 2),
        }
        h = health.get(rid)
        if h is not None:
            row["restarts"] = h.restarts
            if h.last_error or h.next_restart_in_s is not None:
                row["next_restart_in_s"] = _round(h.next_restart_in_s, 1)
                row["last_error"] = list(h.last_error)
                row["exit_code"] = h.exit_code
        if gid:
            row["gpus"] = list(groups[gid].gpus)
            row["members"] = [dict(m) for m in groups[gid].members]
        replicas.append(row)
    gpus = [
        {
            "id": g.id,
            "product": g.product,
            "emulated": g.emulated,
            "layout": [str(p) for p in sorted(g.layout)],
            "mig_enabled": g.mig_enabled,
            "reserved_by": g.reserved_by,
        }
        for g in cluster.gpus
    ]
    return {
        "frontdoor": frontdoor,
        "metrics_api": metrics_api,
        "prometheus": prometheus,
        "metrics_mode": metrics_mode,
        "controller_pid": controller_pid,
        "t_s": t_s,
        "gpus": gpus,
        "replicas": replicas,
        "infrastructure": {k: dict(v) for k, v in (infrastructure or {}).items()},
        "crashloop_held": sorted(crashloop_held),
    }


def render_table(status: dict) -> str:
    """Plain-text table for ``migscale status`` (no colour codes: pipes and CI logs read it)."""
    head = ("MODEL", "PROFILE", "GPU/SLOT", "PORT", "STATE", "RESTARTS", "REQ/S", "P99 MS")
    rows = [head]
    for r in status.get("replicas", []):
        rows.append(
            (
                str(r["model"]),
                str(r["profile"]),
                "+".join(r["gpus"]) if r.get("gpus") else f"{r['gpu']}@{r['start']}",
                "-" if r.get("port") is None else str(r["port"]),
                str(r["state"]),
                str(r.get("restarts", 0)),
                "-" if r.get("req_s") is None else f"{r['req_s']:.1f}",
                "-" if r.get("p99_ms") is None else f"{r['p99_ms']:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    trouble = crashloop_lines(status)
    cfg = status.get("config")
    if isinstance(cfg, dict):
        # a declared model with no replica at all has no row above: say so (the fleet is full,
        # or its replicas are still being placed); its front-door route answers 503 meanwhile
        served = {r.get("model") for r in status.get("replicas", [])}
        missing = [m for m in cfg.get("models") or [] if m not in served]
        if missing:
            trouble.append(f"no replica: {', '.join(missing)} (the fleet has no room, or they are being placed; "
                           "`migscale explain` says which)")
    if trouble:
        lines += ["", *trouble]
    lines.append("")
    lines.append(f"front door:  {status.get('frontdoor')}{_infra_note(status, 'nginx')}")
    lines.append(f"metrics API: {status.get('metrics_api')}")
    prom = status.get("prometheus")
    mode = status.get("metrics_mode")
    if not prom:
        lines.append("prometheus:  not running (direct scrape of each replica)")
    elif mode == "prometheus-down":
        lines.append(f"prometheus:  {prom} DOWN: the loop holds every model (no scale-down)"
                     f"{_infra_note(status, 'prometheus')}")
    elif mode == "prometheus-warming":
        lines.append(f"prometheus:  {prom} restarted or dropped scrapes: the loop holds every model until it has a whole window")
    else:
        lines.append(f"prometheus:  {prom}{_infra_note(status, 'prometheus')}")
    if isinstance(cfg, dict):
        refused = f"; generation {cfg['refused_generation']} refused: {cfg['error']}" if cfg.get("error") else ""
        lines.append(f"config:      generation {cfg.get('generation')} ({', '.join(cfg.get('models') or [])}){refused}")
    return "\n".join(lines)


def crashloop_lines(status: dict) -> list[str]:
    """What is crash-looping and why, as text (``migscale status`` and ``migscale explain``)."""
    lines: list[str] = []
    for r in status.get("replicas", []):
        if r.get("state") == "crashloop" or (r.get("last_error") and r.get("state") != "ready"):
            wait = r.get("next_restart_in_s")
            when = f", next restart in {wait:.0f}s" if wait is not None else ""
            lines.append(f"{r['id']}: {r['state']} after {r.get('restarts', 0)} restart(s){when}; last error:")
            lines.extend(f"    {ln}" for ln in (r.get("last_error") or ["(no log output)"]))
    for m in status.get("crashloop_held", []):
        lines.append(f"{m}: every replica tried crash-loops; no new replicas until one has stayed ready 60s")
    return lines


def _infra_note(status: dict, name: str) -> str:
    st = (status.get("infrastructure") or {}).get(name)
    if not st:
        return ""
    if st.get("state") != "up":
        wait = st.get("next_restart_in_s")
        when = f", restart in {wait:.0f}s" if wait is not None else ""
        err = f": {st['last_error'][-1]}" if st.get("last_error") else ""
        return f"  [{st['state']}{when}{err}]"
    return f"  [restarted {st['restarts']}x]" if st.get("restarts") else ""


def jsonable(obj: Any) -> Any:
    """``obj`` as JSON-safe values: NaN and infinities as null (JSON has no spelling for them),
    tuples and sets as lists, enums as their values (``/v1/status``, ``migscale explain --json``)."""
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    value = getattr(obj, "value", None)  # enums
    if isinstance(value, (str, int)):
        return value
    return str(obj)
