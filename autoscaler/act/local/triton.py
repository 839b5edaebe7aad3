"""Start and stop one real ``tritonserver`` process (the act/ edge of the local backend).

The binary comes from the ``nvidia-pytriton`` wheel (docs/triton-local.md) unless the
user names one. Running it on a machine without a GPU needs three things the
wheel does not set up by itself: ``LD_LIBRARY_PATH`` with the wheel's
``nvidia_pytriton.libs``; a backends directory whose ``python/`` folder holds
the stub for *this* Python version (copied into the run directory, never edited
in site-packages); and the virtualenv's ``bin/`` first on ``PATH`` so the stub
finds numpy. The working directory is a fresh empty folder because the stub
puts its cwd first on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from autoscaler.act.local.pids import proc_alive, proc_children, proc_command
from autoscaler.act.local.procs import error_lines, kill_group, spawn, stop_child, tail_lines


class TritonError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host=host)[0]


def free_ports(n: int, exclude: Collection[int] = (), host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports the kernel calls free now, none of them in ``exclude``.

    Every socket stays bound until all are chosen, so no port is handed out twice
    (one freed and picked again at once is the kernel's habit). They are free when
    this returns, not reserved: a process that binds them later can still lose
    one to another process, which ``port_clash`` recognizes."""
    socks: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
            port = s.getsockname()[1]
            if port not in exclude:
                ports.append(port)
        return ports
    finally:
        for s in socks:
            s.close()


# Triton ("Socket '127.0.0.1:N' already in use"), gloo and Python ("Address already
# in use") all say it so.
_PORT_CLASH = "already in use"
# Fresh-port retries of one start that lost a port to another process.
PORT_RETRIES = 2


def port_clash(lines: Sequence[str]) -> bool:
    """Did a start fail because a port chosen for it was bound by someone else first?

    Ports are picked free and bound seconds later (tritonserver binds after its
    models load; a group's ranks open sockets meanwhile), so another process can
    take one in between. That failure is the choice's, not the model's: the
    caller retries with fresh ports instead of reporting a crash."""
    return any(_PORT_CLASH in ln.lower() for ln in lines)


def port_listening(port: int, timeout_s: float = 0.2, host: str = "127.0.0.1") -> bool:
    """Does something accept TCP connections on ``host:port`` now?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        return s.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls, exclude: Collection[int] = ()) -> TritonPorts:
        return cls(*free_ports(3, exclude))

    def __iter__(self) -> Iterator[int]:
        return iter((self.http, self.grpc, self.metrics))


def _pytriton_dir() -> Path:
    try:
        import pytriton
    except ImportError as e:  # pragma: no cover - depends on the platform
        raise TritonError(
            "nvidia-pytriton is not installed (it ships tritonserver for Linux x86_64); "
            "install it or set local.tritonserver in cluster.yaml"
        ) from e
    return Path(pytriton.__file__).parent / "tritonserver"


def find_tritonserver(explicit: str | os.PathLike | None = None) -> Path:
    """The tritonserver binary: the one named in config, else the wheel's."""
    if explicit:
        p = Path(explicit)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise TritonError(f"tritonserver {str(p)!r} is not an executable file")
        return p
    p = _pytriton_dir() / "bin" / "tritonserver"
    if not p.is_file():
        raise TritonError(f"tritonserver not found in the nvidia-pytriton wheel at {p}")
    return p


def _libs_dir() -> Path:
    import pytriton

    site = Path(pytriton.__file__).parent.parent
    return site / "nvidia_pytriton.libs"


def stub_dir() -> Path:
    """The wheel's Python-backend stub for the running Python version."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    d = _pytriton_dir() / "python_backend_stubs" / py
    if not d.is_dir():
        raise TritonError(f"the nvidia-pytriton wheel has no Python backend stub for Python {py}")
    return d


def prepare_backends(dest: Path) -> Path:
    """Copy the wheel's backends into ``dest`` with the stub for this Python; idempotent."""
    src = _pytriton_dir()
    stubs = stub_dir()
    target = dest / "python"
    marker = target / ".migscale-ready"
    if marker.exists():
        return dest
    target.mkdir(parents=True, exist_ok=True)
    for f in (src / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy2(f, target / f.name)
    for f in stubs.iterdir():
        if f.is_file():
            shutil.copy2(f, target / f.name)
    marker.write_text(stubs.name)
    return dest


def triton_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    libs = str(_libs_dir())
    env["LD_LIBRARY_PATH"] = libs + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + ":" + env.get("PATH", "/usr/bin:/bin")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


# Triton's Python backend keeps a 1 MiB shared-memory region per server in /dev/shm (RAM), named
# ``<shm-region-prefix-name><uuid>``, and removes it only at an orderly exit: a crashed or killed
# server leaves it. Each server gets a prefix that names its run directory and work directory,
# so what a dead one left can be found and removed, and nothing else is touched.
SHM_DIR = Path("/dev/shm")


def _tag(path: Path) -> str:
    return hashlib.sha1(str(path).encode()).hexdigest()[:10]


def run_dir_shm_prefix(run_dir: Path) -> str:
    """``migscale-<run dir tag>-``: what the regions of every server of ``run_dir`` begin with."""
    return f"migscale-{_tag(Path(run_dir).resolve())}-"


def shm_prefix(workdir: Path, run_dir: Path | None) -> str:
    """``migscale-<run dir tag>-<work dir tag>-``: the Python backend's region prefix for one server."""
    return (run_dir_shm_prefix(run_dir) if run_dir is not None else "migscale-") + f"{_tag(workdir)}-"


def remove_shm_regions(prefix: str) -> int:
    """Remove the shared-memory regions named ``prefix*`` (their servers are gone); how many."""
    n = 0
    for f in SHM_DIR.glob(prefix + "*") if SHM_DIR.is_dir() else ():
        try:
            f.unlink()
            n += 1
        except OSError:
            pass  # already gone, or not ours to remove
    return n


def remove_run_dir_shm(run_dir: Path) -> int:
    """Every region of the servers of ``run_dir`` (``migscale down``/``up`` once nothing of it runs)."""
    return remove_shm_regions(run_dir_shm_prefix(run_dir))


class TritonProcess:
    """One tritonserver serving ``models`` from ``model_repository`` on its own ports.

    ``model-control-mode=explicit`` with ``--load-model`` for each model, so a
    replica loads only what it serves even though the repository holds more.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        models: Sequence[str],
        workdir: str | os.PathLike,
        ports: TritonPorts | None = None,
        env: Mapping[str, str] | None = None,
        tritonserver: str | os.PathLike | None = None,
        extra_args: Sequence[str] = (),
        summaries: bool = True,
        run_dir: str | os.PathLike | None = None,
        backends_dir: str | os.PathLike | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.models = list(models)
        self.workdir = Path(workdir).resolve()
        # Ports we chose may be replaced by fresh ones when a start loses one (port_clash);
        # ports a caller gave are kept: the caller has published them.
        self.fixed_ports = ports is not None
        self.ports = ports or TritonPorts.free()
        self.extra_env = dict(env or {})
        self.binary = find_tritonserver(tritonserver)
        self.extra_args = list(extra_args)
        self.summaries = summaries
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else None
        self.shm_prefix = shm_prefix(self.workdir, self.run_dir)
        # the Python backend's stub processes serving when it turned ready, and the first of them
        # found dead (``alive``)
        self._stubs: tuple[int, ...] = ()
        self.dead_stub: int | None = None
        # one copy of the backends (~2.8 MB) shared by every replica, not one per start
        self.backends_dir = Path(backends_dir) if backends_dir is not None else self.workdir.parent / "backends"
        self.proc: subprocess.Popen | None = None
        self._log_start = 0
        self.started_at: float | None = None
        self.ready_at: float | None = None

    # ------------------------------------------------------------ addresses
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def url_http(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def url_grpc(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def url_metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    @property
    def log_path(self) -> Path:
        return self.workdir / "tritonserver.log"

    def command(self) -> list[str]:
        backends = prepare_backends(self.backends_dir)
        cmd = [
            str(self.binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            "--http-address=127.0.0.1",
            f"--http-port={self.ports.http}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.ports.grpc}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=false",
            "--log-verbose=0",
            # Triton's default exit timeout is 30 s; a drained replica has nothing in flight.
            "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.summaries:
            cmd.append("--metrics-config=summary_latencies=true")
        cmd += [f"--load-model={m}" for m in self.models]
        return cmd + self.extra_args

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self.ready_at = None
        self._stubs, self.dead_stub = (), None
        # The log is appended to across starts; what this start wrote begins here.
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        # Its own process group (procs.spawn): the Python stubs Triton forks join
        # it, so killing the group also ends stubs whose server was kill -9-ed;
        # Ctrl-C in the terminal reaches only the controller, which stops
        # replicas in order.
        self.proc = spawn(
            self.command(),
            log_path=self.log_path,
            env=triton_env(self.extra_env),
            cwd=self.workdir,
            run_dir=self.run_dir,
        )

    def alive(self) -> bool:
        """The server runs, and so does every Python stub it had when it turned ready
        (``note_stubs``). A server whose stub died stays up and healthy by its own endpoints,
        but answers 500 to every request of that model ("Stub process ... is not healthy"):
        it serves nothing, so it counts as dead and is restarted."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        for pid in self._stubs:
            if not proc_alive(pid):
                self.dead_stub = pid
                return False
        return True

    def note_stubs(self) -> None:
        """Remember the Python backend stubs serving now (called when the replica turns ready)."""
        if self.proc is not None and self.proc.poll() is None:
            self._stubs = tuple(p for p in proc_children(self.proc.pid)
                                if "triton_python_backend_stub" in proc_command(p))

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        """HTTP health says ready *and* the metrics port accepts connections.

        Triton opens its metrics port after HTTP may already answer ready; a
        replica counted ready before its /metrics listens reads as missing data
        to the loop (and refused a load test's first scrape on a busy machine).
        """
        if not self.alive():
            return False
        try:
            with urllib.request.urlopen(
                f"http://{self.url_http}/v2/health/ready", timeout=timeout_s
            ) as r:
                if r.status != 200:
                    return False
        except OSError:
            return False
        return port_listening(self.ports.metrics, timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Block until ready; returns seconds from the last start to ready. Raises TritonError.

        A server that exits because one of the ports we chose was taken first is
        started again on fresh ones, ``PORT_RETRIES`` times at most."""
        deadline = time.time() + timeout_s
        retries = 0
        while time.time() < deadline:
            if not self.alive():
                if retries < PORT_RETRIES and self.restart_on_port_clash():
                    retries += 1
                    continue
                raise TritonError(f"tritonserver exited with {self.proc.returncode if self.proc else '?'}; "
                                  f"last log lines:\n{self.tail_log()}")
            if self.is_ready(timeout_s=0.5):
                self.ready_at = time.time()
                return self.ready_at - (self.started_at or self.ready_at)
            time.sleep(0.05)
        raise TritonError(f"tritonserver not ready after {timeout_s:.0f}s; last log lines:\n{self.tail_log()}")

    def restart_on_port_clash(self) -> bool:
        """After an exit: start again on fresh ports if the exit was a port clash on ports we
        chose (True), else leave it exited (False)."""
        if self.fixed_ports or self.proc is None or not port_clash(self._lines_since_start()):
            return False
        self.reap()
        self.ports = TritonPorts.free(exclude=set(self.ports))
        self.start()
        return True

    def _lines_since_start(self, max_bytes: int = 65536) -> list[str]:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, self.log_path.stat().st_size - max_bytes))
                return f.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def tail_log(self, lines: int = 20) -> str:
        return "\n".join(tail_lines(self.log_path, lines))

    def error_lines(self, keep: int = 5) -> list[str]:
        """What its log says went wrong, for a crash-loop report."""
        return error_lines(tail_lines(self.log_path, 200), keep)

    def reap(self) -> None:
        """After the server died: end what it left in its group (its Python stubs) and in /dev/shm, at once."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            try:  # a server counted dead for a dead stub was still running: gone before any restart
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
            remove_shm_regions(self.shm_prefix)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; stops only the process group we started."""
        # The Python backend stubs are children of tritonserver in the group we
        # created; signalling the group by our own PID reaches them and nothing else.
        code = stop_child(self.proc, timeout_s)
        if self.proc is not None and self.proc.poll() is not None:
            remove_shm_regions(self.shm_prefix)  # an orderly exit removed its own; a killed one did not
        return code

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
