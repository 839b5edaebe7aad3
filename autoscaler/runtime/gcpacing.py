"""Full garbage collections between control ticks, not inside them.

Place in the loop: a process-wide setting of the Kubernetes controller
(``runtime/kubernetes.py``), run from the driver's ``idle`` hook -- after a tick
has published and before the next one starts.

Why. CPython collects its oldest generation when enough objects have survived
the younger ones, wherever the program happens to be. A full collection walks
every tracked object and stops every thread of the process. A controller for a
large fleet holds many objects (the informers' caches of every Node and Pod,
the cluster snapshot rebuilt each tick, the imported client libraries): at
1,000 nodes and 8,000 GPUs a full collection takes 70-110 ms and came more than
once per 2 s tick during a scale-up, each time inside whatever the tick was
doing -- a decision, a rollout step waiting on the API server.

What this does:

- ``install`` collects once and **freezes** what is alive (``gc.freeze``): the
  imported modules and the synced caches are never walked again. A frozen
  object is still freed when its last reference goes (the caches replace their
  objects all the time); only a reference cycle among frozen objects would
  stay until the next thaw;
- it raises the oldest generation's threshold so far that the interpreter
  never starts a full collection on its own; young collections (a few ms)
  keep their default cadence;
- ``idle`` (the driver calls it while it waits for the next tick) runs a full
  collection once the younger generation has been collected ``threshold``
  times since the last one (CPython's own count and default, 10). CPython also
  waits until a quarter of the oldest generation is new; that rule keeps long
  walks rare, and a walk that skips the frozen objects and runs off the tick
  does not need it. At most one per call, and the driver calls it at least
  once between two ticks, so garbage cannot pile up for longer than a tick
  period;
- CPython runs one collection at a time. While another thread's collection is
  in progress (it runs finalizers and callbacks, which may release the GIL),
  ``gc.collect`` returns at once without collecting. ``idle`` checks the
  oldest generation's collection counter (``gc.get_stats``): a refused
  collection is counted as ``busy``, not as a collection, and stays due for
  the next slice;
- every ``thaw_every`` full collections it thaws (``gc.unfreeze``) so the
  collection walks everything, frees any cycle left among the frozen objects,
  and freezes what survives again. Memory is bounded by that period.

Python 3.14.0-3.14.4 shipped an incremental collector, which walks the old
generation a slice at a time with each young collection, so no single pause
covers the whole heap; under those versions ``install`` changes nothing and
``idle`` never collects. 3.14.5 and 3.15 went back to the generational one.

``uninstall`` restores the thresholds and thaws. The controller process opts in
(``migscale controller``); a library user building a ``KubernetesController``
in their own process keeps the interpreter's settings.

References: the ``gc`` module's documentation (``gc.freeze``, ``gc.get_count``,
``gc.get_stats``, ``gc.set_threshold``), https://docs.python.org/3/library/gc.html;
CPython's ``gc_collect_impl`` ("already collecting, don't do anything"),
https://github.com/python/cpython/blob/3.11/Modules/gcmodule.c; What's New in
Python 3.15, "gc" (the incremental collector of 3.14.0-3.14.4 reverted),
https://docs.python.org/3.15/whatsnew/3.15.html.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass

# Larger than any count the oldest generation can reach in a process's life: the
# interpreter never collects it on its own.
_NEVER = 2**30
# The cycle collector was incremental in 3.14.0-3.14.4 only (its old generation walked in slices).
INCREMENTAL = (3, 14, 0) <= sys.version_info[:3] < (3, 14, 5)


@dataclass
class GcStats:
    collections: int = 0  # full collections run between ticks
    thaws: int = 0  # of them, those that walked the frozen objects too
    busy: int = 0  # due ones refused: another thread's collection was in progress
    last_pause_s: float | None = None
    max_pause_s: float = 0.0
    total_pause_s: float = 0.0
    frozen: int = 0  # objects frozen at the last freeze

    def to_json(self) -> dict[str, object]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class IdleCollector:
    """Moves the oldest generation's collections into the gaps between ticks."""

    def __init__(self, threshold: int = 10, thaw_every: int = 100) -> None:
        if threshold < 1:
            raise ValueError(f"threshold: must be >= 1, got {threshold!r}")
        if thaw_every < 1:
            raise ValueError(f"thaw_every: must be >= 1, got {thaw_every!r}")
        self.threshold = threshold
        self.thaw_every = thaw_every
        self.stats = GcStats()
        self._saved: tuple[int, int, int] | None = None

    def install(self) -> None:
        if self.installed or INCREMENTAL:
            return
        self._saved = gc.get_threshold()
        gc.collect()
        gc.freeze()
        self.stats.frozen = gc.get_freeze_count()
        t0, t1, _ = self._saved
        gc.set_threshold(t0, t1, _NEVER)

    def uninstall(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        self._saved = None
        gc.unfreeze()

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def to_json(self) -> dict[str, object]:
        return {"installed": self.installed, **self.stats.to_json()}

    def due(self) -> bool:
        """Whether a full collection is due: the young generation has been collected
        ``threshold`` times since the last one (CPython's own count)."""
        return self.installed and gc.get_count()[2] >= self.threshold

    def idle(self) -> bool:
        """Run the due full collection now (between ticks); True if one ran."""
        if not self.due():
            return False
        thaw = (self.stats.collections + 1) % self.thaw_every == 0
        before = _full_collections()
        start = time.perf_counter()
        if thaw:
            gc.unfreeze()
        gc.collect(2)
        if thaw:
            gc.freeze()
            self.stats.frozen = gc.get_freeze_count()
        pause = time.perf_counter() - start
        s = self.stats
        if _full_collections() == before:
            s.busy += 1
            return False
        if thaw:
            s.thaws += 1
        s.collections += 1
        s.last_pause_s = pause
        s.max_pause_s = max(s.max_pause_s, pause)
        s.total_pause_s += pause
        return True


def _full_collections() -> int:
    """How many times the interpreter has collected its oldest generation."""
    return int(gc.get_stats()[2]["collections"])
