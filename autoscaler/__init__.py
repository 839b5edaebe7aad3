"""migscale: an inference-serving autoscaler for NVIDIA Triton on MIG slices.

The package is split the way the control loop runs (README, "Architecture"):
``mig/`` and ``policy/`` are the pure core (zero I/O), ``observe/`` and ``act/``
are the adapters at the edges, ``loop.py`` ties one tick together, ``api/``
exports what the HPA reads, and ``sim/`` replays traces through the same core.
"""

__version__ = "0.1.0"
