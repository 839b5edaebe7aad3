"""Trace families: every family is seeded, keeps each model's mean, and has the shape its docstring names.

Each shape check is paired with a family that must fail it, so a check that
passes on any trace is caught here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from autoscaler.sim import families
from autoscaler.sim import traces as tr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

MODELS = [f"m{i}" for i in range(12)]
MEANS = {m: 40.0 + 20.0 * i for i, m in enumerate(MODELS)}


def _gen(kind: str, seed: int, hours: float = 8.0) -> tr.Trace:
    return tr.generate(kind, MODELS, hours * 3600, seed=seed, mean_rps=MEANS)


@pytest.mark.parametrize("kind", sorted(families.FAMILIES))
def test_family_is_seeded_and_keeps_each_mean(kind):
    a, b, c = _gen(kind, 3), _gen(kind, 3), _gen(kind, 4)
    assert np.array_equal(a.rps, b.rps)
    assert not np.array_equal(a.rps, c.rps)
    assert a.duration_s == 8 * 3600
    assert a.t_s[1] - a.t_s[0] == tr.default_step_s(kind)
    assert (a.rps >= 0).all()
    if kind == "mixed":
        return  # its kinds (diurnal, bursty, flash, azure) keep the mean in expectation only
    got = a.rps.mean(axis=1)
    want = np.array([MEANS[m] for m in MODELS])
    # Poisson counts around a shape scaled to the mean: within 3% of it
    assert np.allclose(got, want, rtol=0.03), (kind, got / want)


def test_extra_families_are_families_beyond_the_six_and_hold_the_unseen():
    assert set(families.EXTRA_FAMILIES) <= set(families.FAMILIES)
    assert not set(families.EXTRA_FAMILIES) & {"heavytail", "flashcrowd", "onoff", "steps", "weekly", "mixed"}
    assert set(families.UNSEEN_FAMILIES) < set(families.EXTRA_FAMILIES)


def test_the_benchmark_refuses_unseen_families_on_development_seeds(capsys):
    import generalization

    assert generalization.main(["--families", "ramp", "--seeds", "4-6", "--hours", "1"]) == 2
    err = capsys.readouterr().err
    assert "'4-6'" in err and "ramp" in err and "held-out seeds only" in err


def _onsets(x: np.ndarray, step_s: float) -> np.ndarray:
    """Times the rate (30 s mean) reaches 1.6x its mean over the two minutes before, 5 min apart at least."""
    k30, k2m, gap = (max(1, round(v / step_s)) for v in (30.0, 120.0, 300.0))
    s = np.convolve(x, np.ones(k30) / k30, mode="valid")
    out: list[float] = []
    for k in range(k2m + k30, len(s)):
        if s[k] >= 1.6 * s[k - k2m - k30: k - k30].mean() and (not out or k * step_s - out[-1] >= gap * step_s):
            out.append(k * step_s)
    return np.array(out)


def _periodic_share(kind: str, seeds: range) -> float:
    """Share of models whose rises repeat on one period of 15-120 min (each gap within 2 min of it)."""
    hits = total = 0
    for seed in seeds:
        t = _gen(kind, seed)
        step = float(t.t_s[1] - t.t_s[0])
        for x in t.rps:
            total += 1
            on = _onsets(x, step)
            if len(on) < 4:
                continue
            gaps = np.diff(on)
            period = float(np.median(gaps))
            if 840 <= period <= 7300 and np.mean(np.abs(gaps - period) <= 120) >= 0.8:
                hits += 1
    return hits / total


def test_cron_jobs_repeat_on_a_schedule():
    # 70% of models carry a job; an 8 h trace shows >= 4 runs of every period up to 2 h
    assert _periodic_share("cron", range(1, 4)) >= 0.4
    assert _periodic_share("flashcrowd", range(1, 4)) <= 0.1


def test_cron_schedules_meet_on_the_hour():
    t = _gen("cron", 2)
    step = float(t.t_s[1] - t.t_s[0])
    starts = [on % 3600 for x in t.rps for on in _onsets(x, step)]
    near_hour = np.mean([(s < 60) or (s > 3540) for s in starts])
    # half the schedules start on the hour: far more onsets there than 2 min in 60 would give
    assert near_hour > 0.2


def _block_means(kind: str, seeds: range, block_s: float):
    """Each model's rate averaged over whole blocks of ``block_s``, for every seed in turn."""
    for seed in seeds:
        t = _gen(kind, seed)
        per = round(block_s / float(t.t_s[1] - t.t_s[0]))
        for x in t.rps:
            yield x[: len(x) // per * per].reshape(-1, per).mean(axis=1)


def _largest_minute_jump(kind: str, seeds: range) -> float:
    """The largest ratio between consecutive 1-minute means, after a 5-minute running median."""
    worst = 1.0
    for m in _block_means(kind, seeds, 60.0):
        sm = np.array([np.median(m[max(0, i - 2): i + 3]) for i in range(len(m))])
        r = sm[1:] / np.maximum(sm[:-1], 1e-9)
        worst = max(worst, float(np.max(np.maximum(r, 1.0 / np.maximum(r, 1e-9)))))
    return worst


def _level_range(kind: str, seeds: range) -> float:
    """The largest ratio of a model's highest to lowest hourly mean."""
    return max(float(h.max() / max(h.min(), 1e-9)) for h in _block_means(kind, seeds, 3600.0))


def test_ramp_moves_far_but_never_jumps():
    assert _level_range("ramp", range(1, 4)) > 3.0
    assert _largest_minute_jump("ramp", range(1, 4)) < 1.4
    # a step change of the same size jumps within a minute
    assert _largest_minute_jump("steps", range(1, 4)) > 2.0


def _fleet_wide_rise(kind: str, seed: int) -> float:
    """The largest share of models whose 5-minute mean is >= 1.3x their own 15 minutes earlier,
    over every 5-minute block of the trace: how many models rise together."""
    five = np.array(list(_block_means(kind, range(seed, seed + 1), 300.0)))  # models x 5-min blocks
    rose = five[:, 3:] >= 1.3 * five[:, :-3]
    return float(rose.mean(axis=0).max())


def test_failover_lifts_most_models_at_once():
    shares = [_fleet_wide_rise("failover", s) for s in range(1, 6)]
    assert min(shares) >= 0.5 and np.mean(shares) >= 0.7, shares
    # a flash crowd lifts one to four models of twelve (two may overlap)
    assert np.mean([_fleet_wide_rise("flashcrowd", s) for s in range(1, 6)]) <= 0.4
