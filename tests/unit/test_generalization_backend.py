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


@pytest.mark.parametrize("gap", [10.0, 20.0])
def test_slower_rounds_change_only_the_fast_paths_schedule(monkeypatch, gap):
    """Rounds ``gap`` apart are the simulator's ``fast_gap_s``; Prometheus's path is untouched and
    the HPA baselines, which never read the fast path, run in the same world."""
    import generalization as g

    calls = _capture(monkeypatch)
    out = g.run_one(("steps", 1, 0.1, "migscale", 0.9, None, False, "kubernetes", gap))
    g.run_one(("steps", 1, 0.1, "hpa-util", 0.7, None, False, "kubernetes", gap))
    mig, hpa = calls
    assert out["fast_gap_s"] == gap and mig["sim"].fast_gap_s == gap
    plain = SimConfig(step_s=mig["sim"].step_s)
    assert (mig["sim"].fast_window_s, mig["sim"].scrape_delay_s) == (plain.fast_window_s, plain.scrape_delay_s)
    assert hpa["sim"] == mig["sim"] and "policy_overrides" not in hpa


def test_a_slower_round_is_a_world_the_burst_layer_reads_differently():
    """A real (short) flash crowd: rounds 20 s apart reach migscale's burst layer later than
    rounds every second, and its run differs; without the path there is nothing to slow."""
    import generalization as g

    fresh = g.run_one(("flashcrowd", 1, 0.5, "migscale", 0.9, None, False, "kubernetes"))
    slow = g.run_one(("flashcrowd", 1, 0.5, "migscale", 0.9, None, False, "kubernetes", 20.0))
    assert (fresh["attainment"], fresh["gpu_hours"]) != (slow["attainment"], slow["gpu_hours"])
    gapped, plain = (g.run_one(("flashcrowd", 1, 0.5, "migscale", 0.9, None, False, "kubernetes-no-fast", *gap))
                     for gap in ((20.0,), ()))
    assert (gapped["attainment"], gapped["gpu_hours"]) == (plain["attainment"], plain["gpu_hours"])


@pytest.mark.parametrize("argv", [["--fast-gap", "0.5"], ["--fast-gap", "nan"], ["--fast-gap", "5"],
                                  ["--fast-gap", "10", "--backend", "kubernetes-no-fast"]])
def test_a_fast_gap_without_a_fast_path_or_within_the_simulators_step_is_refused(monkeypatch, capsys, argv):
    """Rounds at most the 5 s step apart read what every-second rounds read: refused, not run."""
    import generalization as g

    _capture(monkeypatch)
    assert g.main(["--families", "steps", "--seeds", "1", "--hours", "0.1", "--no-frontier", *argv]) == 2
    assert "--fast-gap" in capsys.readouterr().err
