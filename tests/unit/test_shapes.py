"""Load shapes are pure functions of time; these pin their curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtests import shapes
from loadtests.shapes import (
    Constant,
    Diurnal,
    Ramp,
    ShapeError,
    Spike,
    Step,
    TraceReplay,
    rates_at,
    shape_from_spec,
)


def test_constant_holds_and_stops_at_duration():
    s = Constant(duration_s=10, rps=7)
    assert [s.total_rps(t) for t in (0, 5, 9.99)] == [7, 7, 7]
    assert s.total_rps(10) == 0.0
    assert s.model_rps(3) is None


def test_step_levels_equal_slices():
    s = shape_from_spec("step", 40, base_rps=10, peak_rps=40, steps=4)
    assert isinstance(s, Step)
    assert [s.total_rps(t) for t in (0, 9.9, 10, 20, 39.9)] == [10, 10, 20, 30, 40]


def test_step_explicit_levels():
    s = shape_from_spec("step", 30, levels="5;50;5")
    assert [s.total_rps(t) for t in (1, 11, 21)] == [5, 50, 5]


def test_ramp_linear_then_hold():
    s = shape_from_spec("ramp", 100, base_rps=0, peak_rps=100, ramp_s=50)
    assert isinstance(s, Ramp)
    assert s.total_rps(0) == 0
    assert s.total_rps(25) == pytest.approx(50)
    assert s.total_rps(75) == pytest.approx(100)


def test_spike_default_window_is_middle_fifth():
    s = shape_from_spec("spike", 120, base_rps=10, peak_rps=100)
    assert isinstance(s, Spike)
    assert s.window == (48.0, 72.0)
    assert s.total_rps(47.9) == 10
    assert s.total_rps(48) == 100
    assert s.total_rps(71.9) == 100
    assert s.total_rps(72) == 10


def test_spike_explicit_window():
    s = shape_from_spec("spike", 60, base_rps=1, peak_rps=9, spike_at_s=5, spike_s=2)
    assert [s.total_rps(t) for t in (4.9, 5, 6.9, 7)] == [1, 9, 9, 1]


def test_diurnal_trough_and_crest():
    s = shape_from_spec("diurnal", 100, base_rps=10, peak_rps=30)
    assert isinstance(s, Diurnal)
    assert s.total_rps(0) == pytest.approx(10)
    assert s.total_rps(50) == pytest.approx(30)
    assert s.total_rps(25) == pytest.approx(20)
    # symmetric around the crest
    assert s.total_rps(40) == pytest.approx(s.total_rps(60))


def test_peak_defaults_to_four_times_base():
    s = shape_from_spec("ramp", 10, base_rps=5)
    assert s.total_rps(9.999) == pytest.approx(20, rel=1e-3)


def test_trace_replay_step_interpolation(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("t_s,model,rps\n0,a,10\n0,b,1\n10,a,20\n20,b,5\n")
    s = shape_from_spec("trace", 0, path=str(p))
    assert isinstance(s, TraceReplay)
    assert s.models == ["a", "b"]
    # last row at 20 s held for one sample period (the most common spacing, 10 s)
    assert s.duration_s == 30
    assert s.model_rps(0) == {"a": 10, "b": 1}
    assert s.model_rps(9.99) == {"a": 10, "b": 1}
    assert s.model_rps(10) == {"a": 20, "b": 1}
    assert s.model_rps(25) == {"a": 20, "b": 5}
    assert s.total_rps(25) == 25
    assert s.total_rps(30) == 0


def test_trace_model_absent_before_first_row():
    s = TraceReplay.from_rows([(0, "a", 4), (5, "b", 6)], duration_s=20)
    assert s.model_rps(1) == {"a": 4, "b": 0}
    assert s.model_rps(5) == {"a": 4, "b": 6}


def test_trace_speedup_compresses_time():
    s = TraceReplay.from_rows([(0, "a", 1), (100, "a", 2)], speedup=10)
    assert s.duration_s == pytest.approx(20)  # (100 + 100) / 10
    assert s.model_rps(9.9)["a"] == 1
    assert s.model_rps(10)["a"] == 2


def test_rates_at_splits_by_weights_unless_trace_knows():
    s = Constant(duration_s=10, rps=100)
    assert rates_at(s, 1, {"a": 3, "b": 1}) == {"a": 75, "b": 25}
    t = TraceReplay.from_rows([(0, "a", 4), (0, "b", 6)], duration_s=10)
    assert rates_at(t, 1, {"a": 100}) == {"a": 4, "b": 6}


@pytest.mark.parametrize(
    "args, field",
    [
        (("nope", 10), "shape"),
        (("constant", 0), "duration_s"),
        (("constant", 10, -1), "base_rps"),
        (("constant", 10, float("nan")), "base_rps"),
    ],
)
def test_bad_specs_name_the_field(args, field):
    with pytest.raises(ShapeError) as e:
        shape_from_spec(*args)
    assert field in str(e.value)


def test_unknown_shape_arg_is_an_error():
    with pytest.raises(ShapeError, match="spike_at"):
        shape_from_spec("ramp", 10, spike_at_s=3)


def test_non_numeric_shape_arg():
    with pytest.raises(ShapeError, match=r"shape-args.spike_s: must be a number, got 'x'"):
        shape_from_spec("spike", 10, spike_s="x")


def test_trace_errors(tmp_path):
    with pytest.raises(ShapeError, match="path"):
        shape_from_spec("trace", 10)
    bad = tmp_path / "bad.csv"
    bad.write_text("time,model,rps\n0,a,1\n")
    with pytest.raises(ShapeError, match="header must be exactly t_s,model,rps"):
        shape_from_spec("trace", 10, path=str(bad))
    bad.write_text("t_s,model,rps\n0,a,lots\n")
    with pytest.raises(ShapeError, match="line 2"):
        shape_from_spec("trace", 10, path=str(bad))
    with pytest.raises(ShapeError, match="cannot read"):
        shape_from_spec("trace", 10, path=str(tmp_path / "absent.csv"))


def test_parse_shape_args():
    assert shapes.parse_shape_args("spike_at_s=3, spike_s=2") == {"spike_at_s": "3", "spike_s": "2"}
    assert shapes.parse_shape_args("") == {}
    with pytest.raises(ShapeError, match="key=value"):
        shapes.parse_shape_args("oops")


def test_shapes_are_callable_and_finite():
    for name in ("constant", "step", "ramp", "spike", "diurnal"):
        s = shape_from_spec(name, 60, base_rps=3, peak_rps=9)
        for t in range(0, 60, 7):
            v = s(t)
            assert math.isfinite(v) and 3 - 1e-9 <= v <= 9 + 1e-9
        assert s(60) == 0.0
        assert isinstance(s, shapes.Shape)


def test_plan_users_paces_each_user_to_hit_the_total():
    assert shapes.plan_users(95, 10, 500) == (10, 9.5)
    assert shapes.plan_users(10, 10, 500) == (1, 10)
    # capped: each of the 4 users is asked for 25 req/s
    assert shapes.plan_users(100, 10, 4) == (4, 25)
    # no load: one idle user
    assert shapes.plan_users(0, 10, 4) == (1, 0.0)


def test_trace_period_is_the_most_common_spacing():
    rows = [(0, "a", 1), (60, "a", 2), (120, "a", 3), (150, "a", 4), (210, "a", 5)]
    assert TraceReplay.from_rows(rows).duration_s == 270


@pytest.mark.parametrize("text", [
    "t_s,model,rps\n0,a,5\n",  # one time: one per-minute sample in both
    "t_s,model,rps\n0,a,5\n30,b,2\n60,a,1\n90,a,0\n150,b,7\n",  # a model starting late, irregular spacing
])
def test_a_load_test_replays_the_curve_the_simulator_reads(tmp_path, text):
    from autoscaler.sim.traces import read_csv

    path = tmp_path / "t.csv"
    path.write_text(text)
    sim = read_csv(path)
    replay = shape_from_spec("trace", 0, path=str(path))
    assert replay.duration_s == sim.duration_s
    for t in np.arange(0, sim.duration_s, 7.5):
        k = int(np.searchsorted(sim.t_s, t, side="right")) - 1
        want = {m: float(sim.rps[i, k]) for i, m in enumerate(sim.models)}
        got = replay.model_rps(float(t)) or {}
        assert {m: got.get(m, 0.0) for m in want} == want, t


def test_a_load_test_refuses_what_the_simulator_refuses(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t_s,model,rps\n0,Resnet,5\n0,a,nan\n")
    with pytest.raises(ShapeError) as e:
        shape_from_spec("trace", 0, path=str(path))
    assert "model: must be a DNS-1035 label (a model name), got 'Resnet'" in str(e.value)
    assert "line 3: rps: must be a number from 0 to 1,000,000,000 req/s, got 'nan'" in str(e.value)
