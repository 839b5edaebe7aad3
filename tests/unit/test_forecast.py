"""The predictive floor's parts on synthetic series: forecaster (level, trend, daily season)
and the learned headroom (a quantile of how far demand rose above the forecast)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaler.policy import forecast as fc

DAY = 86400.0


def feed(ts, ys, cfg=None):
    cfg = cfg or fc.ForecastConfig()
    f = fc.Forecast()
    for t, y in zip(ts, ys):
        f = fc.update(f, float(t), float(y), cfg)
    return f


def test_constant_series_forecasts_itself_at_every_horizon():
    f = feed(np.arange(0, 3600, 5), [120.0] * 720)
    for h in (0, 60, 600):
        assert fc.predict(f, h) == pytest.approx(120.0, rel=1e-9)


def test_a_ramp_is_extrapolated_with_a_damped_trend():
    # 100 req/s rising 0.5 req/s per second: in 60 s it is 30 req/s higher
    ts = np.arange(0, 1800, 5)
    f = feed(ts, 100 + 0.5 * ts)
    now = 100 + 0.5 * ts[-1]
    ahead = fc.predict(f, 60)
    # the level lags a ramp by about slope x level_tau (15 req/s); the trend makes up most of it
    assert now + 5 < ahead < now + 35
    # damped: however far ahead, the trend adds at most slope x damp_s (+ the lag it corrects)
    assert fc.predict(f, 3600) < now + 0.5 * fc.ForecastConfig().damp_s + 20


def test_a_smooth_daily_cycle_is_followed_within_a_few_percent():
    rng = np.random.default_rng(0)
    ts = np.arange(0, 2 * DAY, 10.0)
    truth = 200 + 120 * np.sin(2 * np.pi * ts / DAY)
    f, errs = fc.Forecast(), []
    for k, (t, y) in enumerate(zip(ts, truth * rng.gamma(400, 1 / 400, size=len(ts)))):
        if k > 360 and k % 30 == 0:
            errs.append(abs(fc.predict(f, 120) - (200 + 120 * math.sin(2 * math.pi * (t + 110) / DAY))))
        f = fc.update(f, t, y)
    assert np.mean(errs) / 200 < 0.03


def test_a_rise_that_comes_every_day_is_forecast_before_it_arrives():
    # 100 req/s, tripled from 09:00 to 10:00 every day; per-minute samples
    cfg = fc.ForecastConfig()
    ts = np.arange(0, 3 * DAY, 60.0)
    hour = (ts % DAY) / 3600
    ys = np.where((hour >= 9) & (hour < 10), 300.0, 100.0)
    t_before = 2 * DAY + 9 * 3600 - 180  # day 3, 08:57
    k = int(t_before / 60)
    f = feed(ts[: k + 1], ys[: k + 1], cfg)
    assert fc.predict(f, 0) == pytest.approx(100, rel=0.02)
    # five minutes ahead lies in 09:00-09:05: the season from days 1 and 2 says 3x
    assert fc.predict(f, 300, cfg) == pytest.approx(300, rel=0.1)
    assert fc.envelope(f, 300, cfg) == pytest.approx(300, rel=0.1)
    # on day 1 there is no earlier day: no season, no premature rise
    g = feed(ts[: int((9 * 3600 - 180) / 60) + 1], ys[: int((9 * 3600 - 180) / 60) + 1], cfg)
    assert fc.predict(g, 300, cfg) == pytest.approx(100, rel=0.02)


def _job_series(hours, period_s=900.0, run_s=180.0, base=100.0, job=400.0, step=5.0, seed=0, stop_s=None):
    """A timer-triggered job: ``job`` req/s for ``run_s`` every ``period_s``, over ``base``, 5% noise."""
    rng = np.random.default_rng(seed)
    ts = np.arange(0, hours * 3600, step)
    on = (ts % period_s) < run_s
    if stop_s is not None:
        on &= ts < stop_s
    return ts, np.where(on, job, base) * rng.gamma(400, 1 / 400, size=len(ts))


def test_a_job_that_repeats_every_15_minutes_is_found_and_forecast_before_it_runs():
    ts, ys = _job_series(3)
    f, before, during = fc.Forecast(), [], []
    for t, y in zip(ts, ys):
        f = fc.update(f, t, y)
        phase = t % 900
        if t > 2 * 3600 and 840 <= phase < 860:  # 40-60 s before a run
            o = fc.outlook(f, 60)
            assert o.recurring == fc.recurring(f, 60)
            before.append((o.envelope, fc.predict(f, 60), o.recurring))
        if t > 2 * 3600 and 60 <= phase < 120:  # a run under way
            during.append(fc.envelope(f, 60))
    assert fc.cycle(f) == 900
    # before each run the floor already holds it; the smooth forecast alone does not
    assert all(e >= 0.8 * 400 for e, _, _ in before)
    assert all(p < 0.5 * 400 for _, p, _ in before)
    # and it is the recurring rise that holds it, named beside the envelope
    assert all(r is not None and e == r for e, _, r in before)
    # while it runs the rise is not counted twice on top of the level it brought
    assert max(during) < 1.3 * 400


def test_no_period_in_noise_or_in_a_single_burst():
    rng = np.random.default_rng(3)
    ts = np.arange(0, 6 * 3600, 5.0)
    # heavy-tailed noise with a minute of memory: no period
    x = np.zeros(len(ts))
    for i in range(1, len(ts)):
        x[i] = 0.92 * x[i - 1] + 0.15 * rng.standard_t(2.5)
    assert fc.cycle(feed(ts, 100 * np.exp(x))) is None
    # one burst of 5x for 10 minutes: it does not repeat
    ys = np.where((ts > 3600) & (ts < 4200), 500.0, 100.0) * rng.gamma(400, 1 / 400, size=len(ts))
    f = feed(ts, ys)
    assert fc.cycle(f) is None
    assert fc.envelope(f, 60) < 130


def test_a_job_is_not_expected_before_three_cycles_nor_after_it_stops():
    ts, ys = _job_series(4, period_s=1200.0, run_s=240.0, stop_s=2.5 * 3600)
    f, early, after = fc.Forecast(), [], []
    for t, y in zip(ts, ys):
        f = fc.update(f, t, y)
        if 1140 * 1 <= t % 1200 < 1160:
            if t < 2 * 1200:
                early.append(fc.envelope(f, 60))
            if t > 2.5 * 3600 + 2 * 1200:  # two skipped runs later
                after.append(fc.envelope(f, 60))
    assert early and max(early) < 130  # two cycles seen: too few to call it a period
    assert after and max(after) < 130  # the last two cycles did not rise: nothing is expected


def test_recurring_memory_is_bounded():
    cfg = fc.ForecastConfig()
    ts, ys = _job_series(8, step=15.0)
    f = feed(ts, ys)
    assert len(f.cyc) == int(cfg.cycle_memory_s / cfg.cycle_bin_s)


def test_detect_period_prefers_the_period_to_its_multiples():
    # changes every 10 min, with a second, weaker job on the hour: 10 min is the period
    cfg = fc.ForecastConfig()
    t = np.arange(0, 5 * 3600, cfg.cycle_bin_s)
    bins = 100 + 300 * ((t % 600) < 120) + 50 * ((t % 3600) < 120)
    assert fc.detect_period(tuple(float(b) for b in bins), cfg) * cfg.cycle_bin_s == 600


def test_the_same_sample_twice_changes_nothing():
    f = feed([0, 5, 10], [10, 20, 30])
    assert fc.update(f, 10.0, 999.0) == f


def test_forecast_before_any_sample_is_none():
    assert fc.predict(fc.Forecast(), 30) is None
    assert fc.envelope(fc.Forecast(), 30) is None


# ------------------------------------------------------------------ headroom


def run_headroom(maxima, horizon=60.0, forecast=100.0, cfg=None):
    """One sample per minute; within each horizon the highest rate is ``forecast * m``."""
    cfg = cfg or fc.HeadroomConfig()
    h = fc.Headroom()
    t = 0.0
    for m in maxima:
        h = fc.observe(h, t, forecast, forecast, horizon, cfg)  # opens a sample at t
        h = fc.observe(h, t + 30, forecast * m, None, horizon, cfg)  # the peak inside it
        t += 60.0
    return fc.observe(h, t, forecast, None, horizon, cfg)


def test_headroom_is_the_quantile_of_the_rise_over_the_forecast():
    maxima = [1.0 + 0.01 * i for i in range(100)]  # rises of 0% .. 99%, evenly
    h = run_headroom(maxima, cfg=fc.HeadroomConfig(quantile=0.95))
    assert len(h.ratios) == 100
    assert h.value == pytest.approx(0.9405, abs=1e-9)  # numpy's linear quantile of 1.00..1.99
    assert h.value == pytest.approx(np.quantile(maxima, 0.95) - 1, abs=1e-9)
    assert fc.current(h) == h.value


def test_headroom_uses_the_prior_until_enough_samples():
    cfg = fc.HeadroomConfig(prior=0.2, min_samples=30)
    h = run_headroom([1.5] * 29, cfg=cfg)
    assert h.value is None and fc.current(h, cfg) == 0.2
    h = run_headroom([1.5] * 30, cfg=cfg)
    assert fc.current(h, cfg) == pytest.approx(0.5)


def test_headroom_is_bounded():
    cfg = fc.HeadroomConfig(lo=0.05, hi=1.5, min_samples=5)
    assert run_headroom([10.0] * 10, cfg=cfg).value == 1.5  # a 10x crowd is the burst layer's job
    assert run_headroom([0.5] * 10, cfg=cfg).value == 0.05  # demand below the forecast: still lo


def test_old_samples_leave_the_window():
    cfg = fc.HeadroomConfig(window_s=3600.0, min_samples=10)
    h = run_headroom([2.0] * 60 + [1.1] * 60, cfg=cfg)  # an hour of 2x rises, then an hour of 10%
    assert all(r == pytest.approx(1.1) for _, r in h.ratios)
    assert h.value == pytest.approx(0.1)


def test_a_sample_closes_only_after_its_horizon():
    h = fc.observe(fc.Headroom(), 0.0, 100.0, 100.0, 90.0)
    h = fc.observe(h, 60.0, 180.0, None, 90.0)
    assert h.ratios == () and h.open[0][2] == 180.0
    h = fc.observe(h, 90.0, 100.0, None, 90.0)
    assert h.ratios == ((90.0, 1.8),) and h.open == ()


def test_quantile_matches_numpy():
    rng = np.random.default_rng(3)
    xs = sorted(rng.lognormal(size=57).tolist())
    for q in (0.0, 0.5, 0.9, 0.95, 0.99, 1.0):
        assert fc.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
