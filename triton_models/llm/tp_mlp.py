"""Tensor-parallel residual MLP shared by the Triton leader (rank 0) and the workers.

Each of ``layers`` blocks computes ``x + relu(x @ W1) @ W2``. W1 is split by
columns and W2 by rows across the ranks (Megatron-style), so each rank computes
a partial product and one ``all_reduce(SUM)`` per layer rebuilds the full
result. With world size 1 the same code is the single-process reference, which
is how tests check that the group returns the same result.

Wire protocol per batch, driven by rank 0: broadcast a header ``[op, batch]``
(op 1 = compute, 0 = shut down), then broadcast X, then compute.
"""

from __future__ import annotations

import os
from datetime import timedelta

import numpy as np

D_MODEL = 256
D_HIDDEN = 2048
LAYERS = 4
SEED = 1234

OP_STOP = 0
OP_COMPUTE = 1


def full_weights():
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(LAYERS):
        w1 = rng.standard_normal((D_MODEL, D_HIDDEN), dtype=np.float32) / np.sqrt(D_MODEL)
        w2 = rng.standard_normal((D_HIDDEN, D_MODEL), dtype=np.float32) / np.sqrt(D_HIDDEN)
        out.append((w1, w2))
    return out


def shard_weights(rank: int, world: int):
    if D_HIDDEN % world:
        raise ValueError(f"hidden size {D_HIDDEN} is not divisible by group size {world}")
    n = D_HIDDEN // world
    lo, hi = rank * n, (rank + 1) * n
    return [(w1[:, lo:hi].copy(), w2[lo:hi, :].copy()) for w1, w2 in full_weights()]


def reference(x: np.ndarray) -> np.ndarray:
    """Single-process result, no torch needed."""
    x = x.astype(np.float32)
    for w1, w2 in full_weights():
        x = x + np.maximum(x @ w1, 0.0) @ w2
    return x


class Shard:
    """This rank's part of the model plus the process group it computes in."""

    def __init__(self, rank: int, world: int, addr: str, backend: str | None = None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, world
        # NCCL on GPUs (GPUDirect RDMA between nodes); gloo over TCP where there is none.
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.device = torch.device("cuda", 0) if self.backend == "nccl" else torch.device("cpu")
        torch.set_num_threads(max(1, int(os.environ.get("MIGSCALE_TORCH_THREADS", "1"))))
        if world > 1:
            dist.init_process_group(
                self.backend,
                init_method=f"tcp://{addr}",
                rank=rank,
                world_size=world,
                # Idle workers block in broadcast between requests: a long timeout
                # keeps a quiet group alive; a dead peer still fails the collective.
                timeout=timedelta(hours=24),
            )
        self.weights = [
            (torch.from_numpy(w1).to(self.device), torch.from_numpy(w2).to(self.device))
            for w1, w2 in shard_weights(rank, world)
        ]

    def forward(self, x):
        torch, dist = self.torch, self.dist
        for w1, w2 in self.weights:
            part = torch.relu(x @ w1) @ w2
            if self.world > 1:
                dist.all_reduce(part, op=dist.ReduceOp.SUM)
            x = x + part
        return x

    # ---- rank 0 drives, others follow
    def lead(self, x_np: np.ndarray) -> np.ndarray:
        torch = self.torch
        x = torch.from_numpy(np.ascontiguousarray(x_np, dtype=np.float32)).to(self.device)
        if self.world > 1:
            header = torch.tensor([OP_COMPUTE, x.shape[0]], dtype=torch.int64, device=self.device)
            self.dist.broadcast(header, src=0)
            self.dist.broadcast(x, src=0)
        return self.forward(x).cpu().numpy()

    def follow_once(self) -> bool:
        torch = self.torch
        header = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.dist.broadcast(header, src=0)
        op, batch = int(header[0]), int(header[1])
        if op == OP_STOP:
            return False
        x = torch.empty((batch, D_MODEL), dtype=torch.float32, device=self.device)
        self.dist.broadcast(x, src=0)
        self.forward(x)
        return True

    def stop(self) -> None:
        if self.world > 1 and self.rank == 0:
            header = self.torch.tensor([OP_STOP, 0], dtype=self.torch.int64, device=self.device)
            try:
                self.dist.broadcast(header, src=0)
            except Exception:  # a peer already gone: nothing left to tell
                pass
        if self.world > 1 and self.dist.is_initialized():
            self.dist.destroy_process_group()
