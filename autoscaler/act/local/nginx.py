"""The nginx front door of the local backend (act/): one HTTP port, one upstream per model.

The controller owns one nginx master started as its child (``daemon off``),
with its config, prefix, logs and temp files under ``run_dir/nginx``. On every
replica change it re-renders the config from the READY replicas, checks it
with ``nginx -t`` and sends SIGHUP to the master PID it started: nginx starts
new workers on the new config while the old workers finish the requests they
hold and then exit. That graceful reload is what makes scale-down lossless:
once the old workers are gone, no request can reach a removed replica.

Routing: ``/v2/models/<name>`` and ``/v2/models/<name>/...`` go to that
model's upstream with ``least_conn``; a model with no ready replica answers
503 with a JSON body. ``/v2/health/live`` is answered by nginx itself,
``/v2/health/ready`` is 200 only when every model has a ready replica, and
``/v2`` (server metadata) goes to any ready replica.

Faults: the master runs in its own process group (act/local/procs.py), which its
workers inherit, so when the master dies -- even by ``kill -9`` -- ``reap`` ends
the workers it orphaned (they would otherwise keep serving the port with the
old configuration); the supervisor then restarts nginx under back-off.
``start`` refuses a port it cannot bind, naming the holder, and returns only
once the listening socket belongs to *this* master's group.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.act.local.ports import check_bindable, port_holder
from autoscaler.act.local.procs import error_lines, kill_group, spawn, stop_child, tail_lines, wait_group_gone
from autoscaler.act.local.triton import port_listening

NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx", "/usr/local/bin/nginx")
# Old workers get this long to finish in-flight requests after a reload; the
# slowest emulated batch is ~100 ms (resnet 1g, batch 8), so 30 s is generous.
WORKER_SHUTDOWN_TIMEOUT_S = 30


class NginxError(RuntimeError):
    pass


def find_nginx(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)


@dataclass(frozen=True)
class Route:
    """One model behind the door: its public name, Triton's name for it, and ready backends."""

    model: str
    backends: tuple[str, ...] = ()  # "127.0.0.1:PORT" of READY replicas
    triton_name: str | None = None  # when the Triton model dir is named differently

    @property
    def upstream(self) -> str:
        # nginx upstream names allow [A-Za-z0-9_]; model names are DNS labels ("bert-large").
        return "m_" + re.sub(r"[^A-Za-z0-9_]", "_", self.model)


@dataclass(frozen=True)
class DoorConfig:
    port: int
    prefix: Path
    routes: tuple[Route, ...] = field(default_factory=tuple)
    worker_processes: int = 1


def _json_literal(obj: dict) -> str:
    # nginx ``return`` text is a single-quoted string; JSON from json.dumps has no single quotes.
    text = json.dumps(obj, separators=(",", ":"))
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render_config(cfg: DoorConfig) -> str:
    """The whole nginx.conf for the front door (pure; unit-tested)."""
    p = cfg.prefix
    lines: list[str] = []
    add = lines.append
    if os.geteuid() == 0:
        # A root master would switch workers to "nobody", who cannot enter a
        # 0700 run dir (pytest's tmp dirs are); keep workers as the caller.
        add(f"user {pwd.getpwuid(os.geteuid()).pw_name};")
    add(f"worker_processes {cfg.worker_processes};")
    add("daemon off;")
    add("master_process on;")
    add(f"pid {p / 'nginx.pid'};")
    add(f"error_log {p / 'logs' / 'error.log'} warn;")
    add(f"worker_shutdown_timeout {WORKER_SHUTDOWN_TIMEOUT_S}s;")
    add("events { worker_connections 4096; }")
    add("http {")
    add(f"  access_log {p / 'logs' / 'access.log'};")
    for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        add(f"  {t}_temp_path {p / 'temp' / t};")
    # Inference bodies (a resnet image as JSON is ~40 KB) stay in memory.
    add("  client_body_buffer_size 4m;")
    add("  client_max_body_size 64m;")
    add("  keepalive_requests 100000;")
    add("  default_type application/json;")
    for r in cfg.routes:
        if not r.backends:
            continue  # an upstream block needs >= 1 server; the location answers 503 instead
        add(f"  upstream {r.upstream} {{")
        add("    least_conn;")
        for b in r.backends:
            add(f"    server {b} max_fails=0;")
        add("    keepalive 32;")
        add("  }")
    all_backends = sorted({b for r in cfg.routes for b in r.backends})
    if all_backends:
        add("  upstream m__any {")
        add("    least_conn;")
        for b in all_backends:
            add(f"    server {b} max_fails=0;")
        add("    keepalive 8;")
        add("  }")
    add("  server {")
    add(f"    listen 127.0.0.1:{cfg.port};")
    add("    proxy_http_version 1.1;")
    add('    proxy_set_header Connection "";')
    # A replica that died between two reloads refuses the connection; inference
    # is idempotent, so the request is retried on another ready replica.
    add("    proxy_next_upstream error timeout http_502 non_idempotent;")
    add("    proxy_next_upstream_tries 3;")
    add("    proxy_connect_timeout 2s;")
    add("    proxy_read_timeout 300s;")
    add("    location = /v2/health/live { return 200 ''; }")
    not_ready = [r.model for r in cfg.routes if not r.backends]
    if cfg.routes and not not_ready:
        add("    location = /v2/health/ready { return 200 ''; }")
    else:
        body = {"error": "no ready replica for: " + (", ".join(not_ready) or "any model")}
        add(f"    location = /v2/health/ready {{ return 503 {_json_literal(body)}; }}")
    if all_backends:
        add("    location = /v2 { proxy_pass http://m__any/v2; }")
    else:
        add(f"    location = /v2 {{ return 503 {_json_literal({'error': 'no ready replica'})}; }}")
    for r in cfg.routes:
        name = r.triton_name or r.model
        if r.backends:
            add(f"    location = /v2/models/{r.model} {{ proxy_pass http://{r.upstream}/v2/models/{name}; }}")
            add(f"    location /v2/models/{r.model}/ {{ proxy_pass http://{r.upstream}/v2/models/{name}/; }}")
        else:
            body = _json_literal({"error": f"model {r.model} has no ready replica"})
            add(f"    location = /v2/models/{r.model} {{ return 503 {body}; }}")
            add(f"    location /v2/models/{r.model}/ {{ return 503 {body}; }}")
    add(f"    location / {{ return 404 {_json_literal({'error': 'unknown path or model'})}; }}")
    add("  }")
    add("}")
    return "\n".join(lines) + "\n"


def _children(pid: int) -> set[int]:
    """PIDs whose parent is ``pid`` (nginx workers of our master)."""
    out: set[int] = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            # field 4 is ppid; the command (field 2) may contain spaces, so split after ')'
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


class NginxFrontDoor:
    """Start, reconfigure and stop our own nginx master (never any other nginx)."""

    def __init__(self, run_dir: str | os.PathLike, port: int, binary: str | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.prefix = self.run_dir / "nginx"
        self.port = port
        self.binary = find_nginx(binary)
        self.proc: subprocess.Popen | None = None
        self.routes: tuple[Route, ...] = ()
        self.reloads = 0
        self.started = False  # start() succeeded and stop() has not run: it should be up

    @property
    def program(self) -> str:
        return os.path.basename(self.binary or "nginx")

    @property
    def conf_path(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _cmd(self, *extra: str) -> list[str]:
        assert self.binary
        return [
            self.binary,
            "-p",
            str(self.prefix),
            "-c",
            str(self.conf_path),
            "-e",
            str(self.prefix / "logs" / "error.log"),
            *extra,
        ]

    def _write(self, routes: Sequence[Route]) -> None:
        for d in ("logs", "temp"):
            (self.prefix / d).mkdir(parents=True, exist_ok=True)
        text = render_config(DoorConfig(self.port, self.prefix, tuple(routes)))
        tmp = self.conf_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.conf_path)

    def _test(self) -> None:
        r = subprocess.run(self._cmd("-t", "-q"), capture_output=True, text=True, timeout=30, check=False)
        if r.returncode != 0:
            raise NginxError(f"nginx -t rejected {self.conf_path}: {(r.stderr or r.stdout).strip()}")

    def start(self, routes: Sequence[Route] = (), timeout_s: float = 10.0) -> None:
        if not self.binary:
            raise NginxError("nginx not found (install nginx-light: apt-get install -y nginx-light)")
        check_bindable(self.port, "front door")
        self.routes = tuple(routes)
        self._write(self.routes)
        self._test()
        self.proc = spawn(self._cmd(), log_path=self.prefix / "logs" / "stdout.log", run_dir=self.run_dir)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                kill_group(self.proc.pid)
                raise NginxError(f"nginx exited with {self.proc.returncode}: {self._tail()}")
            if port_listening(self.port) and self._owns_port():
                self.started = True
                return
            time.sleep(0.05)
        stop_child(self.proc, 2.0)
        raise NginxError(
            f"nginx did not listen on 127.0.0.1:{self.port} within {timeout_s:.0f}s: {self._tail()}"
        )

    def _owns_port(self) -> bool:
        """The listening socket is ours (our master or a worker in its group), not a stranger's."""
        holder = port_holder(self.port)
        if holder is None or self.proc is None:
            return False
        try:
            return os.getpgid(holder.pid) == self.proc.pid
        except ProcessLookupError:
            return False

    def _tail(self) -> str:
        return " | ".join(tail_lines(self.prefix / "logs" / "error.log", 5))

    def error_lines(self) -> list[str]:
        return error_lines(tail_lines(self.prefix / "logs" / "error.log", 50))

    def reap(self) -> None:
        """The master died: end its workers (same process group) so none serves a stale config."""
        if self.proc is not None:
            kill_group(self.proc.pid)
            wait_group_gone(self.proc.pid, 2.0)  # the port is free once they are gone

    def workers(self) -> set[int]:
        return _children(self.proc.pid) if self.alive() and self.proc else set()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def update(self, routes: Sequence[Route]) -> set[int]:
        """Rewrite and gracefully reload; returns the PIDs of the workers being retired.

        No-op (empty set) when the routes did not change.
        """
        routes = tuple(routes)
        if routes == self.routes and self.conf_path.exists():
            return set()
        if not self.alive() or self.proc is None:
            raise NginxError("nginx is not running")
        old = self.workers()
        self._write(routes)
        self._test()
        # send_signal, not os.kill: nginx may exit after the check above (at teardown),
        # and Popen neither signals a reaped PID nor raises for it.
        self.proc.send_signal(signal.SIGHUP)
        if self.proc.poll() is not None:
            raise NginxError(f"nginx exited before its reload (exit {self.proc.returncode})")
        self.routes = routes
        self.reloads += 1
        return old

    def wait_retired(self, old_workers: set[int], timeout_s: float = WORKER_SHUTDOWN_TIMEOUT_S + 5) -> bool:
        """True once every worker of the previous config has exited (its requests are done)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not (old_workers & self.workers()):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        # SIGQUIT to the master = graceful shutdown (workers finish in-flight
        # requests); SIGKILL to the group we created if it hangs.
        self.started = False
        stop_child(self.proc, timeout_s, sig=signal.SIGQUIT, group=False)
