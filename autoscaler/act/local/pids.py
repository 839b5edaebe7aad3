"""Which processes this controller started: ``run_dir/pids.json`` and ``controller.json``.

``migscale down`` (and ``up`` after a crashed controller) must stop exactly
our processes and never a stranger that reused a PID. Each record therefore
holds the PID, its kernel start time (``/proc/PID/stat`` field 22, clock
ticks since boot) and its command line; a PID is signalled only when the
start time and the program name still match.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def proc_start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def proc_is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class ProcRecord:
    pid: int
    kind: str  # "tritonserver" | "nginx" | "prometheus" | "controller" | ...
    start_ticks: int | None
    cmdline: list[str]
    name: str = ""  # replica id for tritonserver
    program: str = ""  # basename of the binary we launched, known before it runs

    @classmethod
    def of(cls, pid: int, kind: str, name: str = "", program: str = "") -> ProcRecord:
        cmd = proc_cmdline(pid) or []
        prog = program or (os.path.basename(cmd[0]) if cmd else kind)
        return cls(pid, kind, proc_start_ticks(pid), cmd, name, prog)

    def matches(self) -> bool:
        """Still the very process we started (same PID, start time and program), not a zombie."""
        if proc_is_zombie(self.pid):
            return False
        if self.start_ticks is not None and proc_start_ticks(self.pid) != self.start_ticks:
            return False
        cmd = proc_cmdline(self.pid)
        if cmd is None:
            return False
        # nginx rewrites its own title ("nginx: master process /usr/sbin/nginx -p ..."),
        # so compare the program's name, not the exact argv; the start time above
        # is what rules out a reused PID.
        prog = self.program or (os.path.basename(self.cmdline[0]) if self.cmdline else self.kind)
        return prog in " ".join(cmd)


class PidRegistry:
    """Thread-safe record of our live children, rewritten atomically on each change."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / "pids.json"
        self._lock = threading.Lock()
        self._recs: dict[int, ProcRecord] = {}

    def add(self, pid: int | None, kind: str, name: str = "", program: str = "") -> None:
        if pid is None:
            return
        with self._lock:
            self._recs[pid] = ProcRecord.of(pid, kind, name, program or kind)
            self._save()

    def remove(self, pid: int | None) -> None:
        if pid is None:
            return
        with self._lock:
            if self._recs.pop(pid, None) is not None:
                self._save()

    def records(self) -> list[ProcRecord]:
        with self._lock:
            return list(self._recs.values())

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"children": [asdict(r) for r in self._recs.values()]}, indent=1))
        os.replace(tmp, self.path)


def load_records(run_dir: str | os.PathLike) -> list[ProcRecord]:
    try:
        data = json.loads((Path(run_dir) / "pids.json").read_text())
        return [ProcRecord(**r) for r in data.get("children", [])]
    except (OSError, ValueError, TypeError):
        return []


def _same_process(r: ProcRecord) -> bool:
    """The PID still names the process we recorded (same kernel start time), zombie or not."""
    t = proc_start_ticks(r.pid)
    return t is not None and (r.start_ticks is None or t == r.start_ticks)


def stop_recorded(records: list[ProcRecord], term_timeout_s: float = 10.0) -> list[int]:
    """SIGTERM every still-matching record (its process group: tritonserver's stubs too),
    SIGKILL after ``term_timeout_s``; returns the PIDs that were signalled."""
    live = [r for r in records if r.matches()]
    for r in live:
        try:
            # Our children run in their own session (start_new_session), so the
            # group id is the PID we recorded -- it holds only what that child spawned.
            os.killpg(r.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + term_timeout_s
    # While exiting, a process may already show an empty cmdline; the start time
    # alone still identifies it, so wait (and kill) on that.
    while time.monotonic() < deadline and any(_same_process(r) and not proc_is_zombie(r.pid) for r in live):
        time.sleep(0.1)
    for r in live:
        if _same_process(r):
            try:
                os.killpg(r.pid, signal.SIGKILL)  # also reaches stubs left behind by a zombie leader
            except (ProcessLookupError, PermissionError):
                pass
    return [r.pid for r in live]


def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
