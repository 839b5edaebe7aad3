"""A real Prometheus for the local backend (act/), fed by file-based service discovery.

``migscale up`` starts ``prometheus`` as its own child with config and TSDB
under ``run_dir/prometheus``, listening on a free 127.0.0.1 port, scraping
every 2 s. Targets come from ``targets.json`` (file_sd), which the controller
rewrites atomically on every replica change; Prometheus notices the rename
through inotify (``refresh_interval`` is only the fallback).

Each target carries the labels ``replica``, ``model``, ``profile``, ``gpu``
and ``start``. Triton's own series already carry ``model``; the job uses
``honor_labels: true`` so that label stays ``model`` (the Triton name) instead
of being renamed ``exported_model``.

When the binary is missing, or ``local.prometheus: off``, nothing is started:
``PrometheusServer.mode`` is ``"direct"`` and the caller scrapes the replicas'
``/metrics`` itself (the embedded default) and says so at start-up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autoscaler.act.local.ports import check_bindable
from autoscaler.act.local.procs import error_lines, kill_group, spawn, stop_child, tail_lines, wait_group_gone
from autoscaler.act.local.triton import free_port

SCRAPE_INTERVAL_S = 2


@dataclass(frozen=True)
class ScrapeTarget:
    address: str  # "127.0.0.1:METRICS_PORT"
    replica: str
    model: str
    profile: str
    gpu: str
    start: int


def render_file_sd(targets: Sequence[ScrapeTarget]) -> list[dict]:
    """file_sd JSON: one group per target so each gets its own labels (pure)."""
    return [
        {
            "targets": [t.address],
            "labels": {
                "replica": t.replica,
                "model": t.model,
                "profile": t.profile,
                "gpu": t.gpu,
                "start": str(t.start),
            },
        }
        for t in sorted(targets, key=lambda t: t.replica)
    ]


def render_config(targets_file: Path, scrape_interval_s: int = SCRAPE_INTERVAL_S) -> str:
    """prometheus.yml (pure). YAML is a superset of JSON, so we emit JSON: no quoting surprises."""
    cfg = {
        "global": {
            "scrape_interval": f"{scrape_interval_s}s",
            "evaluation_interval": f"{scrape_interval_s}s",
            "scrape_timeout": f"{max(1, scrape_interval_s - 1)}s",
        },
        "scrape_configs": [
            {
                "job_name": "triton",
                "honor_labels": True,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            }
        ],
    }
    return json.dumps(cfg, indent=2) + "\n"


def find_prometheus(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if os.access(p, os.X_OK)), None
    )


class PrometheusServer:
    """Our own Prometheus child, or the explicit absence of one (``mode == "direct"``)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        setting: str = "auto",
        binary: str | None = None,
        port: int | None = None,
    ) -> None:
        self.dir = Path(run_dir).resolve() / "prometheus"
        self.binary = find_prometheus(binary) if setting != "off" else None
        if setting == "off":
            self.fallback_reason: str | None = "local.prometheus is off"
        elif self.binary is None:
            self.fallback_reason = "no prometheus binary on PATH"
        else:
            self.fallback_reason = None
        self.port = port or free_port()
        self.run_dir = Path(run_dir).resolve()
        self.proc: subprocess.Popen | None = None
        self.started = False  # start() succeeded and stop() has not run: it should be up
        self.starts = 0
        self.restarted_at: float | None = None  # wall time of the last start after the first
        self.warm_s = 0.0  # after a restart, hold the loop this long (set by the controller)
        self.lost_samples_at: float | None = None  # wall time of the last failed write to its disk
        self._last: list[dict] | None = None
        self.write_error: str | None = None
        # Drain workers and the tick both rewrite the targets: one writer at a time,
        # or two share the temp file and the second's rename finds it gone.
        self._write_lock = threading.Lock()

    @property
    def mode(self) -> str:
        """``prometheus``; ``prometheus-down`` while ours is dead (the loop holds: no
        scale-down on what it cannot see); ``direct`` without a binary (direct scrape)."""
        if not self.binary:
            return "direct"
        if self.started and not self.alive():
            return "prometheus-down"
        return "prometheus-warming" if self.warming_s() > 0 else "prometheus"

    def warming_s(self, now: float | None = None) -> float:
        """Seconds the loop must still hold after a restart or lost samples (0: its windows
        are whole again)."""
        since = max((t for t in (self.restarted_at, self.lost_samples_at) if t is not None), default=None)
        if since is None:
            return 0.0
        return max(0.0, since + self.warm_s - (time.time() if now is None else now))

    def storage_failed(self, now: float | None = None) -> None:
        """The run dir's disk refused a write (full): Prometheus, whose TSDB is on it, drops
        its scrapes too, so its windows have a gap. Measured: 30 s of a full disk halved
        resnet's rate read 8 s after freeing (90 of 170 req/s) and the loop scaled it down.
        Hold as after a restart, until a whole window was scraped since the last failure."""
        self.lost_samples_at = time.time() if now is None else now

    def why_warming(self) -> str:
        if self.lost_samples_at is not None and (self.restarted_at is None
                                                 or self.lost_samples_at > self.restarted_at):
            return "its disk was full (scrapes dropped)"
        return "it restarted"

    @property
    def program(self) -> str:
        return os.path.basename(self.binary or "prometheus")

    @property
    def url(self) -> str | None:
        return f"http://127.0.0.1:{self.port}" if self.binary else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def targets_file(self) -> Path:
        return self.dir / "targets.json"

    def banner(self) -> str:
        if self.binary:
            every = f"scrape every {SCRAPE_INTERVAL_S}s"
            return f"metrics: Prometheus {self.url} ({every}, file_sd {self.targets_file})"
        return (
            f"metrics: Prometheus not started ({self.fallback_reason}); "
            "using the direct-scrape fallback of each replica's /metrics"
        )

    def write_targets(self, targets: Sequence[ScrapeTarget]) -> bool:
        """Atomically rewrite the file_sd file; False when nothing changed."""
        doc = render_file_sd(targets)
        with self._write_lock:
            if doc == self._last and self.targets_file.exists():
                return False
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                tmp = self.targets_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(doc, indent=1) + "\n")
                os.replace(tmp, self.targets_file)
            except OSError as e:
                # Disk full: Prometheus keeps scraping the last targets; the
                # supervisor's periodic re-sync writes them once there is room.
                self._last = None
                self.write_error = f"{self.targets_file}: {e.strerror or e}"
                return False
            self._last = doc
            self.write_error = None
            return True

    def start(self, timeout_s: float = 30.0) -> None:
        if not self.binary:
            return
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        if not self.targets_file.exists():
            self.write_targets([])
        conf = self.dir / "prometheus.yml"
        conf.write_text(render_config(self.targets_file))
        check_bindable(self.port, "prometheus")
        self.proc = spawn(
            [
                self.binary,
                f"--config.file={conf}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            log_path=self.dir / "prometheus.log",
            cwd=self.dir,
            run_dir=self.run_dir,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                kill_group(self.proc.pid)
                raise RuntimeError(
                    f"prometheus exited with {self.proc.returncode}; see {self.dir / 'prometheus.log'}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        self.started = True
                        self.starts += 1
                        if self.starts > 1:
                            self.restarted_at = time.time()
                        return
            except OSError:
                pass
            time.sleep(0.1)
        stop_child(self.proc, 2.0)
        raise RuntimeError(f"prometheus not ready within {timeout_s:.0f}s; see {self.dir / 'prometheus.log'}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def error_lines(self) -> list[str]:
        return error_lines(tail_lines(self.dir / "prometheus.log", 50))

    def reap(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid)
            wait_group_gone(self.proc.pid, 2.0)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.started = False
        stop_child(self.proc, timeout_s, group=False)


class PrometheusWarming(ConnectionError):
    """A restarted Prometheus has not yet scraped for a whole window: the tick is blind."""


class HoldWhileWarming:
    """A MetricsSource that answers only once ``server`` has been back (or storing its scrapes
    again) for ``server.warm_s``.

    Until then ``read`` raises, so the loop's tick is blind (``source_ok=False``)
    and every model holds, with the reason in the decision's notes.
    """

    def __init__(self, inner, server: PrometheusServer) -> None:
        self.inner = inner
        self.server = server

    @property
    def last_notes(self) -> tuple[str, ...]:
        return tuple(getattr(self.inner, "last_notes", ()) or ())

    def read(self, models, replicas, now):
        left = self.server.warming_s()
        if left > 0:
            raise PrometheusWarming(
                f"Prometheus: {self.server.why_warming()} {self.server.warm_s - left:.0f}s ago; holding "
                f"{left:.0f}s more, until it has scraped a whole {self.server.warm_s:.0f}s window"
            )
        return self.inner.read(models, replicas, now)
