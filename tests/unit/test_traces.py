"""Traces: CSV format and validation, seeded generators, the `migscale trace` command."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.sim import traces as tr
from autoscaler.sim.kinds import gamma_interarrivals

MODELS = ["resnet", "bert", "vit", "gpt"]


def test_csv_round_trip(tmp_path):
    t = tr.generate("mixed", MODELS, 3 * 3600, seed=3, mean_rps=50)
    p = tmp_path / "t.csv"
    tr.write_csv(t, p)
    back = tr.read_csv(p)
    assert back.models == t.models
    assert np.array_equal(back.t_s, t.t_s)
    assert back.duration_s == t.duration_s == 3 * 3600
    assert np.allclose(back.rps, t.rps, rtol=1e-5)


def test_same_seed_same_bytes_other_seed_differs():
    a = tr.write_csv(tr.generate("azure", MODELS, 6 * 3600, seed=7))
    b = tr.write_csv(tr.generate("azure", MODELS, 6 * 3600, seed=7))
    c = tr.write_csv(tr.generate("azure", MODELS, 6 * 3600, seed=8))
    assert a == b
    assert a != c


@pytest.mark.parametrize(
    "text, needle",
    [
        ("t,model,rps\n0,a,1\n", "header must be exactly t_s,model,rps"),
        ("t_s,model,rps\nzero,a,1\n", "line 2: t_s: must be a finite number >= 0, got 'zero'"),
        ("t_s,model,rps\n0,a,-3\n", "line 2: rps: must be a number from 0 to 1,000,000,000 req/s, got '-3'"),
        ("t_s,model,rps\n0,a,nan\n", "line 2: rps: must be a number from 0 to 1,000,000,000 req/s, got 'nan'"),
        ("t_s,model,rps\n0,Bad_Name,1\n", "line 2: model: must be a DNS-1035 label (a model name), got 'Bad_Name'"),
        ("t_s,model,rps\n0,a,1\n0,a,2\n", "line 3: t_s: duplicate time 0 for model 'a'"),
        ("t_s,model,rps\n0,a\n", "line 2: expected 3 fields"),
        ("t_s,model,rps\n", "no data rows"),
        ("", "empty file"),
    ],
)
def test_bad_csv_names_line_field_and_value(text, needle):
    with pytest.raises(tr.TraceError) as exc:
        tr.parse_csv(text, source="x.csv")
    assert any(needle in p for p in exc.value.problems), exc.value.problems


def test_rate_holds_until_next_row_and_ends_one_period_later():
    t = tr.parse_csv("t_s,model,rps\n0,a,10\n60,a,20\n120,a,5\n30,b,7\n")
    assert t.rate_at("a", 59.9) == 10 and t.rate_at("a", 60) == 20
    assert t.rate_at("b", 10) == 0.0 and t.rate_at("b", 45) == 7
    # spacing between timestamps: 30 s is the most common -> ends at 150
    assert t.duration_s == 150
    assert t.rate_at("a", 150) == 0.0


def test_on_grid_preserves_requests():
    t = tr.generate("bursty", MODELS, 7200, seed=1, mean_rps=80, step_s=60)
    for step in (5.0, 7.0, 45.0):
        starts, rps = t.on_grid(step)
        widths = np.diff(np.append(starts, t.duration_s))
        assert (rps * widths).sum() == pytest.approx(t.total_requests(), rel=1e-9)


def test_diurnal_mean_and_daily_swing():
    t = tr.generate("diurnal", ["a"], 86400, seed=2, mean_rps=200)
    r = t.rps[0]
    assert np.mean(r) == pytest.approx(200, rel=0.03)
    # trough 25% of peak by construction; Poisson noise is tiny at 12k/min
    assert r.min() / r.max() == pytest.approx(0.25, abs=0.05)


def test_gamma_interarrivals_have_requested_cv():
    rng = np.random.default_rng(0)
    x = gamma_interarrivals(rng, mean_s=2.0, cv=1.5, n=200_000)
    assert x.mean() == pytest.approx(2.0, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(1.5, rel=0.03)


def test_bursty_is_bursty_and_flash_has_a_crowd():
    b = tr.generate("bursty", ["a"], 86400, seed=4, mean_rps=100).rps[0]
    d = tr.generate("diurnal", ["a"], 86400, seed=4, mean_rps=100).rps[0]
    assert b.max() / b.mean() > 2.5 > d.max() / d.mean()
    f = tr.generate("flash", ["a"], 86400, seed=4, mean_rps=100).rps[0]
    assert f.max() / np.median(f) > 3.5


def test_azure_like_statistics():
    names = [f"f{i}" for i in range(12)]
    t = tr.generate("azure", names, 7 * 86400, seed=11, mean_rps=100)
    means = t.rps.mean(axis=1)
    assert means.max() / means.min() > 100  # heavy-tailed popularity, orders of magnitude
    # weekly cycle: days 5 and 6 are quieter
    day = (t.t_s // 86400).astype(int) % 7
    total = t.rps.sum(axis=0)
    assert total[day >= 5].mean() < 0.8 * total[day < 5].mean()
    # per-minute counts are over-dispersed (variance > mean: inter-arrival CV > 1)
    counts = t.rps[0] * 60
    hour = (t.t_s // 3600).astype(int)
    disp = [counts[hour == h].var() / counts[hour == h].mean() for h in range(24)]
    assert np.median(disp) > 1.5


def test_generator_rejects_bad_arguments():
    with pytest.raises(tr.TraceError) as exc:
        tr.generate("monthly", ["Bad"], 10, seed=0, step_s=60)
    text = " | ".join(exc.value.problems)
    assert "kind: must be one of" in text and "'monthly'" in text
    assert "'Bad' is not a DNS-1035 label" in text
    assert "duration_s: must be at least one step" in text


def test_a_trace_is_bounded_in_span_points_and_bytes(tmp_path):
    # a mistyped input is a clear error, not hours of simulation or all the memory
    with pytest.raises(tr.TraceError, match=r"--duration: must be at most 31d, got '10000000h'"):
        tr.parse_duration("10000000h", "--duration")
    with pytest.raises(tr.TraceError, match=r"duration_s: must be at most 31d"):
        tr.generate("diurnal", ["a"], tr.MAX_DURATION_S + 60, seed=0)
    with pytest.raises(tr.TraceError, match=r"step_s: .* over 1000000 samples; a step of at least 2.68 s"):
        tr.generate("diurnal", ["a"], tr.MAX_DURATION_S, seed=0, step_s=0.1)
    assert len(tr.generate("diurnal", ["a"], 2 * 86400, seed=0, step_s=60).t_s) == 2880
    with pytest.raises(tr.TraceError, match=r"the last row is at 1e\+09 s; a trace may span at most 31d"):
        tr.parse_csv("t_s,model,rps\n0,a,1\n1e9,a,2\n")
    with pytest.raises(tr.TraceError, match="1000001 distinct times"):
        tr.parse_csv("t_s,model,rps\n" + "".join(f"{i / 1000},a,1\n" for i in range(tr.MAX_SAMPLES + 1)))
    big = tmp_path / "big.csv"
    with big.open("wb") as f:  # sparse: no disk is used
        f.truncate(tr.MAX_FILE_BYTES + 1)
    with pytest.raises(tr.TraceError, match="over the 256 MiB a trace may have"):
        tr.read_csv(big)


def test_cli_generate_and_show(tmp_path):
    out = tmp_path / "trace.csv"
    runner = CliRunner()
    res = runner.invoke(app, ["trace", "generate", "flash", "--models", "a,b", "--duration", "2h", "--seed", "5",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert tr.read_csv(out).models == ("a", "b")
    res = runner.invoke(app, ["trace", "show", str(out), "--json"])
    assert res.exit_code == 0 and '"duration_s": 7200' in res.output


def test_cli_bad_input_exits_2_without_traceback(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["trace", "generate", "nope", "--models", "a"])
    assert res.exit_code == 2
    assert "kind: must be one of" in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,model,rps\n0,a,-1\n")
    res = runner.invoke(app, ["trace", "show", str(bad)])
    assert res.exit_code == 2 and "line 2: rps" in res.output
    # a misspelt model in --mean-rps is named, not left at the default rate
    res = runner.invoke(app, ["trace", "generate", "diurnal", "--models", "a,b", "--mean-rps", "a=5,c=7"])
    assert res.exit_code == 2 and "--mean-rps: c not among --models (a, b)" in res.output
    out = tmp_path / "t.csv"
    res = runner.invoke(app, ["trace", "generate", "steps", "--models", "a,b", "--mean-rps", "a=5,*=40",
                              "--duration", "24h", "--out", str(out)])
    assert res.exit_code == 0, res.output
    mean = tr.read_csv(out).mean_rps()
    assert mean["a"] < 20 < mean["b"]  # each at its own rate, the rest at *'s
