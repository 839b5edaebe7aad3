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
