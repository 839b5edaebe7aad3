"""A local multinode replica: N processes started, watched and stopped as one group.

This is the local stand-in for one LeaderWorkerSet group (docs/multinode.md). Rank 0
is a real ``tritonserver`` (it alone serves HTTP, gRPC and metrics); ranks
1..N-1 run the model's ``worker.py`` and join rank 0 through torch.distributed.
RDMA cannot exist on this machine, so the collective runs over TCP with gloo;
on GPUs the very same model code selects NCCL (GPUDirect RDMA between nodes).

Group semantics follow LeaderWorkerSet's ``RecreateGroupOnPodRestart``: the
group is ready only when every member is, and the loss of any member makes the
supervisor recreate the whole group (``failed()`` tells it so).

One process group per generation: the leader starts a new one (act/local/procs.py)
and every worker joins it, so ``killpg`` of the leader's PID ends every rank and
every Python stub of that generation, also when the leader is the one that
died. Each generation writes its logs under ``gen<N>/``; only the last
``KEEP_GENERATIONS`` are kept on disk (a crash loop used to leave thousands).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autoscaler.act.local.procs import error_lines, kill_group, spawn, stop_child, tail_lines
from autoscaler.act.local.triton import (
    PORT_RETRIES,
    TritonPorts,
    TritonProcess,
    free_ports,
    port_clash,
    triton_env,
)

# Generation directories kept on disk: the current one and the two before it
# (the last crash's logs stay readable while the next generation starts).
KEEP_GENERATIONS = 3


@dataclass
class Member:
    rank: int
    proc: subprocess.Popen | None = None  # workers; the leader is a TritonProcess
    log_path: Path | None = None


class ProcessGroup:
    def __init__(
        self,
        model_repository: str | os.PathLike,
        model: str,
        size: int,
        workdir: str | os.PathLike,
        env: Mapping[str, str] | None = None,
        tritonserver: str | None = None,
        ports: TritonPorts | None = None,
        member_env: Sequence[Mapping[str, str]] | None = None,
        run_dir: str | os.PathLike | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"group size must be >= 1, got {size}")
        self.model_repository = Path(model_repository).resolve()
        self.model = model
        self.size = size
        self.workdir = Path(workdir).resolve()
        self.extra_env = dict(env or {})
        # Per-rank additions (the local backend gives each member its GPU's identity).
        self.member_env = [dict(e) for e in (member_env or ())]
        if self.member_env and len(self.member_env) != size:
            raise ValueError(f"member_env has {len(self.member_env)} entries for a group of {size}")
        self.tritonserver = tritonserver
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else None
        # Ports a caller gave are kept for every generation (the caller published them);
        # otherwise each generation starts on fresh ones, so a recreate after a port
        # clash cannot clash on the same port again.
        self.fixed_ports = ports is not None
        self.ports = ports or TritonPorts.free()
        self.leader: TritonProcess | None = None
        self.workers: list[Member] = []
        self.rendezvous_port: int | None = None
        self.started_at: float | None = None
        self.generation = 0  # bumped each time the whole group is (re)created
        self.ready_at: float | None = None  # set by the local supervisor when it publishes READY

    # ------------------------------------------------------------ addresses
    @property
    def url_http(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def pid(self) -> int | None:
        return self.leader.pid if self.leader else None

    def pids(self) -> list[int]:
        out = [self.leader.pid] if self.leader and self.leader.pid else []
        return out + [m.proc.pid for m in self.workers if m.proc]

    # The local backend treats a group like one tritonserver: these mirror
    # TritonProcess (the leader's address, the group's liveness).
    @property
    def url_grpc(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def url_metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.leader.proc if self.leader else None

    @property
    def binary(self) -> Path:
        return self.leader.binary if self.leader else Path("tritonserver")

    def alive(self) -> bool:
        """Every member started is still running (False before start: nothing to serve)."""
        return self.leader is not None and not self.failed()

    def tail_log(self, lines: int = 20) -> str:
        return self.tail_logs(lines)

    def _group_env(self, rank: int) -> dict[str, str]:
        env = dict(self.extra_env)
        if self.member_env:
            env.update(self.member_env[rank])
        env.update(
            MIGSCALE_GROUP_RANK=str(rank),
            MIGSCALE_GROUP_SIZE=str(self.size),
            MIGSCALE_GROUP_ADDR=f"127.0.0.1:{self.rendezvous_port}",
            # Two cores host the whole group here: one intra-op thread per rank
            # keeps N ranks from oversubscribing them N-fold.
            MIGSCALE_TORCH_THREADS=env.get("MIGSCALE_TORCH_THREADS", "1"),
        )
        return env

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        # ``generation`` moves on only once this generation's leader and workers are in
        # place and the old directories are pruned: a reader that sees the new number
        # (the supervisor's status, a test) also sees its processes and its disk.
        gen = self.generation + 1
        self.started_at = time.time()
        self.ready_at = None
        self._choose_ports()
        gen_dir = self.workdir / f"gen{gen}"
        gen_dir.mkdir(parents=True, exist_ok=True)
        self._prune_generations()
        try:
            self._start_members(gen_dir)
        finally:
            self.generation = gen

    def _choose_ports(self) -> None:
        # The rendezvous port is chosen with the leader's three, all held at once: picked
        # one after another, the kernel hands a just-released port out again, and the
        # group's rendezvous then takes the leader's gRPC port.
        if self.fixed_ports:
            (self.rendezvous_port,) = free_ports(1, exclude=set(self.ports))
        else:
            *leader, self.rendezvous_port = free_ports(4, exclude=set(self.ports))
            self.ports = TritonPorts(*leader)

    def _start_members(self, gen_dir: Path) -> None:
        self.leader = TritonProcess(
            self.model_repository,
            [self.model],
            gen_dir / "rank0",
            ports=self.ports,
            env=self._group_env(0),
            tritonserver=self.tritonserver,
            run_dir=self.run_dir,
            backends_dir=self.workdir.parent / "backends",  # shared with the other replicas
        )
        self.leader.start()
        worker_py = self.model_repository / self.model / "worker.py"
        self.workers = []
        for rank in range(1, self.size):
            log_path = gen_dir / f"rank{rank}" / "worker.log"
            try:
                proc = spawn(
                    [sys.executable, str(worker_py)],
                    log_path=log_path,
                    env=triton_env(self._group_env(rank)),
                    cwd=log_path.parent,
                    run_dir=self.run_dir,
                    process_group=self.leader.pid or 0,  # the generation's one group
                )
            except (OSError, subprocess.SubprocessError) as e:
                # The leader died before this rank could join its group: the
                # generation has failed; record why, the supervisor recreates it.
                with open(log_path, "a") as log:
                    log.write(f"could not start rank {rank}: {type(e).__name__}: {e}\n")
                proc = None
            self.workers.append(Member(rank, proc, log_path))

    def _prune_generations(self) -> None:
        gens = sorted(
            (int(p.name[3:]), p) for p in self.workdir.glob("gen*") if p.name[3:].isdigit()
        )
        for _, p in gens[:-KEEP_GENERATIONS]:
            shutil.rmtree(p, ignore_errors=True)

    def note_stubs(self) -> None:
        """The leader's Python stubs serving now (``TritonProcess.note_stubs``)."""
        if self.leader is not None:
            self.leader.note_stubs()

    @property
    def dead_stub(self) -> int | None:
        return self.leader.dead_stub if self.leader is not None else None

    def failed(self) -> bool:
        """True when any member that was started has exited: the group must be recreated."""
        if self.leader is None:
            return False
        if not self.leader.alive():
            return True
        return any(m.proc is None or m.proc.poll() is not None for m in self.workers)

    def exited(self) -> list[str]:
        """Which members have exited and how ("rank 1 exit 1"), without probing anyone."""
        out = []
        if self.leader is not None and not self.leader.alive():
            out.append(f"rank 0 exit {self.leader.proc.returncode if self.leader.proc else '?'}")
        for m in self.workers:
            if m.proc is None:
                out.append(f"rank {m.rank} not started")
            elif m.proc.poll() is not None:
                out.append(f"rank {m.rank} exit {m.proc.returncode}")
        return out

    def _worker_joined(self, m: Member) -> bool:
        try:
            return m.proc is not None and m.proc.poll() is None and "joined" in m.log_path.read_text()
        except OSError:
            return False

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        # The leader's model initialises only after every rank joined, so leader
        # readiness already implies the group; checking workers too guards
        # against a worker that died after the join.
        return (
            self.leader is not None
            and not self.failed()
            and all(self._worker_joined(m) for m in self.workers)
            and self.leader.is_ready(timeout_s)
        )

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Block until the group is ready; seconds from its last start. A generation that lost
        one of the ports we chose is recreated on fresh ones, ``PORT_RETRIES`` times at most."""
        deadline = time.time() + timeout_s
        retries = 0
        while time.time() < deadline:
            if self.failed():
                if retries < PORT_RETRIES and not self.fixed_ports and self._port_clash():
                    retries += 1
                    self.recreate()
                    continue
                raise RuntimeError(f"group {self.model} lost a member while starting:\n{self.tail_logs()}")
            if self.is_ready():
                return time.time() - (self.started_at or time.time())
            time.sleep(0.1)
        raise TimeoutError(f"group {self.model} not ready after {timeout_s:.0f}s:\n{self.tail_logs()}")

    def _port_clash(self) -> bool:
        """Did this generation fail on a port someone else bound first (its logs are its own)?"""
        logs = [self.leader.log_path] if self.leader else []
        logs += [m.log_path for m in self.workers if m.log_path is not None]
        return any(port_clash(tail_lines(path, 200)) for path in logs)

    def tail_logs(self, lines: int = 10) -> str:
        parts = [self.leader.tail_log(lines)] if self.leader else []
        for m in self.workers:
            if m.log_path is not None:
                parts.append("\n".join(tail_lines(m.log_path, lines)))
        return "\n---\n".join(parts)

    def error_lines(self, keep: int = 5) -> list[str]:
        """What went wrong, from the member that exited first (a worker that could not import
        torch), else from the leader's log."""
        for m in self.workers:
            if (m.proc is None or m.proc.poll() is not None) and m.log_path is not None:
                lines = error_lines(tail_lines(m.log_path, 200), keep)
                if lines:
                    return [f"rank {m.rank}: {ln}" for ln in lines]
        return self.leader.error_lines(keep) if self.leader else []

    def reap(self) -> None:
        """After a member died: end every process of this generation at once (one group)."""
        if self.leader is not None:
            self.leader.reap()
        for m in self.workers:
            if m.proc is not None:
                kill_group(m.proc.pid)  # a rank that could not join the leader's group

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every member we started (leader first: its finalize tells workers to stop)."""
        if self.leader is not None:
            self.leader.stop(timeout_s)
        for m in self.workers:
            stop_child(m.proc, timeout_s, group=False)
        self.reap()

    def recreate(self) -> None:
        """RecreateGroupOnPodRestart: tear every member down and start a fresh generation."""
        self.stop(timeout_s=5.0)
        self.start()

    def members(self) -> list[dict]:
        out = []
        if self.leader is not None:
            state = "ready" if self.leader.is_ready(0.3) else ("failed" if not self.leader.alive() else "starting")
            out.append({"rank": 0, "pid": self.leader.pid, "port": self.ports.http, "state": state, "role": "leader"})
        for m in self.workers:
            alive = m.proc is not None and m.proc.poll() is None
            state = "ready" if self._worker_joined(m) else ("failed" if not alive else "starting")
            out.append({"rank": m.rank, "pid": m.proc.pid if m.proc else None, "port": None, "state": state,
                        "role": "worker"})
        return out
