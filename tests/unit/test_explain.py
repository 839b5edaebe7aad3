"""``migscale explain`` on a decision log written by a real ControlLoop tick."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.clock import VirtualClock
from autoscaler.commands.explain import read_last_decision
from autoscaler.fakes import (
    FakeInventory,
    FakeMetricsSource,
    RecordingActuator,
    single_gpu_cluster,
    stub_planner,
)
from autoscaler.loop import ControlLoop
from autoscaler.policy.state import PolicyConfig
from autoscaler.policy.types import ModelSpec, Replica, ReplicaState

P = "1g.10gb"


def write_log(path):
    inv = FakeInventory(
        single_gpu_cluster(replicas=[Replica("a-0", "a", P, "node-a/0", 0, ReplicaState.READY)])
    )
    act = RecordingActuator(inv, geometry=False)  # stub_planner: no MIG geometry
    src = FakeMetricsSource()
    src.set_rate("a", 400, p99_ms=80.0)
    src.set_rate("b", None)
    cfg = PolicyConfig(
        models=(ModelSpec("a", {P: 50.0}, (P,)), ModelSpec("b", {P: 50.0}, (P,))), slo_p99_ms={"a": 50.0}
    )
    loop = ControlLoop(src, inv, act, cfg, VirtualClock(), decision_log=path, planner=stub_planner)
    loop.tick()
    return loop


def test_explain_prints_reasons_inputs_and_actions(tmp_path):
    write_log(tmp_path / "decisions.jsonl")
    res = CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "panic_scale_up" in res.output and "rate_limited" in res.output
    assert "hold_missing_metrics" in res.output or "min_replicas" in res.output
    assert "400.0" in res.output  # observed demand
    assert "1 → 5" in res.output  # replicas now -> wanted
    assert "create" in res.output


def test_explain_json_reads_the_newest_whole_line(tmp_path):
    log = tmp_path / "d.jsonl"
    write_log(log)
    with log.open("a") as f:
        f.write('{"t_s": 99, "trunc')  # a line cut short by a crash
    rec = read_last_decision(log)
    assert rec["t_s"] == 0.0
    res = CliRunner().invoke(app, ["explain", "--log", str(log), "--json"])
    assert res.exit_code == 0
    out = json.loads(res.output)
    assert out["models"]["a"]["desired_replicas"] == 5
    assert "hold_missing_metrics" in out["reasons"]["b"] or "min_replicas" in out["reasons"]["b"]


def test_explain_missing_log_exits_2_naming_the_option(tmp_path):
    res = CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path / "none")])
    assert res.exit_code == 2
    assert "--run-dir" in res.output and "none" in res.output
    assert "Traceback" not in res.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    res = CliRunner().invoke(app, ["explain", "--log", str(empty)])
    assert res.exit_code == 2 and "--log" in res.output


def test_explain_says_what_crash_loops_and_why(tmp_path):
    write_log(tmp_path / "decisions.jsonl")
    (tmp_path / "status.json").write_text(json.dumps({
        "replicas": [{"id": "a-1", "model": "a", "state": "crashloop", "restarts": 4, "next_restart_in_s": 75.0,
                      "last_error": ["ModuleNotFoundError: No module named 'torch'"]},
                     {"id": "a-0", "model": "a", "state": "ready", "restarts": 0}],
        "crashloop_held": ["a"],
    }))
    res = CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "a-1: crashloop after 4 restart(s), next restart in 75s; last error:" in res.output
    assert "No module named 'torch'" in res.output
    assert "a: every replica tried crash-loops" in res.output
    assert "a-0:" not in res.output
    out = json.loads(CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path), "--json"]).output)
    assert [r["id"] for r in out["crashloop"]] == ["a-1"] and out["crashloop_held"] == ["a"]


def test_explain_says_where_each_models_headroom_comes_from():
    from autoscaler.commands.explain import headroom_sentence

    learned = {"headroom": 0.18, "headroom_quantile": 0.95, "headroom_samples": 240, "headroom_learned": True,
               "horizon_s": 60.0}
    s = headroom_sentence("resnet", learned)
    assert "18%" in s and "95th percentile of 240 samples" in s and "60 s" in s and "0-150%" in s
    prior = dict(learned, headroom=0.2, headroom_learned=False, headroom_samples=7)
    assert "prior" in headroom_sentence("resnet", prior) and "7 so far" in headroom_sentence("resnet", prior)
    assert "fixed" in headroom_sentence("resnet", dict(learned, headroom_quantile=None))
    assert "no headroom" in headroom_sentence("resnet", {})


def test_explain_says_when_demand_repeats_and_what_the_floor_expects():
    from autoscaler.commands.explain import cycle_sentence

    assert cycle_sentence("resnet", {"cycle_s": None}) is None
    due = cycle_sentence("resnet", {"cycle_s": 900.0, "recurring_rps": 412.0})
    assert "every 15 min" in due and "412" in due
    assert "no rise is due" in cycle_sentence("resnet", {"cycle_s": 1800.0, "recurring_rps": None})


def test_explain_on_an_80_column_terminal_cuts_nothing(tmp_path):
    # rich truncates a table narrower than its words with "…"; a narrow terminal or a pipe
    # must still show every reason and input whole, one record per model
    write_log(tmp_path / "decisions.jsonl")
    res = CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    text = " ".join(res.output.split())  # records wrap at spaces
    for reason in ("panic_scale_up", "scale_up_demand", "rate_limited", "min_replicas"):
        assert reason in text
    assert "observed rps: 400.0" in text and "replicas: 1 → 5" in text and "p99 / SLO ms: 80.0 / 50.0" in text
    wide = CliRunner().invoke(app, ["explain", "--run-dir", str(tmp_path)], env={"COLUMNS": "250"})
    assert "┃ observed rps ┃" in wide.output  # a table where it fits


def test_explain_gives_a_wall_clock_decision_its_utc_time(tmp_path):
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps({"t_s": 1796658538.9, "models": {}, "reasons": {}}) + "\n")
    res = CliRunner().invoke(app, ["explain", "--log", str(log)])
    assert res.exit_code == 0, res.output
    assert "decision at t=1796658538.9 (2026-12-07 15:48:58 UTC)" in res.output
    log.write_text(json.dumps({"t_s": 90.0, "models": {}, "reasons": {}}) + "\n")  # a virtual clock's
    res = CliRunner().invoke(app, ["explain", "--log", str(log)])
    assert "decision at t=90.0\n" in res.output
