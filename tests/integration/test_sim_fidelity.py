"""Simulator fidelity against the real local cluster (real tritonserver replicas, nginx, Prometheus).

The same step load (18 s low, then 36 s high: the fall only matters for the
scale-down, which the benchmark compares; the low phase only has to outlast
the 6 s metrics window) runs through the front
door of a ``LocalCluster`` driven by the production ``ControlLoop`` and
through ``SimCluster`` with the local backend's delays. The simulator must
predict when the loop scales up (within 20% or 10 s) and how far (peak
replica count within one). The full comparison, p99 included, is
``benchmarks/fidelity.py``. Everything on 127.0.0.1; stopped in finally.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.alone]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_simulator_predicts_the_real_scale_up(tmp_path):
    import fidelity as fid

    shape = fid.Step(duration_s=54.0, levels=(12.0, 70.0, 70.0))
    # 300 requests a profile point, as test_profile's Poisson search: each point waits for
    # its requests, so the benchmark's 500 would make the profile most of this test's time
    real = fid.run_real(shape, tmp_path / "run", open_requests=300)
    assert 0 < real["poisson_capacity_rps"] < real["saturation_rps"], real
    curves = fid.service_curves(real["poisson_points"], real["saturation_rps"])
    assert curves["1g.10gb"].shape > 1.0, curves  # a batcher's sojourn: narrower than exponential
    sim = fid.run_sim(shape, start_delay_s=real["start_s"],
                      service_rps=fid.service_rates(real["poisson_capacity_rps"]), curves=curves)
    out = fid.compare(shape, real, sim)
    assert out["requests"]["sent"] > 0
    r_up, s_up = out["first_scale_up_s"]["real"], out["first_scale_up_s"]["sim"]
    assert r_up is not None and s_up is not None, out
    assert abs(r_up - s_up) <= max(10.0, 0.2 * r_up), out
    assert abs(out["replicas_max"]["real"] - out["replicas_max"]["sim"]) <= 1, out
