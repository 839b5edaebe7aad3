"""Helpers shared by the integration tests (imported as ``_support``: pytest puts this folder on sys.path)."""

from __future__ import annotations

import time


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
