"""Helpers shared by the integration tests (imported as ``_support``: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from autoscaler.act.local.pids import proc_alive


def wait_until(pred, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll ``pred`` until it returns something truthy (returned); fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def live_status(run_dir: Path) -> dict | None:
    """``run_dir/status.json`` as the running controller rewrites it each second (what
    ``migscale status --json`` prints), read directly rather than through a new interpreter
    every poll on the two cores the replicas start on. None while it is missing or half
    written, or when the controller that wrote it is dead."""
    try:
        doc = json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return None
    pid = doc.get("controller_pid")
    return doc if pid and proc_alive(pid) else None
