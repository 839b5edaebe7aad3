"""``benchmarks/generalization.py --backend``: the worlds as the Kubernetes backend runs them.

The Kubernetes controller tells the policy that a repartition drains the node
(``RepartitionScope.NODE``: no warm spares) and scrapes its pods each second unless told not to
(``--no-fast-scrape``: no fast signals). The benchmark's ``kubernetes`` world must take the first
away from migscale, ``kubernetes-no-fast`` both, and neither anything from the HPA baselines,
which use neither.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoscaler.policy.types import RepartitionScope
from autoscaler.sim.records import SimConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _capture(monkeypatch) -> list[dict]:
    from autoscaler.sim import run

    calls: list[dict] = []

    def fake(models, cluster, trace, policy, step_s, *, sim, **kw):
        calls.append({"policy": policy, "sim": sim, **kw})
        return SimpleNamespace(slo_attainment=0.99, gpu_hours=1.0, slice_hours=7.0, per_model={}, errors=[],
                               timeline=None)

    monkeypatch.setattr(run, "simulate", fake)
    return calls


@pytest.mark.parametrize("backend", ["sim", "kubernetes", "kubernetes-no-fast"])
def test_migscale_loses_gpu_scope_cuts_on_kubernetes_and_fast_signals_only_without_the_scrape(
        monkeypatch, backend):
    import generalization as g

    calls = _capture(monkeypatch)
    out = g.run_one(("steps", 1, 0.1, "migscale", 0.9, None, False, backend))
    (call,) = calls
    assert out["backend"] == backend
    assert call["policy_overrides"]["headroom_quantile"] == 0.9
    if backend == "kubernetes-no-fast":
        assert call["sim"].fast_window_s is None
    else:
        assert call["sim"].fast_window_s == SimConfig().fast_window_s is not None
    if backend == "sim":
        assert "repartition_scope" not in call["policy_overrides"]
    else:
        assert call["policy_overrides"]["repartition_scope"] is RepartitionScope.NODE


def test_the_baselines_run_alike_in_both_worlds_but_for_the_fast_path_they_never_read(monkeypatch):
    import generalization as g

    calls = _capture(monkeypatch)
    for backend in ("sim", "kubernetes", "kubernetes-no-fast"):
        g.run_one(("steps", 1, 0.1, "hpa-util", 0.7, None, False, backend))
    sim, kube, slow = calls
    assert not any("policy_overrides" in c for c in calls)
    assert sim["baseline_target"] == kube["baseline_target"] == slow["baseline_target"] == 0.7
    assert slow["sim"].fast_window_s is None and sim["sim"] == kube["sim"]


def test_hpa_baseline_results_are_the_same_in_both_worlds():
    """Real (short) simulations: the HPA baseline reads no fast signals, so taking them away
    changes nothing; migscale's burst layer reads them, so its run differs."""
    import generalization as g

    got = {b: g.run_one(("flashcrowd", 1, 0.5, "hpa-util", 0.7, None, False, b))
           for b in ("sim", "kubernetes-no-fast")}
    assert got["sim"]["attainment"] == got["kubernetes-no-fast"]["attainment"]
    assert got["sim"]["gpu_hours"] == got["kubernetes-no-fast"]["gpu_hours"]
    mig = {b: g.run_one(("flashcrowd", 1, 0.5, "migscale", 0.9, None, False, b))
           for b in ("sim", "kubernetes-no-fast")}
    assert (mig["sim"]["attainment"], mig["sim"]["gpu_hours"]) != (mig["kubernetes-no-fast"]["attainment"],
                                                                   mig["kubernetes-no-fast"]["gpu_hours"])


def test_an_unknown_backend_is_refused(monkeypatch, capsys):
    import generalization as g

    _capture(monkeypatch)
    with pytest.raises(ValueError, match="backend"):
        g.run_one(("steps", 1, 0.1, "migscale", 0.9, None, False, "slurm"))
    with pytest.raises(SystemExit) as e:
        g.main(["--backend", "slurm"])
    assert e.value.code == 2
    assert "--backend" in capsys.readouterr().err
