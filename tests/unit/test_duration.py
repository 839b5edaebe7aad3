"""One duration syntax for every command (config/duration.py): what it takes, what it refuses and how it says so."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.config.duration import format_seconds, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("120s", 120), ("2m", 120), ("1m30s", 90), ("1h", 3600), ("90", 90), ("0.5s", 0.5), (" 10S ", 10),
    ("24h", 86400), ("90m", 5400), ("2d", 172800), ("1d12h", 129600), ("1h 30m", 5400), ("1.5h", 5400),
    (".5m", 30), ("2d3h4m5s", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), (15, 15), (2.5, 2.5),
])
def test_accepts(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "abc", "10x", "-5s", "-5", "0", "0s", "2ms", "inf", "nan", "1m1m", "30m1h",
                                 "1e3", "h", "1.2.3s", float("inf"), -1.0])
def test_refuses_naming_field_and_value(bad):
    with pytest.raises(ValueError, match="^--duration: ") as e:
        parse_duration(bad, "--duration")
    assert repr(bad) in str(e.value)


def test_zero_only_where_allowed_and_an_upper_bound():
    assert parse_duration("0s", "--warmup", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="--warmup: must be >= 0 seconds, got -1.0"):
        parse_duration(-1.0, "--warmup", allow_zero=True)
    assert parse_duration("31d", max_s=31 * 86400) == 31 * 86400
    with pytest.raises(ValueError, match="d: must be at most 1h30m, got '91m'"):
        parse_duration("91m", "d", max_s=5400)


@pytest.mark.parametrize("s, text", [(2678400, "31d"), (5400, "1h30m"), (90, "1m30s"), (0.5, "0.5s"), (86401, "1d1s")])
def test_format_seconds_reads_back(s, text):
    assert format_seconds(s) == text and parse_duration(text) == s


def test_the_commands_take_the_same_forms(tmp_path):
    # `trace generate` refused 1m30s, which `loadtest` took; `loadtest` refused 2d
    res = CliRunner().invoke(app, ["trace", "generate", "diurnal", "--models", "a", "--duration", "1d12h",
                                   "--step", "1m30s", "--out", str(tmp_path / "t.csv")])
    assert res.exit_code == 0, res.output
    assert "1440 samples" in res.output
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: resnet, model_dir: r, slo: {p99_ms: 50}}\n")
    res = CliRunner().invoke(app, ["loadtest", str(models), "--duration", "2d", "--warmup", "1m30s", "--protocol",
                                   "tcp", "--run-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--duration" not in res.output and "--warmup" not in res.output
    assert "--protocol: must be http or grpc" in res.output
    res = CliRunner().invoke(app, ["trace", "generate", "diurnal", "--step", "0s"])
    assert res.exit_code == 2 and "--step: must be > 0 seconds, got '0s'" in res.output
    res = CliRunner().invoke(app, ["trace", "generate", "diurnal", "--duration", "1s"])
    assert res.exit_code == 2 and "--duration: must be at least one step (60.0s), got 1.0" in res.output
