"""Building the locust command line that ``migscale loadtest`` and ``migscale demo`` run.

Outside the loop: load generation. One documented ``locust ... --headless``
line (printable, so it can be re-run by hand or in CI without migscale),
and where the local cluster's front door is.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtests" / "locustfile.py"

def host_problem(host: str, timeout_s: float = 3.0) -> str | None:
    """Why nothing could take the load test's requests at ``host`` (``http://HOST:PORT`` or
    ``HOST:PORT``), or None once a TCP connection opens there. A load test at an address where
    nothing listens would run its whole duration to report 100% errors."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(host if "://" in host else f"tcp://{host}")
        name, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"not HOST:PORT or http(s)://HOST:PORT ({exc})"
    if not name:
        return "not HOST:PORT or http(s)://HOST:PORT"
    try:
        socket.create_connection((name, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"nothing answers at {name}:{port} ({exc.strerror or type(exc).__name__})"
    return None


def locust_binary() -> str:
    """locust from the same virtualenv as this interpreter (the one that has tritonclient)."""
    cand = Path(sys.executable).parent / "locust"
    return str(cand) if cand.exists() else "locust"


def frontdoor_from_run_dir(run_dir: Path) -> str | None:
    """The local cluster's front door URL from ``run_dir/controller.json``, if the cluster is up.

    Accepts ``{"frontdoor": "http://127.0.0.1:8000"}``, ``{"frontdoor": {"url": ...}}``,
    ``{"frontdoor": {"port": 8000}}``, ``{"frontdoor_url": ...}`` or ``{"frontdoor_port": 8000}``.
    """
    p = run_dir / "controller.json"
    try:
        doc: Any = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    fd = doc.get("frontdoor", doc.get("frontdoor_url"))
    if isinstance(fd, dict):
        fd = fd.get("url") or (f"http://{fd.get('host', '127.0.0.1')}:{fd['port']}" if fd.get("port") else None)
    if fd is None and doc.get("frontdoor_port"):
        fd = f"http://127.0.0.1:{doc['frontdoor_port']}"
    if isinstance(fd, int):
        fd = f"http://127.0.0.1:{fd}"
    if isinstance(fd, str) and fd:
        return fd if "://" in fd else f"http://{fd}"
    return None


def build_command(
    *,
    models_yaml: str,
    host: str,
    results: Path,
    duration_s: float,
    shape: str,
    shape_args: str,
    base_rps: float,
    peak_rps: float | None,
    protocol: str,
    models: str,
    users_max: int,
    user_rps: float,
    slo: str,
    slo_models: str,
    warmup_s: float,
    slo_ignore: str,
) -> list[str]:
    cmd = [
        locust_binary(), "-f", str(LOCUSTFILE), "--headless",
        "--host", host,
        "--run-time", f"{max(1, round(duration_s))}s",
        # in-flight requests finish (and are counted) instead of being killed at the end
        "--stop-timeout", "10s",
        "--csv", str(results / "locust"),
        "--html", str(results / "report.html"),
        "--models-yaml", models_yaml,
        "--protocol", protocol,
        "--shape", shape,
        "--base-rps", f"{base_rps:g}",
        "--users-max", str(users_max),
        "--user-rps", f"{user_rps:g}",
        "--results-dir", str(results),
        "--loglevel", "WARNING",
    ]
    if peak_rps is not None:
        cmd += ["--peak-rps", f"{peak_rps:g}"]
    if shape_args:
        cmd += ["--shape-args", shape_args]
    if models:
        cmd += ["--models", models]
    if slo:
        cmd += ["--slo", slo]
    if slo_models:
        cmd += ["--slo-models", slo_models]
    if warmup_s > 0:
        cmd += ["--slo-warmup-s", f"{warmup_s:g}"]
    if slo_ignore:
        cmd += ["--slo-ignore", slo_ignore]
    return cmd
