"""Valid inference inputs for any Triton model, built from what the server says about it.

Used by the locust users (``loadtests/triton_user.py``) and by ``migscale profile``
(``autoscaler/runtime/profile.py``): both send traffic *into* the loop's observed system
and must not hard-code a model's tensors. The model's metadata gives names,
datatypes and shapes; its config gives ``max_batch_size`` (> 0 means the first
metadata dim is the batch dim, reported as -1). No locust import here, so the
profiler and unit tests can use it without gevent's monkey-patching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # Triton datatype: FP32, INT64, BYTES, ...
    shape: tuple[int, ...]  # as the server reports it; -1 = variable


@dataclass(frozen=True)
class ModelIO:
    model: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]

    def concrete_shape(self, spec: TensorSpec, batch: int = 1, dynamic_dim: int = 16) -> list[int]:
        """Replace -1 dims: the batch dim gets ``batch``; any other variable dim gets ``dynamic_dim``
        (16 tokens for a BERT-like sequence input: small enough to be cheap, not degenerate)."""
        dims = list(spec.shape)
        out = []
        for i, d in enumerate(dims):
            if d >= 0:
                out.append(d)
            elif i == 0 and self.max_batch_size > 0:
                out.append(batch)
            else:
                out.append(dynamic_dim)
        if self.max_batch_size > 0 and (not dims or dims[0] != -1):
            out = [batch] + out
        return out


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Read a field from the HTTP client's dicts or the gRPC client's protobufs alike."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def model_io(metadata: Any, config: Any, model: str) -> ModelIO:
    """From ``get_model_metadata`` and ``get_model_config`` (HTTP dicts or gRPC protobufs)."""
    cfg = _get(config, "config", config)  # gRPC wraps the config in ModelConfigResponse.config
    mbs = int(_get(cfg, "max_batch_size", 0) or 0)
    specs = tuple(
        TensorSpec(str(_get(i, "name")), str(_get(i, "datatype")), tuple(int(d) for d in _get(i, "shape", [])))
        for i in _get(metadata, "inputs", [])
    )
    outs = tuple(str(_get(o, "name")) for o in _get(metadata, "outputs", []))
    return ModelIO(model=model, max_batch_size=mbs, inputs=specs, outputs=outs)


def random_array(datatype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"migscale", dtype=np.object_)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    from tritonclient.utils import triton_to_np_dtype

    dt = np.dtype(triton_to_np_dtype(datatype))
    if dt.kind == "f":
        return rng.standard_normal(size=shape).astype(dt)
    if dt.kind in "iu":
        # token-id-like values: small, non-negative, valid for any integer width
        return rng.integers(0, 100, size=shape).astype(dt)
    raise ValueError(f"datatype: cannot build data for {datatype!r}")


def build_inputs(client_module: Any, io: ModelIO, batch: int = 1, dynamic_dim: int = 16,
                 seed: int = 0) -> list[Any]:
    """``InferInput`` objects (of ``tritonclient.http`` or ``tritonclient.grpc``) holding random data.

    They are built once and reused for every request: setting data is the costly part
    (~20 µs for a small tensor) and one locust process sends thousands per second.
    """
    rng = np.random.default_rng(seed)
    out = []
    for spec in io.inputs:
        shape = io.concrete_shape(spec, batch, dynamic_dim)
        arr = random_array(spec.datatype, shape, rng)
        inp = client_module.InferInput(spec.name, shape, spec.datatype)
        if client_module.__name__.endswith("http"):
            inp.set_data_from_numpy(arr, binary_data=True)
        else:
            inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


def requested_outputs(client_module: Any, io: ModelIO) -> list[Any] | None:
    """Binary outputs over HTTP (JSON-encoding a float tensor costs more than the inference)."""
    if not client_module.__name__.endswith("http"):
        return None
    return [client_module.InferRequestedOutput(n, binary_data=True) for n in io.outputs] or None


def fetch_model_io(client: Any, model: str) -> ModelIO:
    """Ask a running server (an ``InferenceServerClient`` of either protocol) about ``model``."""
    meta = client.get_model_metadata(model)
    cfg = client.get_model_config(model)
    return model_io(meta, cfg, model)


def response_bytes(result: Any) -> int:
    """Bytes of output payload in a response (HTTP binary sizes or gRPC raw contents)."""
    try:
        resp = result.get_response()
    except Exception:  # noqa: BLE001 - a size is informational only
        return 0
    if isinstance(resp, dict):
        total = 0
        for o in resp.get("outputs", []):
            total += int((o.get("parameters") or {}).get("binary_data_size", 0))
        return total
    return sum(len(b) for b in getattr(resp, "raw_output_contents", []))
