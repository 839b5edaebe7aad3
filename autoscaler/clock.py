"""The one Clock protocol (``now``, ``sleep``): wall time in production, virtual in tests.

The loop, the actuators' timeouts and the simulator all take a Clock, so a
five-minute Prometheus outage is a five-minute jump of a VirtualClock, not a
five-minute test.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Advances only when told to; ``sleep`` jumps instead of waiting."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = float(start_s)

    def now(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot go back in time by {seconds}s")
        self._t += seconds
