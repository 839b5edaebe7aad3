"""Triton Python model for rank 0 of the llm group (the leader serves HTTP/gRPC/metrics)."""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

from tp_mlp import Shard  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        world = int(os.environ.get("MIGSCALE_GROUP_SIZE", "1"))
        addr = os.environ.get("MIGSCALE_GROUP_ADDR", "127.0.0.1:29500")
        # Blocks until every worker has joined: the model (and so the replica)
        # becomes ready only when the whole group is, as LeaderWorkerSet requires.
        self.shard = Shard(0, world, addr, os.environ.get("MIGSCALE_DIST_BACKEND"))

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        sizes = [x.shape[0] for x in xs]
        y = self.shard.lead(np.concatenate(xs, axis=0))
        out, i = [], 0
        for n in sizes:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y[i : i + n].astype(np.float32))]))
            i += n
        return out

    def finalize(self):
        self.shard.stop()
