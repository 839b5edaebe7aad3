"""A fast fake process launcher for ``LocalCluster`` (injected, never patched in).

The local backend's apply path and supervisor run unchanged on these: a fake
replica process becomes ready ``ready_after_s`` after it starts, exits at once
when its model (or id) is in ``failing``, never becomes ready when it is in
``hanging``, and stops when asked. It opens no port and starts no process, so
a contract test on the local backend costs milliseconds instead of a
``tritonserver`` start (~1.5 s). ``pid`` is None: nothing goes to pids.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class _Ports:
    http: int = 1
    grpc: int = 2
    metrics: int = 9  # the discard port: a scrape is refused at once, so drains end quickly


@dataclass
class FakeProcess:
    replica_id: str
    ready_after_s: float
    fails: bool = False
    hangs: bool = False
    started_at: float = field(default_factory=time.monotonic)
    stopped: bool = False
    ready_at: float | None = None
    ports: _Ports = field(default_factory=_Ports)
    binary: Path = Path("fake-tritonserver")
    proc: None = None
    pid: None = None
    dead_stub: None = None  # a fake has no Python stubs to die

    def note_stubs(self) -> None:
        """No stubs to remember (a real server's are, when it turns ready)."""

    @property
    def url_http(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def url_metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def alive(self) -> bool:
        return not self.stopped and not self.fails

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        return self.alive() and not self.hangs and time.monotonic() >= self.started_at + self.ready_after_s

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopped = True

    def start(self) -> None:
        self.stopped, self.started_at = False, time.monotonic()

    def tail_log(self, lines: int = 20) -> str:
        return "fake process: exited at start" if self.fails else "fake process"

    def error_lines(self, keep: int = 5) -> list[str]:
        return ["fake process: exited at start"] if self.fails else []

    def reap(self) -> None:
        """Nothing outlives a fake process (a real one's stubs are killed here)."""

    @property
    def log_path(self) -> Path:
        return Path(f"/nonexistent/fake-{self.replica_id}.log")  # rotate_log skips a missing file


class FakeLauncher:
    """``ReplicaLauncher`` of fake processes; records every start in ``started``."""

    def __init__(self, ready_after_s: float = 0.05) -> None:
        self.ready_after_s = ready_after_s
        self.failing: set[str] = set()  # replica ids or model names whose process exits at start
        self.hanging: set[str] = set()  # ... whose process never becomes ready
        self.started: list[str] = []

    def replica(self, rt, replica_id, run_dir, env, tritonserver) -> FakeProcess:
        self.started.append(replica_id)
        keys = {replica_id, rt.name}
        return FakeProcess(replica_id, self.ready_after_s, fails=bool(keys & self.failing),
                           hangs=bool(keys & self.hanging))

    def group(self, rt, group_id, run_dir, member_env, tritonserver):
        raise NotImplementedError("the contract suite runs MIG replicas only")
