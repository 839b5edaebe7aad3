"""Example recurrent model (numpy GRU) for the local migscale cluster.

Input ``SEQUENCE`` FP32 [20,8] (20 time steps of 8 features), output
``OUTPUT`` FP32 [8]: a single-layer GRU with 32 hidden units run step by step
(the sequential dependency is what makes RNNs scale poorly with slice size),
then a dense head on the last hidden state. About 0.3 ms of real CPU work for
a batch of 8. On an emulated MIG slice the batch is then padded to the
slice's time (``emulation.json``). Weights are seeded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_common"))

import numpy as np
from migscale_emulation import Emulator
from migscale_pyb import execute_batched

FEATURES, HIDDEN = 8, 32


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class TritonPythonModel:
    def initialize(self, args):
        self.emulator = Emulator(Path(__file__).resolve().parents[1])
        rng = np.random.default_rng(20)
        self.wx = (rng.standard_normal((FEATURES, 3 * HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32)
        self.wh = (rng.standard_normal((HIDDEN, 3 * HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
        self.b = np.zeros(3 * HIDDEN, dtype=np.float32)
        self.out = (rng.standard_normal((HIDDEN, FEATURES)) / np.sqrt(HIDDEN)).astype(np.float32)

    def forward(self, seq: np.ndarray) -> np.ndarray:
        b, t, _ = seq.shape
        h = np.zeros((b, HIDDEN), dtype=np.float32)
        xs = seq.astype(np.float32) @ self.wx + self.b  # [B,T,3H], input part precomputed
        H = HIDDEN
        for i in range(t):
            gx = xs[:, i]
            gh = h @ self.wh
            z = _sigmoid(gx[:, :H] + gh[:, :H])
            r = _sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
            n = np.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
            h = (1.0 - z) * n + z * h
        return (h @ self.out).astype(np.float32)

    def execute(self, requests):
        return execute_batched(requests, "SEQUENCE", "OUTPUT", self.forward, self.emulator)

    def finalize(self):
        pass
