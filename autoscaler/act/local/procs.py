"""Starting and stopping the local backend's child processes so that none can leak (act/).

Place in the loop: every process the local backend runs -- tritonserver (and
the Python stubs it forks), multinode workers, nginx (and its workers),
Prometheus -- is started by ``spawn`` and stopped by ``stop_child`` or
``kill_group``. Three mechanisms, each enough for one way a process could
outlive what it belongs to:

* **One process group per replica or server.** ``spawn`` puts the child in a
  new process group (``setpgid``; its id is the child's PID) or in a given one
  (a multinode group's workers join their leader's). Everything the child
  forks -- Triton's Python stubs, nginx's workers -- inherits it, and a group
  id is never handed to a new process while any member lives (Linux keeps the
  PID number allocated while it names a group). So ``killpg(pgid)`` reaches
  exactly what that replica started, also after its leader died: the stubs of
  a ``kill -9``-ed tritonserver, the workers of a ``kill -9``-ed nginx master.
* **Tied to the controller's death.** The child is exec'd through
  ``setpriv --pdeathsig SIGTERM`` (util-linux; Essential on Debian), which sets
  ``PR_SET_PDEATHSIG`` and keeps it across the exec: when the controller dies,
  even by ``kill -9``, each direct child gets SIGTERM, and tritonserver, nginx
  and Prometheus then stop what they forked. The signal follows the death of
  the *thread* that forked, so every child is forked by one spawner thread that
  lives as long as the process (``_Spawner``), never by a drain or tick thread.
* **Marked.** Each child's environment carries ``MIGSCALE_RUN_DIR=<run dir>``
  (inherited by stubs and workers), and the group ids go to ``pids.json``:
  ``migscale down`` sweeps both (``pids.sweep``), whatever happened before.

Logs: children write to files opened in append mode, so ``rotate_log`` can
copy-and-truncate them in place (logrotate's ``copytruncate``) while they run.
The documented behaviour each mechanism rests on, with sources: docs/local-processes.md.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

RUN_DIR_ENV = "MIGSCALE_RUN_DIR"
# Each log is cut when it passes this size; one previous part (".1") is kept.
# 5 MB holds ~50,000 Triton log lines, hours of a healthy replica's output.
LOG_MAX_BYTES = 5 * 1024 * 1024
_SETPRIV = shutil.which("setpriv") or next(
    (p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None
)


def pdeathsig_available() -> bool:
    return _SETPRIV is not None


def tied_command(argv: Sequence[str]) -> list[str]:
    """``argv`` exec'd with SIGTERM as its parent-death signal (plain ``argv`` without setpriv)."""
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "SIGTERM", "--", *argv]


class _Spawner:
    """One daemon thread that forks every child (see the module doc: PR_SET_PDEATHSIG is per thread)."""

    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            fn, box, done = self._q.get()
            try:
                box.append(fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box.append(e)
            done.set()

    def call(self, fn):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="migscale-spawner", daemon=True)
                self._thread.start()
        box: list = []
        done = threading.Event()
        self._q.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_spawner = _Spawner()


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    run_dir: Path | None = None,
    process_group: int = 0,
) -> subprocess.Popen:
    """Start ``argv`` in process group ``process_group`` (0: a new one, id = its PID), stdout and
    stderr appended to ``log_path``, tied to our death, marked with ``run_dir``."""
    full_env = dict(os.environ if env is None else env)
    if run_dir is not None:
        full_env[RUN_DIR_ENV] = str(run_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def start() -> subprocess.Popen:
        with open(log_path, "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                tied_command(argv),
                cwd=cwd,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=process_group,
            )

    return _spawner.call(start)


def group_alive(pgid: int) -> bool:
    """Does any live process still belong to process group ``pgid``?

    Zombies do not count: a killed nginx worker orphaned to init stays a zombie
    until init reaps it (in a container that can be never), but it holds no
    socket and runs nothing. ``killpg(pgid, 0)`` would count it, so look in /proc.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def kill_group(pgid: int | None, sig: int = signal.SIGKILL) -> None:
    """Signal every process of group ``pgid`` (a group we created: its id is our child's PID)."""
    if pgid is None or pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group_gone(pgid: int | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pgid and group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_child(proc: subprocess.Popen | None, timeout_s: float = 10.0, *, sig: int = signal.SIGTERM,
               group: bool = True) -> int | None:
    """Send ``sig`` (to the whole group when ``group``), wait ``timeout_s``, then SIGKILL the group.

    The group is killed at the end in every case, also when the child had
    already exited: what it forked (Triton's stubs, nginx's workers) may still
    run. Returns the exit code, or None when there was no process. Safe to call twice.
    """
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait(timeout=5)
    # Give members a moment to follow their leader (nginx workers finish
    # in-flight requests after a SIGQUIT), then no more.
    if group_alive(proc.pid) and not wait_group_gone(proc.pid, min(timeout_s, 5.0)):
        kill_group(proc.pid)
        wait_group_gone(proc.pid, 2.0)
    return proc.returncode


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES) -> bool:
    """Copy-and-truncate ``path`` when over ``max_bytes``; keeps one ``.1`` part. True when cut.

    Writers hold the file with O_APPEND, so after the truncation their next
    write lands at the new end of file, not at their old offset.
    """
    try:
        if path.stat().st_size <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        with open(path, "r+b") as f:
            f.truncate(0)
        return True
    except OSError:
        return False


def tail_lines(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``lines`` lines of a (possibly large) log, reading at most ``max_bytes``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


_ERROR_WORDS = ("error", "exception", "traceback", "failed", "fatal", "killed", "cannot", "no module")


def error_lines(lines: Sequence[str], keep: int = 5, width: int = 300) -> list[str]:
    """The lines that say what went wrong: the last ``keep`` lines that look like an error
    (Triton's ``E...`` and ``error:`` lines, a traceback's exception line), each once; else
    the last ``keep`` non-empty lines. Table borders and rows of Triton's banners are skipped."""
    text = [ln.rstrip()[:width] for ln in lines if ln.strip() and not ln.lstrip().startswith(("|", "+"))]
    errs = [ln for ln in text if any(w in ln.lower() for w in _ERROR_WORDS)]
    picked = list(dict.fromkeys(reversed(errs)))[:keep][::-1] if errs else text[-keep:]
    return picked
