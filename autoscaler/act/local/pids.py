"""Which processes this controller started: ``run_dir/pids.json``, and finding them again (act/).

``migscale down`` (and ``up`` after a crashed controller) must stop exactly
our processes and never a stranger that reused a PID. Each record therefore
holds the PID, its kernel start time (``/proc/PID/stat`` field 22, clock
ticks since boot) and its command line; a PID is signalled only when the
start time and the program name still match. Each recorded PID is also the
id of the process group that child leads (act/local/procs.py), which is how
``sweep`` finds the Python stubs and nginx workers it forked, even after the
recorded process itself died.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

from autoscaler.act.local.procs import RUN_DIR_ENV


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


def proc_command(pid: int) -> str:
    """``pid``'s command line as one string ("" once it is gone)."""
    return " ".join(proc_cmdline(pid) or [])


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


OWNER_FILE = "owner.json"


@contextmanager
def owned_tempdir(prefix: str) -> Iterator[Path]:
    """A temporary folder recorded as this process's (``owner.json``), removed on exit. Before
    it is made, folders of the same prefix whose recorded owner is gone -- a run killed with
    ``kill -9`` never reaches its own cleanup -- are removed, so such kills cost no disk."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{prefix}*"):
        try:
            rec = ProcRecord(**json.loads((old / OWNER_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            continue  # not one of ours, or still being made
        if not rec.matches():
            shutil.rmtree(old, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        write_json_atomic(Path(tmp) / OWNER_FILE, asdict(ProcRecord.of(os.getpid(), "owner")))
        yield Path(tmp)


class PidRegistry:
    """Thread-safe record of our live children, rewritten atomically on each change."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / "pids.json"
        self._lock = threading.Lock()
        self._recs: dict[int, ProcRecord] = {}
        self.save_error: str | None = None  # the last write of pids.json failed (disk full)

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
        # A full disk must not stop a restart half-way: the record stays in memory
        # (the process is in a group we created and carries the run-dir mark, so
        # `down` finds it anyway) and the next change writes the file again.
        try:
            write_json_atomic(self.path, {"children": [asdict(r) for r in self._recs.values()]})
            self.save_error = None
        except OSError as e:
            self.save_error = f"{self.path}: {e.strerror or e}"


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


def proc_pgid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().decode(errors="replace").rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def proc_has_env(pid: int, entry: bytes) -> bool:
    """Does ``/proc/PID/environ`` hold ``entry`` (``b"NAME=value"``)? False when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def proc_children(pid: int) -> list[int]:
    """The direct children of ``pid``, from every one of its threads (a thread that forks is the parent)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def started_from(run_dir: str | os.PathLike, records: list[ProcRecord]) -> dict[int, int]:
    """Every live process started from ``run_dir``: PID -> the group to signal (0: the PID alone).

    Two ways to be ours (act/local/procs.py says why each holds): a member of a
    process group we created -- its id is a recorded PID, and a member started
    no earlier than that leader (a group id names no other group while any
    member lives) -- or a process whose environment carries
    ``MIGSCALE_RUN_DIR=<run_dir>``, which every child we start inherits (nginx
    rewrites its environment area for its process title, hence the groups).
    """
    marker = f"{RUN_DIR_ENV}={Path(run_dir).resolve()}".encode()
    groups = {r.pid: r.start_ticks for r in records}
    me = {os.getpid(), os.getppid(), 1}
    out: dict[int, int] = {}
    for pid in _all_pids():
        if pid in me or proc_is_zombie(pid):
            continue
        pgid = proc_pgid(pid)
        if pgid in groups:
            ticks, leader_ticks = proc_start_ticks(pid), groups[pgid]
            if ticks is not None and (leader_ticks is None or ticks >= leader_ticks):
                out[pid] = pgid
                continue
        if proc_has_env(pid, marker):
            out[pid] = 0
    return out


def sweep(run_dir: str | os.PathLike, records: list[ProcRecord] | None = None,
          term_timeout_s: float = 10.0) -> list[int]:
    """Stop every process started from ``run_dir`` (``started_from``): SIGTERM, then SIGKILL
    after ``term_timeout_s``. Returns the PIDs found. Safe with nothing to do."""
    recs = load_records(run_dir) if records is None else records
    found = list(started_from(run_dir, recs))
    if not found:
        return []
    _term_then_kill(found, os.kill, proc_alive, term_timeout_s)
    # A member forked while we were signalling (a stub mid-start) is caught by a second look.
    late = list(started_from(run_dir, recs))
    for pid in late:
        _signal(os.kill, pid, signal.SIGKILL)
    return sorted(set(found) | set(late))


def proc_alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    return proc_start_ticks(pid) is not None and not proc_is_zombie(pid)


def stop_recorded(records: list[ProcRecord], term_timeout_s: float = 10.0,
                  run_dir: str | os.PathLike | None = None) -> list[int]:
    """Stop what ``records`` started: every member of their process groups (and, given
    ``run_dir``, every process marked with it); returns the PIDs signalled."""
    if run_dir is not None:
        return sweep(run_dir, records, term_timeout_s)
    live = {r.pid: r for r in records if r.matches() or _group_has_members(r)}
    _term_then_kill(list(live), os.killpg, lambda pgid: _group_has_members(live[pgid]), term_timeout_s)
    return list(live)


def _signal(send: Callable[[int, int], None], target: int, sig: int) -> None:
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _term_then_kill(targets: list[int], send: Callable[[int, int], None], alive: Callable[[int], bool],
                    term_timeout_s: float) -> None:
    """SIGTERM every target (a PID or, with ``os.killpg``, a group), SIGKILL those still
    ``alive`` after ``term_timeout_s``."""
    for t in targets:
        _signal(send, t, signal.SIGTERM)
    deadline = time.monotonic() + term_timeout_s
    while time.monotonic() < deadline and any(alive(t) for t in targets):
        time.sleep(0.1)
    for t in targets:
        if alive(t):
            _signal(send, t, signal.SIGKILL)


def _group_has_members(r: ProcRecord) -> bool:
    """Any live, non-zombie process still in the group we created under ``r.pid``."""
    for pid in _all_pids():
        if proc_pgid(pid) == r.pid and not proc_is_zombie(pid):
            ticks = proc_start_ticks(pid)
            if ticks is not None and (r.start_ticks is None or ticks >= r.start_ticks):
                return True
    return False


def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


RUN_DIR_MARKER = ".migscale-run-dir"
# what a run directory made before the marker existed holds besides its lock
_RUN_DIR_PARTS = ("controller.log", "nginx", "prometheus", "replicas")


def mark_run_dir(run_dir: str | os.PathLike) -> None:
    """Say that ``run_dir`` is a run directory: ``up`` and ``down`` delete their records only in one."""
    marker = Path(run_dir) / RUN_DIR_MARKER
    if not marker.exists():
        marker.write_text("a migscale run directory (`migscale down` clears its records)\n")


def is_run_dir(run_dir: str | os.PathLike) -> bool:
    rd = Path(run_dir)
    if (rd / RUN_DIR_MARKER).is_file():
        return True
    return (rd / "controller.lock").is_file() and any((rd / p).exists() for p in _RUN_DIR_PARTS)


def owned_folder_problem(path: Path, flag: str, ours: Callable[[Path], bool], what: str) -> str | None:
    """Why a command that deletes in the folder ``path`` must not take it, or None: it takes
    only a missing or empty folder, or one of its own (``ours``), so a mistyped ``flag`` loses
    no file of the user's."""
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{flag}: {path} exists and is not a folder, got {str(path)!r}"
    if ours(path) or not any(path.iterdir()):
        return None
    return f"{flag}: {path} holds files and is not {what}; give a new or empty folder, got {str(path)!r}"


def run_dir_problem(run_dir: str | os.PathLike) -> str | None:
    """Why ``run_dir`` must not become a run directory, or None. ``up`` deletes the records a
    previous controller left (``status.json``, ``pids.json``, ``controller.json``), names common
    enough to be a user's own."""
    return owned_folder_problem(Path(run_dir), "--run-dir", is_run_dir,
                                f"a migscale run directory (no {RUN_DIR_MARKER})")


class RunDirLock:
    """One controller per run directory: an exclusive ``flock`` on ``run_dir/controller.lock``.

    ``flock`` is atomic (two ``migscale up`` a second apart: exactly one gets
    it) and the kernel drops it when the holder dies, however it dies, so a
    crashed controller never blocks the next. The descriptor is close-on-exec:
    children never hold the lock, so an orphan cannot keep a dead controller
    "running". ``held_by_other`` lets ``down`` and ``status`` ask without taking it.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / "controller.lock"
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds it."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def held_by_other(self) -> bool:
        """Is a live controller holding it now? (Takes and drops it when free.)"""
        if self._fd is not None:
            return False
        if not self.path.exists():
            return False
        if self.acquire():
            self.release()
            return False
        return True

    def holder(self) -> int | None:
        """The PID holding the lock, from ``/proc/locks`` (matched by the file's inode); None when free."""
        try:
            st = os.stat(self.path)
            with open("/proc/locks") as f:
                rows = f.read().splitlines()
        except OSError:
            return None
        ino = f":{st.st_ino}"
        for row in rows:
            cols = row.split()
            # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (a blocked waiter has "->" after the index)
            cols = [c for c in cols if c != "->"]
            if len(cols) >= 6 and cols[1] == "FLOCK" and cols[5].endswith(ino):
                dev = cols[5].rsplit(":", 1)[0]
                if dev == f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}" and cols[4].isdigit():
                    return int(cols[4])
        return None

    def wait_free(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.held_by_other():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def __enter__(self) -> Self:
        if not self.acquire():
            raise BlockingIOError(f"{self.path} is held by another controller")
        return self

    def __exit__(self, *exc) -> None:
        self.release()
