"""The one run loop: ticks a ``ControlLoop`` (or any tickable) on an injected clock.

Place in the loop: the outermost piece, in the loop's layer so that the simulator
(below ``runtime/``) can use it too. The local controller, the standalone
metrics API and the simulator each build a ``ControlLoop`` (or, for the
simulator's baselines and the API's publisher, anything with ``tick()``) and
hand it to a ``Driver``; none of them schedules ticks itself (the Kubernetes
controller adopts it next). The driver owns four things:

- **cadence and back-off**: healthy ticks start every ``result.next_delay_s``
  (fixed rate: the time a tick took is subtracted, down to one ``slice_s``);
  after a failed tick it waits the loop's own exponential back-off in full. A tick that
  raises -- the loop catches its own errors, so this means a bug or a broken
  hook -- is logged with its traceback, counted in ``tick_errors`` and backed
  off the same way (``tick_s * 2**k``, at most ``max_backoff_s``). The loop
  logs and counts the exceptions it catches (``ControlLoop.tick_errors``);
  ``health().tick_errors`` is both, the one ``migscale_tick_errors_total``;
- **hooks**: ``before_tick`` (the Kubernetes lease check points the gate),
  ``after_tick`` (publish to the metrics API), ``idle``, called every
  ``slice_s`` while waiting (the local controller's 1 s status refresh and
  fast scrape), and ``wake``, asked after each idle slice whether to tick
  now (a burst seen between ticks). A hook that raises is logged and
  counted, never fatal;
- **stopping**: ``run(stop)`` returns within one slice of ``stop`` being set
  (a ``threading.Event`` or a predicate, e.g. "the trace has ended");
- **health**: ``health()`` says whether the picture the loop publishes is
  current. It is not once the driver has stopped or died, or when the last
  completed tick is older than ``max_snapshot_age_s`` (a tick stuck in a slow
  apply, a loop backing off for minutes). ``/readyz`` and the metrics API use
  it, so a frozen picture is never served as if it were live.

All time comes from the clock: on a ``VirtualClock`` a ten-minute run is a
loop of jumps, which is how the tests use it; the simulator's clock
(``sim.run.SimTime``) integrates the simulated world in its ``sleep``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from autoscaler.clock import Clock

log = logging.getLogger("migscale.driver")


class TickOutcome(Protocol):
    """What the driver needs of a tick's result (``loop.TickResult`` has it)."""

    @property
    def ok(self) -> bool: ...

    @property
    def next_delay_s(self) -> float: ...


class Tickable(Protocol):
    def tick(self) -> TickOutcome: ...


@dataclass(frozen=True)
class Hooks:
    """Optional callbacks; each runs on the driver's thread."""

    before_tick: Callable[[], None] | None = None
    after_tick: Callable[[TickOutcome], None] | None = None
    idle: Callable[[], None] | None = None
    # Asked after each idle slice of a healthy wait: True starts the next tick now
    # (the local controller's burst check: a rise seen by the 1 s scrape between ticks).
    wake: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    ticks: int
    tick_errors: int  # ticks that raised, caught inside the loop or out of it
    hook_errors: int
    consecutive_failures: int  # ticks in a row that were not ok (or raised)
    last_tick_s: float | None  # clock time the last completed tick started
    age_s: float | None  # now - last_tick_s

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


class Driver:
    def __init__(
        self,
        loop: Tickable,
        clock: Clock,
        *,
        tick_s: float,
        max_snapshot_age_s: float | None = None,
        max_backoff_s: float = 300.0,
        slice_s: float = 0.5,
        hooks: Hooks | None = None,
    ) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s: must be > 0, got {tick_s!r}")
        if not slice_s > 0:
            raise ValueError(f"slice_s: must be > 0, got {slice_s!r}")
        self.loop = loop
        self.clock = clock
        self.tick_s = float(tick_s)
        # Three missed ticks: one slow tick or one failed tick backing off 2 * tick_s
        # still counts as live; a loop stuck or asleep for longer does not.
        self.max_snapshot_age_s = float(max_snapshot_age_s) if max_snapshot_age_s else 3.0 * self.tick_s
        self.max_backoff_s = float(max_backoff_s)
        self.slice_s = float(slice_s)
        self.hooks = hooks or Hooks()
        self.ticks = 0
        self.tick_errors = 0
        self.hook_errors = 0
        self.consecutive_failures = 0
        self.last_tick_s: float | None = None
        self.last_error: str | None = None
        self.early_ticks = 0  # waits ended by the wake hook
        # while waiting: seconds left before the next tick is due, for an idle hook that
        # must not start work it cannot finish by then (None outside a wait)
        self.time_to_tick_s: float | None = None
        self._running = False
        self._stopped = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ one tick
    def step(self) -> float:
        """One tick with its hooks; returns the delay before the next one. Never raises."""
        started = self.clock.now()
        self._hook("before_tick")
        try:
            result = self.loop.tick()
        except Exception as exc:
            log.exception("tick raised")
            with self._lock:
                self.ticks += 1
                self.tick_errors += 1
                self.consecutive_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            return self._backoff()
        with self._lock:
            self.ticks += 1
            self.last_tick_s = started
            self.consecutive_failures = 0 if result.ok else self.consecutive_failures + 1
        self._hook("after_tick", result)
        delay = max(0.0, float(result.next_delay_s))
        if not result.ok:
            return delay  # a back-off counts from the end of the failed tick
        # Fixed rate: a healthy tick starts every ``next_delay_s`` however long the last
        # one took, so a 4 s tick on a 5 s cadence does not stretch reaction to 9 s.
        # A tick that overran still leaves one slice for the idle hook (status, fast scrape).
        elapsed = max(0.0, self.clock.now() - started)
        return max(min(self.slice_s, delay), delay - elapsed)

    def _backoff(self) -> float:
        # same rule as the loop's own: tick_s * 2**k after k failures in a row, capped
        return min(self.max_backoff_s, self.tick_s * 2 ** self.consecutive_failures)

    def _hook(self, name: str, *args: object) -> object:
        fn = getattr(self.hooks, name)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("%s hook raised", name)
            with self._lock:
                self.hook_errors += 1
                self.last_error = f"{name}: {type(exc).__name__}: {exc}"
            return None

    # ------------------------------------------------------------ running
    def wait(self, seconds: float, stop: Callable[[], bool]) -> None:
        """Sleep ``seconds`` on the clock in ``slice_s`` slices, calling ``idle`` after each;
        a healthy wait ends early when ``wake`` says so (never a back-off: a failing
        loop is not hurried by load)."""
        remaining = seconds
        while remaining > 1e-9 and not stop():
            step = min(self.slice_s, remaining)
            self.clock.sleep(step)
            remaining -= step
            self.time_to_tick_s = remaining
            hooks_from = self.clock.now()
            self._hook("idle")
            self.time_to_tick_s = None
            if not self.consecutive_failures and self._hook("wake") is True:
                with self._lock:
                    self.early_ticks += 1
                return
            # The hooks' own time counts against the wait: the next tick is due ``seconds``
            # after the wait began however long a hook (a fast-scrape round) took in it.
            # Counted per slice, not against a deadline read off the clock: the simulator's
            # clock ends a sleep on its step grid, and its sleeps add up to the due times.
            remaining -= max(0.0, self.clock.now() - hooks_from)

    def run(self, stop: threading.Event | Callable[[], bool]) -> None:
        """Tick until ``stop`` is set (an Event) or true (a predicate)."""
        should_stop = stop.is_set if isinstance(stop, threading.Event) else stop
        with self._lock:
            self._running, self._stopped = True, False
        try:
            while not should_stop():
                delay = self.step()
                self.wait(delay, should_stop)
        finally:
            with self._lock:
                self._running, self._stopped = False, True

    # ------------------------------------------------------------ health
    def health(self) -> Health:
        now = self.clock.now()
        with self._lock:
            age = None if self.last_tick_s is None else max(0.0, now - self.last_tick_s)
            if self._stopped:
                ready, reason = False, "the control loop has stopped"
            elif self.last_tick_s is None:
                ready, reason = False, "no control tick completed yet"
            elif age is not None and age > self.max_snapshot_age_s:
                ready, reason = False, (
                    f"the last completed tick is {age:.0f}s old (limit {self.max_snapshot_age_s:.0f}s)"
                )
            else:
                ready, reason = True, "ok"
            return Health(
                ready=ready,
                reason=reason,
                ticks=self.ticks,
                tick_errors=self.tick_errors + int(getattr(self.loop, "tick_errors", 0)),
                hook_errors=self.hook_errors,
                consecutive_failures=self.consecutive_failures,
                last_tick_s=self.last_tick_s,
                age_s=age,
            )
