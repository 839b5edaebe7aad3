"""Example BERT-like encoder (numpy transformer) for the local migscale cluster.

Input ``INPUT_IDS`` INT64 [16] (token ids, vocabulary 1000), output
``POOLED`` FP32 [64]: token + position embeddings, two post-LN encoder layers
(4-head self-attention, GELU feed-forward 64->128->64), and BERT's pooler
(tanh dense on the first token). About 0.5 ms of real CPU work for a batch of
8. On an emulated MIG slice the batch is then padded to the slice's
BERT-base time (``emulation.json``). Weights are seeded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_common"))

import numpy as np
from migscale_emulation import Emulator
from migscale_pyb import execute_batched

VOCAB, SEQ, D, HEADS, FF, LAYERS = 1000, 16, 64, 4, 128, 2


def _layer_norm(x: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


class TritonPythonModel:
    def initialize(self, args):
        self.emulator = Emulator(Path(__file__).resolve().parents[1])
        rng = np.random.default_rng(64)

        def w(*shape):
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

        self.tok = (rng.standard_normal((VOCAB, D)) * 0.1).astype(np.float32)
        self.pos = (rng.standard_normal((SEQ, D)) * 0.1).astype(np.float32)
        self.layers = [
            {"qkv": w(D, 3 * D), "o": w(D, D), "f1": w(D, FF), "f2": w(FF, D)} for _ in range(LAYERS)
        ]
        self.pool = w(D, D)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        b, s = ids.shape
        h = self.tok[np.clip(ids, 0, VOCAB - 1)] + self.pos[:s]  # [B,S,D]
        dh = D // HEADS
        for L in self.layers:
            qkv = (h @ L["qkv"]).reshape(b, s, 3, HEADS, dh).transpose(2, 0, 3, 1, 4)  # [3,B,H,S,dh]
            q, k, v = qkv[0], qkv[1], qkv[2]
            att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)  # [B,H,S,S]
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, D)
            h = _layer_norm(h + ctx @ L["o"])
            h = _layer_norm(h + _gelu(h @ L["f1"]) @ L["f2"])
        return np.tanh(h[:, 0] @ self.pool).astype(np.float32)

    def execute(self, requests):
        return execute_batched(requests, "INPUT_IDS", "POOLED", self.forward, self.emulator)

    def finalize(self):
        pass
