"""Multinode groups in the local backend: ``LocalCluster``'s group half (act/).

Split from ``local.py`` (which reads as the MIG replicas' state machine) and
mixed into ``LocalCluster``. The planner CREATEs one member per whole GPU
(ids ``"<model>-g<k>-<rank>"``, profile ``"whole"``, start 0); the CREATEs of
one group are collected in ``_pending`` and the last one starts ONE
``ProcessGroup`` (rank 0 tritonserver on member 0's GPU, ranks 1.. ``worker.py``,
each with its GPU's identity in ``MIGSCALE_GPU``). It is then one
``LocalReplica`` with ``members``: routed and scraped through the leader,
READY only when every member is, recreated whole when any member dies
(LeaderWorkerSet's ``RecreateGroupOnPodRestart``). Every member PID goes to
pids.json, so ``migscale down`` reaches them after a crashed controller too.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autoscaler.act.local.pids import PidRegistry
from autoscaler.act.local.replicas import WHOLE, LocalReplica, ModelRuntime, group_env
from autoscaler.policy.types import Action, GpuState, ReplicaState
from autoscaler.status import GroupView

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from autoscaler.clock import Clock


class GroupsMixin:
    # provided by LocalCluster
    pids: PidRegistry
    run_dir: Path
    tritonserver: str | None
    clock: Clock
    _lock: threading.RLock
    _stopping: bool
    _gpus: dict[str, GpuState]
    _replicas: dict[str, LocalReplica]
    _pending: dict[str, dict[int, str]]
    _member_of: dict[str, str]

    log: Callable[[str], None]  # LocalCluster's lifecycle log
    launcher: Any  # LocalCluster's ReplicaLauncher (apply.py): starts the group's processes

    def _record(self, r: LocalReplica) -> None:
        """Put every process of ``r`` in pids.json (a group: the leader and each worker)."""
        if not r.is_group:
            self.pids.add(r.process.pid, "tritonserver", r.id, program=r.process.binary.name)
            return
        pids = r.pids()
        self.pids.add(pids[0], "tritonserver", f"{r.id}/rank0", program=r.process.binary.name)
        for rank, pid in enumerate(pids[1:], start=1):
            self.pids.add(pid, "worker", f"{r.id}/rank{rank}", program=os.path.basename(sys.executable))

    def _occupant(self, gpu_id: str) -> str | None:
        """The replica or pending group member already on a whole GPU (caller holds the lock)."""
        for r in self._replicas.values():
            if gpu_id in r.gpus:
                return r.id
        for gid, ranks in self._pending.items():
            if gpu_id in ranks.values():
                return gid
        return None

    def _create_member(self, a: Action, rt: ModelRuntime) -> str | None:
        """Collect one member CREATE; the last one of a group starts the whole group."""
        if a.profile != WHOLE:
            raise ValueError(
                f"model {a.model!r} is multinode: CREATE needs profile {WHOLE!r}, got {a.profile!r}"
            )
        gid, _, rank_s = (a.replica or "").rpartition("-")
        if not gid or not rank_s.isdigit() or int(rank_s) >= rt.group_size:
            raise ValueError(
                f"multinode CREATE needs replica '<group>-<rank>' with rank < {rt.group_size}, got {a.replica!r}"
            )
        rank = int(rank_s)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the local cluster is stopping")
            gpu = self._gpus.get(a.gpu)
            if gpu is None:
                raise ValueError(f"unknown GPU {a.gpu!r}; known: {', '.join(self._gpus)}")
            if gpu.mig_enabled:
                raise ValueError(
                    f"{gpu.id} is in MIG mode; a multinode member needs a whole GPU (REPARTITION whole)"
                )
            busy = self._occupant(gpu.id)
            if busy is not None:
                raise ValueError(f"{gpu.id} is already held by {busy}")
            if gid in self._replicas:
                raise ValueError(f"group {gid!r} already exists")
            ranks = self._pending.setdefault(gid, {})
            if rank in ranks:
                raise ValueError(f"member {a.replica!r} was created twice")
            ranks[rank] = gpu.id
            if len(ranks) < rt.group_size:
                return None
            del self._pending[gid]
            members = tuple((f"{gid}-{k}", ranks[k]) for k in range(rt.group_size))
            envs = [group_env(self._gpus[g].product, g, rt.name, self._gpus[g].emulated) for _, g in members]
            group = self.launcher.group(rt, gid, self.run_dir, envs, self.tritonserver)
            r = LocalReplica(
                gid,
                rt.name,
                WHOLE,
                members[0][1],
                0,
                group,
                ReplicaState.STARTING,
                self.clock.now(),
                members=members,
            )
            self._record(r)
            self._replicas[gid] = r
            for mid, _ in members:
                self._member_of[mid] = gid
            where = ", ".join(
                f"rank {k} {g} pid {p}" for k, ((_, g), p) in enumerate(zip(members, group.pids()))
            )
            self.log(f"create group {gid} ({where})")
            return gid

    def _group_views(self, reps: list[LocalReplica]) -> dict[str, GroupView]:
        """Status rows of each group: its member ids, GPUs and live members (rank, pid, port, state)."""
        return {
            r.id: GroupView(
                member_ids=tuple(mid for mid, _ in r.members),
                gpus=r.gpus,
                members=tuple(
                    {**m, "gpu": r.members[m["rank"]][1]}
                    for m in r.process.members()  # type: ignore[union-attr]
                ),
            )
            for r in reps
            if r.is_group
        }
