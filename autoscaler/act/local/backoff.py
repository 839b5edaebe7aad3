"""Restart back-off for the local backend's processes, the way kubelet does it (act/).

Place in the loop: the supervisor thread asks ``RestartBackoff`` when a dead
replica, group, nginx or Prometheus may be started again; nothing else
restarts a process. Pure bookkeeping on an injected clock (no I/O), so the
tests step a virtual clock through minutes of crash loop in microseconds.

The rule is kubelet's container back-off (``kuberuntime``'s ``doBackOff`` on
client-go's ``flowcontrol.Backoff``; sources in docs/local-processes.md), with its defaults:

* the first exit restarts at once (a lone ``kill -9`` costs a cold start,
  ~2 s, not 10 s) and arms the back-off at ``initial_s`` (10 s);
* an exit while the back-off is armed waits until ``backoff`` seconds after
  that exit, then restarts and doubles it: 10, 20, 40, 80, 160, 300, 300 ... s
  (capped at ``max_s``, 5 min);
* a process that ran ``reset_after_s`` (10 min, kubelet's 2 x max) since its
  last restart before exiting starts again from the beginning.

Worked number: a replica that fails ~2 s into each start is started 7 times
in its first 10 minutes (at 0, 2, 14, 36, 78, 160 and 322 s), then every
~5 minutes; without back-off a crash-looping group was recreated 1,762 times
in 13 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    initial_s: float = 10.0
    max_s: float = 300.0
    reset_after_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0 <= self.initial_s <= self.max_s):
            raise ValueError(f"restart back-off: need 0 <= initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if self.reset_after_s < 0:
            raise ValueError(f"restart back-off: reset_after_s must be >= 0, got {self.reset_after_s}")


@dataclass
class _Entry:
    backoff_s: float
    last_restart_s: float


class RestartBackoff:
    """Per-key back-off state (key: a replica id, ``"nginx"``, ``"prometheus"``)."""

    def __init__(self, policy: BackoffPolicy | None = None) -> None:
        self.policy = policy or BackoffPolicy()
        self._entries: dict[str, _Entry] = {}

    def _expired(self, e: _Entry, exited_s: float) -> bool:
        return exited_s - e.last_restart_s > self.policy.reset_after_s

    def delay_s(self, key: str, exited_s: float, now_s: float) -> float:
        """Seconds still to wait before restarting ``key``, which exited at ``exited_s`` (0: now)."""
        e = self._entries.get(key)
        if e is None or self._expired(e, exited_s):
            return 0.0
        return max(0.0, exited_s + e.backoff_s - now_s)

    def restarted(self, key: str, exited_s: float, now_s: float) -> None:
        """Record a restart at ``now_s`` of ``key`` that exited at ``exited_s``; arms or doubles the back-off."""
        e = self._entries.get(key)
        if e is None or self._expired(e, exited_s):
            self._entries[key] = _Entry(self.policy.initial_s, now_s)
        else:
            e.backoff_s = min(2 * e.backoff_s, self.policy.max_s)
            e.last_restart_s = now_s

    def current_s(self, key: str) -> float:
        """The armed back-off of ``key`` (0 when none)."""
        e = self._entries.get(key)
        return e.backoff_s if e is not None else 0.0

    def forget(self, key: str) -> None:
        """Drop a key (its replica was deleted): the map holds only live keys."""
        self._entries.pop(key, None)

    def retain(self, keys: set[str]) -> None:
        """Forget every key not in ``keys`` (replicas deleted since)."""
        for k in [k for k in self._entries if k not in keys]:
            del self._entries[k]

    def __len__(self) -> int:
        return len(self._entries)
