"""Stopping a child process we started: a signal, a grace period, then SIGKILL to its group.

Every long-lived child of the local backend (tritonserver, its Python stubs,
nginx, Prometheus, multinode workers) is started with ``start_new_session``,
so its process-group id is the PID we hold: signalling that group reaches the
child and what it spawned, and nothing we did not start.
"""

from __future__ import annotations

import os
import signal
import subprocess


def stop_child(proc: subprocess.Popen | None, timeout_s: float = 10.0, *, sig: int = signal.SIGTERM,
               group: bool = True) -> int | None:
    """Send ``sig`` (to the whole group when ``group``), wait ``timeout_s``, then SIGKILL the group.

    Returns the exit code, or None when there was no process. Safe to call twice.
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)
    return proc.returncode
