"""``migscale demo``: the main job end to end, on the local embedded default.

It runs the real stack (``autoscaler/runtime/local.py``: tritonserver replicas on
emulated A100 slices, nginx, Prometheus, the control loop and the metrics
API), drives it with the locust suite from ``loadtests/`` replaying a trace in
which one model outgrows its slices and then falls back, shows a live rich
view, writes a report (``autoscaler/runtime/demo_report.py``) and stops everything it
started. The exit code is the SLO verdict outside the reaction windows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from autoscaler.act.local.pids import owned_folder_problem
from autoscaler.act.local.procs import spawn
from autoscaler.config import ClusterConfig, ModelsConfig
from autoscaler.loop import TickResult
from autoscaler.policy.types import ActionKind
from autoscaler.runtime.demo_report import (
    Sample,
    first_ready_after_rise,
    locust_p99_history,
    plot_timeline,
    reaction_windows,
    slices_in_use,
    summarize,
    summary_markdown,
    write_samples,
)
from autoscaler.runtime.loadtest import build_command
from autoscaler.runtime.local import LocalController
from autoscaler.runtime.local_setup import cluster_from_config


@dataclass(frozen=True)
class DemoScript:
    """The load: per-model req/s over time (a ``t_s,model,rps`` trace, 5 s rows).

    ``hot`` grows from ``base`` to ``peak`` (beyond what its starting slices
    serve), holds, then falls back; the other models stay at a steady rate.
    """

    hot: str
    base_rps: float
    peak_rps: float
    steady: dict[str, float]
    rise_at_s: float = 20.0
    fall_at_s: float = 95.0
    duration_s: float = 190.0
    step_s: float = 5.0

    def rates(self, t_s: float) -> dict[str, float]:
        hot = self.peak_rps if self.rise_at_s <= t_s < self.fall_at_s else self.base_rps
        return {self.hot: hot, **self.steady}

    def rows(self) -> list[tuple[float, str, float]]:
        out = []
        t = 0.0
        while t < self.duration_s:
            for m, r in self.rates(t).items():
                out.append((t, m, r))
            t += self.step_s
        return out

    def write_csv(self, path: Path) -> Path:
        path.write_text("t_s,model,rps\n" + "".join(f"{t:g},{m},{r:g}\n" for t, m, r in self.rows()))
        return path


def default_script(models_cfg: ModelsConfig, status: dict) -> DemoScript:
    """The first MIG model is the hot one, sized against what it runs at the start.

    Its base is 35% of the capacity of its starting replicas and its peak 1.5x
    (resnet on a 1g.10gb + a 3g.40gb = 58 + 160 = 218 req/s: 76 -> 327 req/s),
    so it must outgrow its slices -- more replicas, carved out of a
    repartitioned GPU or on bigger profiles -- and then fall back far enough
    for a scale-down. The other models run steady at 30% of their capacity.
    """
    running: dict[str, float] = {}
    caps = {m.name: dict(m.capacity or {}) for m in models_cfg.models}
    for r in status.get("replicas", []):
        running[r["model"]] = running.get(r["model"], 0.0) + caps.get(r["model"], {}).get(r["profile"], 0.0)
    mig = [m.name for m in models_cfg.models if m.backend == "mig" and running.get(m.name)]
    hot = mig[0]
    steady = {m: round(0.3 * running[m], 1) for m in mig[1:]}
    for m in models_cfg.models:  # a multinode group serves a trickle, to show it answering
        if m.backend == "multinode" and any(r["model"] == m.name for r in status.get("replicas", [])):
            cap = m.multinode.group_capacity_rps if m.multinode and m.multinode.group_capacity_rps else 2.0
            steady[m.name] = round(max(0.5, 0.3 * cap), 1)
    return DemoScript(hot=hot, base_rps=round(0.35 * running[hot], 1), peak_rps=round(1.5 * running[hot], 1),
                      steady=steady)


class Recorder:
    """Samples the live stack once a second into ``Sample`` rows and keeps a scale-event log."""

    def __init__(self, ctl: LocalController, script: DemoScript) -> None:
        self.ctl = ctl
        self.script = script
        self.samples: list[Sample] = []
        self.events: list[str] = []
        self.decisions = 0
        self.last_reasons: dict[str, str] = {}
        self.t0: float | None = None
        self.status: dict = {}

    def on_result(self, result: TickResult) -> None:
        self.decisions += 1
        for m, rs in result.reasons.items():
            self.last_reasons[m] = ", ".join(r.value for r in rs)
        t = time.time() - self.t0 if self.t0 else 0.0
        for a in result.actions:
            if a.kind is ActionKind.REPARTITION:
                layout = ",".join(str(p) for p in a.layout or ()) or "MIG off (whole GPU)"
                self.events.append(f"t={t:5.0f}s {a.kind.value:<11} {a.gpu} -> {layout} ({a.reason.value})")
            elif a.kind in (ActionKind.CREATE, ActionKind.DELETE):
                what = f"{a.model or ''} {a.profile or ''} on {a.gpu}@{a.start}".strip()
                self.events.append(f"t={t:5.0f}s {a.kind.value:<11} {what} ({a.reason.value})")

    def sample(self) -> Sample:
        st = self.ctl.cluster.status()
        self.status = st
        t = time.time() - self.t0 if self.t0 else 0.0
        obs = self.ctl.loop.last_observation if self.ctl.loop else None
        served: dict[str, float | None] = {}
        p99: dict[str, float | None] = {}
        for m in self.ctl.slo_p99_ms:
            sig = obs.models.get(m) if obs else None
            served[m] = sig.request_rate if sig else None
            p99[m] = sig.p99_ms if sig else None
        replicas: dict[str, dict[str, int]] = {}
        for r in st.get("replicas", []):
            if r["state"] == "ready":
                by = replicas.setdefault(r["model"], {})
                by[r["profile"]] = by.get(r["profile"], 0) + 1
        gpus, slices = slices_in_use(st)
        s = Sample(t, self.script.rates(t) if t >= 0 else {}, served, p99, replicas, gpus, slices)
        self.samples.append(s)
        return s


def _view(rec: Recorder, progress: Progress, slo: dict[str, float]) -> Group:
    s = rec.samples[-1] if rec.samples else Sample(0.0)
    models = Table(title="models", expand=True)
    for col in ("model", "offered req/s", "served req/s", "p99 ms / SLO", "replicas by profile", "last decision"):
        models.add_column(col)
    for m in sorted(slo):
        p = s.p99_ms.get(m)
        color = "green" if p is not None and p <= 0.8 * slo[m] else "yellow" if p is not None and p <= slo[m] else "red"
        p_txt = f"[{color}]{p:.0f}[/] / {slo[m]:.0f}" if p is not None else f"- / {slo[m]:.0f}"
        served = s.served_rps.get(m)
        reps = " ".join(f"{prof}x{n}" for prof, n in sorted(s.replicas.get(m, {}).items())) or "-"
        models.add_row(m, f"{s.offered_rps.get(m, 0):.0f}", f"{served:.0f}" if served is not None else "-",
                       p_txt, reps, rec.last_reasons.get(m, "")[:40])
    gpus = Table(title="GPUs (MIG layout: profile@start -> replica)", expand=True)
    gpus.add_column("gpu")
    gpus.add_column("layout")
    by_slot = {(r["gpu"], r["start"]): r for r in rec.status.get("replicas", [])}
    for g in rec.status.get("gpus", []):
        cells = []
        for pl in g.get("layout", []):
            prof, _, start = pl.rpartition("@")
            r = by_slot.get((g["id"], int(start)))
            cells.append(f"[{prof}@{start} {r['model']}:{r['state']}]" if r else f"[{prof}@{start} free]")
        if not cells:  # MIG off: a whole GPU, possibly held by a multinode group
            holders = [r for r in rec.status.get("replicas", []) if g["id"] in (r.get("gpus") or [r["gpu"]])]
            cells = [f"[whole GPU {r['model']}:{r['state']}]" for r in holders] or ["(whole GPU, free)"]
        gpus.add_row(g["id"], " ".join(cells))
    events = "\n".join(rec.events[-6:]) or "(no scale events yet)"
    return Group(models, gpus, Panel(events, title="recent actions"), progress)


def _port_or_free(port: int) -> int:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


REPORT_MARKER = ".migscale-demo-report"
# what a report written before the marker existed holds (these names are the demo's own)
_REPORT_FILES = ("demo-trace.csv", "locust-command.txt")


def _is_report(results: Path) -> bool:
    return (results / REPORT_MARKER).is_file() or all((results / f).is_file() for f in _REPORT_FILES)


def results_problem(results: Path) -> str | None:
    """Why ``results`` must not be replaced, or None. The demo deletes the folder it writes
    to, so it replaces only a folder that is missing, empty or one of its own reports: a
    mistyped ``--results .`` must not take a working tree with it."""
    return owned_folder_problem(results, "--results", _is_report,
                                "a `migscale demo` report, which the demo would replace")


def run_demo(models_path: Path, models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, results: Path, *,
             live: bool = True,
             script: DemoScript | None = None, reaction_s: float = 25.0, console: Console | None = None) -> int:
    from autoscaler.runtime.local import run_controller

    console = console or Console()
    results = results.resolve()
    problem = results_problem(results)
    if problem:
        raise ValueError(problem)
    if results.exists():
        shutil.rmtree(results)
    (results / "locust").mkdir(parents=True)
    (results / REPORT_MARKER).write_text("a `migscale demo` report; the next demo into this folder replaces it\n")
    run_dir = results / "run"
    local = cluster_cfg.local
    # The configured ports when free, else any free one: a demo must not fail on a busy 8000.
    cluster = cluster_from_config(models_cfg, cluster_cfg, run_dir=run_dir,
                                  frontdoor_port=_port_or_free(local.frontdoor_port),
                                  api_port=_port_or_free(local.api_port))
    ctl = LocalController(cluster, models_cfg, cluster_cfg)
    stop = threading.Event()
    say_lines: list[str] = []
    controller_thread = threading.Thread(
        target=run_controller, args=(cluster, models_cfg, cluster_cfg, stop, ctl),
        kwargs={"say": say_lines.append}, name="migscale-controller", daemon=True,
    )
    locust: subprocess.Popen | None = None
    rec: Recorder | None = None
    try:
        console.print("[bold]migscale demo[/]: starting the local cluster (real tritonserver replicas on "
                      "emulated A100 MIG slices, nginx, Prometheus, metrics API)...")
        ctl.start_api()
        controller_thread.start()
        deadline = time.time() + 120
        while time.time() < deadline:
            st = cluster.status()
            reps = st.get("replicas", [])
            if reps and all(r["state"] == "ready" for r in reps) and cluster.started:
                break
            if not controller_thread.is_alive():
                raise RuntimeError("the controller stopped while starting:\n" + "\n".join(say_lines[-10:]))
            time.sleep(0.5)
        else:
            raise RuntimeError("replicas not ready after 120 s:\n" + "\n".join(say_lines[-10:]))
        script = script or default_script(models_cfg, cluster.status())
        trace = script.write_csv(results / "demo-trace.csv")
        console.print(f"front door:  {cluster.frontdoor_url}")
        console.print(f"metrics API: {cluster.metrics_api_url}   live view: {cluster.metrics_api_url}/ui")
        console.print(f"prometheus:  {cluster.prometheus_url or 'not installed: direct scrape of each replica'}")
        console.print(f"load: {script.hot} {script.base_rps:g} -> {script.peak_rps:g} req/s at "
                      f"t={script.rise_at_s:g}s, back at t={script.fall_at_s:g}s; steady {script.steady}")
        rates = [(t, script.rates(t)) for t in [x * script.step_s for x in range(int(script.duration_s / script.step_s))]]
        windows = reaction_windows(rates, reaction_s)
        # The first seconds (replicas warming their caches) count as a reaction window too.
        windows = [(0.0, 10.0)] + windows
        ignore = ",".join(f"{a:g}-{b:g}" for a, b in windows)
        cmd = build_command(
            models_yaml=str(Path(models_path).resolve()),
            host=cluster.frontdoor_url, results=results / "locust", duration_s=script.duration_s,
            shape="trace", shape_args=f"path={trace}", base_rps=1.0, peak_rps=None, protocol="http",
            models=",".join(f"{m}:1" for m in [script.hot, *script.steady]), users_max=200, user_rps=10.0,
            slo="", slo_models=",".join([script.hot, *script.steady]), warmup_s=0.0, slo_ignore=ignore,
        )
        cmd += ["--csv-full-history"]
        (results / "locust-command.txt").write_text(" ".join(cmd) + "\n")
        rec = Recorder(ctl, script)
        ctl.on_result = rec.on_result
        # Started as every child of the local cluster is (act/local/procs.py): its own process
        # group, SIGTERM when this process dies however it dies, marked with the run dir for
        # `migscale down`; a demo killed mid-run leaves no load generator behind.
        locust = spawn(cmd, log_path=results / "locust" / "locust.log", run_dir=run_dir)
        rec.t0 = time.time()
        progress = Progress(TextColumn("load"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                            TimeRemainingColumn())
        task = progress.add_task("load", total=script.duration_s)
        rec.sample()
        with Live(_view(rec, progress, ctl.slo_p99_ms), console=console, refresh_per_second=2,
                  transient=False, auto_refresh=False) as lv:
            while locust.poll() is None:
                rec.sample()
                progress.update(task, completed=min(script.duration_s, time.time() - rec.t0))
                if live:
                    lv.update(_view(rec, progress, ctl.slo_p99_ms), refresh=True)
                time.sleep(1.0)
        locust_rc = locust.returncode
        return _report(results, rec, ctl, windows, locust_rc, console)
    finally:
        if locust is not None and locust.poll() is None:
            locust.terminate()
            try:
                locust.wait(15)
            except subprocess.TimeoutExpired:
                locust.kill()
        stop.set()
        controller_thread.join(60)
        ctl.stop()
        console.print("stopped everything the demo started")


def _report(results: Path, rec: Recorder, ctl: LocalController, windows, locust_rc: int, console: Console) -> int:
    verdict_path = results / "locust" / "slo.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else None
    shutil.copy(ctl.cluster.run_dir / "decisions.jsonl", results / "decisions.jsonl") \
        if (ctl.cluster.run_dir / "decisions.jsonl").exists() else None
    write_samples(rec.samples, results / "timeline.jsonl")
    client_p99 = locust_p99_history(results / "locust" / "locust_stats_history.csv")
    png = plot_timeline(rec.samples, ctl.slo_p99_ms, windows, results / "timeline.png", client_p99)
    summary = summarize(rec.samples, verdict, windows, rec.decisions, rec.events)
    summary["hot_model"] = rec.script.hot
    summary["rise_at_s"] = rec.script.rise_at_s
    summary["first_new_replica_ready_after_rise_s"] = first_ready_after_rise(rec.samples, rec.script.hot,
                                                                             rec.script.rise_at_s)
    summary["locust_exit_code"] = locust_rc
    summary["actions"] = dict(Counter(e.split()[1] for e in rec.events))
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = summary_markdown(summary)
    (results / "summary.md").write_text(md)
    console.print(Panel(md, title=f"report: {results}"))
    console.print(f"timeline: {png}\nlocust report: {results / 'locust' / 'report.html'}\n"
                  f"decision log: {results / 'decisions.jsonl'} (migscale explain --log {results / 'decisions.jsonl'})")
    ok = summary["slo_met_outside_reaction_windows"] and locust_rc == 0
    return 0 if ok else 1
