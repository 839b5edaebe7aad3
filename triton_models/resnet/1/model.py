"""Example image classifier (ResNet-like CNN in numpy) for the local migscale cluster.

Input ``INPUT`` FP32 [3,32,32] (one CHW image), output ``PROBS`` FP32 [10]
class probabilities. Two stride-2 3x3 convolutions (3->8->16 channels, ReLU),
a residual 1x1 projection, global average pooling and a dense softmax head --
about 0.3 ms of real CPU work for a batch of 8. On an emulated MIG slice the
batch is then padded to the slice's ResNet-50 time (``emulation.json``).
Weights are seeded, so every replica answers identically.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The stub puts its own cwd first on sys.path; our shared helpers live in the
# repository's _common/ folder (two levels above 1/model.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "_common"))

import numpy as np
from migscale_emulation import Emulator
from migscale_pyb import execute_batched


def _im2col(x: np.ndarray, k: int, stride: int) -> tuple[np.ndarray, int, int]:
    """[B,C,H,W] -> [B, Ho*Wo, C*k*k] patches (padding 1), as a view-free copy."""
    b, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ho, wo = (h + 2 - k) // stride + 1, (w + 2 - k) // stride + 1
    s = xp.strides
    patches = np.lib.stride_tricks.as_strided(
        xp, (b, ho, wo, c, k, k), (s[0], s[2] * stride, s[3] * stride, s[1], s[2], s[3])
    )
    return patches.reshape(b, ho * wo, c * k * k), ho, wo


class TritonPythonModel:
    def initialize(self, args):
        self.emulator = Emulator(Path(__file__).resolve().parents[1])
        rng = np.random.default_rng(50)
        self.w1 = (rng.standard_normal((27, 8)) / np.sqrt(27)).astype(np.float32)
        self.w2 = (rng.standard_normal((72, 16)) / np.sqrt(72)).astype(np.float32)
        self.proj = (rng.standard_normal((8, 16)) / np.sqrt(8)).astype(np.float32)
        self.fc = (rng.standard_normal((16, 10)) / 4.0).astype(np.float32)
        self.bias = rng.standard_normal(10).astype(np.float32) * 0.1

    def forward(self, x: np.ndarray) -> np.ndarray:
        b = x.shape[0]
        cols, h, w = _im2col(x.astype(np.float32), 3, 2)  # [B,256,27]
        a1 = np.maximum(cols @ self.w1, 0.0)  # [B,256,8]
        a1_img = a1.transpose(0, 2, 1).reshape(b, 8, h, w)
        cols2, h2, w2 = _im2col(a1_img, 3, 2)  # [B,64,72]
        a2 = cols2 @ self.w2  # [B,64,16]
        # residual: 1x1 projection of the stride-2 subsampled first activation
        skip = a1_img[:, :, ::2, ::2].reshape(b, 8, h2 * w2).transpose(0, 2, 1) @ self.proj
        a2 = np.maximum(a2 + skip, 0.0)
        pooled = a2.mean(axis=1)  # [B,16]
        logits = pooled @ self.fc + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    def execute(self, requests):
        return execute_batched(requests, "INPUT", "PROBS", self.forward, self.emulator)

    def finalize(self):
        pass
