"""Batch plumbing shared by the example Python-backend models.

Triton's dynamic batcher hands ``execute`` a list of requests; each carries
its own leading batch dimension. We stack them into one array, run the
model's numpy function once, split the result back per request and then pad
the whole batch to the emulated slice time (``migscale_emulation``), so one
emulated "kernel launch" covers the whole dynamic batch as it would on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Python backend stub
from migscale_emulation import Emulator


def execute_batched(
    requests: list,
    input_name: str,
    output_name: str,
    fn: Callable[[np.ndarray], np.ndarray],
    emulator: Emulator,
) -> list:
    started = time.perf_counter()
    arrays = [pb_utils.get_input_tensor_by_name(r, input_name).as_numpy() for r in requests]
    sizes = [a.shape[0] for a in arrays]
    out = fn(np.concatenate(arrays, axis=0))
    responses = []
    offset = 0
    for n in sizes:
        t = pb_utils.Tensor(output_name, np.ascontiguousarray(out[offset : offset + n]))
        responses.append(pb_utils.InferenceResponse(output_tensors=[t]))
        offset += n
    emulator.pad(sum(sizes), started)
    return responses
