"""The load test's SLO verdict, its argument parsing, and the loadtest command's pure helpers."""

from __future__ import annotations

import json

import pytest

from autoscaler.runtime.loadtest import build_command, frontdoor_from_run_dir
from loadtests.slo import (
    ModelResult,
    SloSpecError,
    SloTarget,
    in_windows,
    parse_slo_overrides,
    parse_windows,
    targets_from_models,
    verdict,
)
from loadtests.weights import parse_weights, weights_from_file


def r(model="m", n=100, fail=0, p50=5.0, p95=9.0, p99=12.0):
    return ModelResult(model, n, fail, p50, p95, p99)


def test_pass_when_every_target_met():
    v = verdict({"m": r()}, {"m": SloTarget(p99_ms=12.0)})
    assert v.passed
    assert [(c.metric, c.ok) for c in v.checks] == [("p99_ms", True), ("error_rate", True)]


def test_p99_miss_fails():
    v = verdict({"m": r(p99=12.5)}, {"m": SloTarget(p99_ms=12.0)})
    assert not v.passed
    assert [c.metric for c in v.missed] == ["p99_ms"]
    assert "MISS" in v.table() and "FAIL" in v.table()


def test_p50_and_p95_targets_are_checked_when_given():
    v = verdict({"m": r(p50=5, p95=9)}, {"m": SloTarget(p50_ms=4, p95_ms=10)})
    assert [(c.metric, c.ok) for c in v.checks] == [("p50_ms", False), ("p95_ms", True), ("error_rate", True)]


def test_error_rate_over_budget_fails():
    v = verdict({"m": r(n=100, fail=2)}, {"m": SloTarget(p99_ms=100, max_error_rate=0.01)})
    assert not v.passed
    assert v.missed[0].metric == "error_rate"
    assert v.missed[0].actual == pytest.approx(0.02)
    # exactly at the budget passes
    assert verdict({"m": r(n=100, fail=1)}, {"m": SloTarget(p99_ms=100)}).passed


def test_no_requests_is_a_miss_not_a_pass():
    v = verdict({}, {"m": SloTarget(p99_ms=50)})
    assert not v.passed
    assert v.checks[0].note == "no requests measured"
    v = verdict({"m": ModelResult("m", 0, 0, None, None, None)}, {"m": SloTarget(p99_ms=50)})
    assert not v.passed


def test_models_without_targets_are_reported_not_judged():
    v = verdict({"m": r(), "other": r("other", p99=10_000)}, {"m": SloTarget(p99_ms=50)})
    assert v.passed
    assert set(v.to_json()["models"]) == {"m", "other"}


def test_json_is_serialisable():
    v = verdict({"m": r(fail=1)}, {"m": SloTarget(p99_ms=1)}, [(0, 5)])
    doc = json.loads(json.dumps(v.to_json()))
    assert doc["passed"] is False
    assert doc["excluded_windows_s"] == [[0, 5]]
    assert doc["models"]["m"]["error_rate"] == pytest.approx(0.01)


def test_windows():
    w = parse_windows("0-10, 48-60")
    assert w == [(0, 10), (48, 60)]
    assert in_windows(0, w) and in_windows(9.99, w) and not in_windows(10, w) and in_windows(50, w)
    assert parse_windows("") == []
    for bad in ("10", "5-2", "a-b", "-1-3"):
        with pytest.raises(SloSpecError, match="slo-ignore"):
            parse_windows(bad)


def test_overrides():
    assert parse_slo_overrides("a:p99_ms=5;b:p99_ms=40,max_error_rate=0") == {
        "a": {"p99_ms": 5.0}, "b": {"p99_ms": 40.0, "max_error_rate": 0.0}}
    with pytest.raises(SloSpecError, match=r"slo.a.p98_ms: unknown"):
        parse_slo_overrides("a:p98_ms=5")
    with pytest.raises(SloSpecError, match=r"slo.a.p99_ms: must be a number, got 'x'"):
        parse_slo_overrides("a:p99_ms=x")
    with pytest.raises(SloSpecError, match="MODEL:key=value"):
        parse_slo_overrides("p99_ms=5")


def test_targets_from_models_yaml_and_overrides(tmp_path):
    p = tmp_path / "models.yaml"
    p.write_text(
        "models:\n"
        "  - {name: resnet, model_dir: r, slo: {p99_ms: 50}}\n"
        "  - {name: bert, model_dir: b, slo: {p99_ms: 80}}\n"
    )
    t = targets_from_models(str(p), {"bert": {"p99_ms": 0.5}}, max_error_rate=0.05)
    assert t["resnet"] == SloTarget(p99_ms=50, max_error_rate=0.05)
    assert t["bert"].p99_ms == 0.5
    assert set(targets_from_models(str(p), only=["bert"])) == {"bert"}
    assert targets_from_models(None, {"x": {"p99_ms": 3}}) == {"x": SloTarget(p99_ms=3)}


def test_frontdoor_from_run_dir(tmp_path):
    assert frontdoor_from_run_dir(tmp_path) is None
    f = tmp_path / "controller.json"
    for doc, want in [
        ({"frontdoor": "http://127.0.0.1:8123"}, "http://127.0.0.1:8123"),
        ({"frontdoor": "127.0.0.1:8123"}, "http://127.0.0.1:8123"),
        ({"frontdoor": {"url": "http://h:1"}}, "http://h:1"),
        ({"frontdoor": {"port": 9}}, "http://127.0.0.1:9"),
        ({"frontdoor_port": 7}, "http://127.0.0.1:7"),
        ({"api": "x"}, None),
    ]:
        f.write_text(json.dumps(doc))
        assert frontdoor_from_run_dir(tmp_path) == want
    f.write_text("{not json")
    assert frontdoor_from_run_dir(tmp_path) is None


def test_build_command_is_a_documented_locust_line(tmp_path):
    cmd = build_command(models_yaml="m.yaml", host="http://h:1", results=tmp_path, duration_s=120,
                        shape="spike", shape_args="spike_at_s=30", base_rps=5, peak_rps=20, protocol="grpc",
                        models="a:3,b:1", users_max=50, user_rps=10, slo="", slo_models="a",
                        warmup_s=5, slo_ignore="")
    assert cmd[1:4] == ["-f", cmd[2], "--headless"] and cmd[2].endswith("loadtests/locustfile.py")
    s = " ".join(cmd)
    for part in ("--run-time 120s", "--csv " + str(tmp_path / "locust"), "--html " + str(tmp_path / "report.html"),
                 "--protocol grpc", "--shape spike", "--peak-rps 20", "--models a:3,b:1", "--slo-warmup-s 5",
                 "--slo-models a", "--shape-args spike_at_s=30"):
        assert part in s


def test_weights(tmp_path):
    assert parse_weights("resnet:3, bert:1,rnn") == {"resnet": 3, "bert": 1, "rnn": 1}
    with pytest.raises(ValueError, match="weight of 'a'"):
        parse_weights("a:x")
    with pytest.raises(ValueError, match=">= 0"):
        parse_weights("a:-1")
    f = tmp_path / "w.yaml"
    f.write_text("resnet: 2\nbert: 1\n")
    assert weights_from_file(str(f)) == {"resnet": 2, "bert": 1}
    f.write_text("models:\n  - {name: a, model_dir: x, slo: {p99_ms: 1}}\n")
    assert weights_from_file(str(f)) == {"a": 1}


def test_loadtest_command_bad_input_exits_2_without_running_locust(tmp_path):
    from typer.testing import CliRunner

    from autoscaler.cli import app

    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: resnet, model_dir: r, slo: {p99_ms: 50}}\n")
    runner = CliRunner()
    res = runner.invoke(app, ["loadtest", str(models), "--duration", "2x", "--protocol", "tcp",
                              "--run-dir", str(tmp_path)])
    assert res.exit_code == 2
    out = res.output
    assert "--duration: must be a duration such as 90, 45s, 2m, 1m30s, 1.5h, 2d, got '2x'" in out
    assert "--protocol: must be http or grpc, got 'tcp'" in out
    assert "--host: not given and no running local cluster" in out
    res = runner.invoke(app, ["loadtest", str(models), "--shape", "zig", "--host", "http://127.0.0.1:9",
                              "--results", str(tmp_path / "res")])
    assert res.exit_code == 2 and "--shape: must be one of" in res.output
    assert not (tmp_path / "res").exists()  # rejected before anything was started or written


def test_loadtest_refuses_a_host_where_nothing_listens(tmp_path):
    # it would run its whole duration and report 100% errors; now it says so at once
    import socket

    from typer.testing import CliRunner

    from autoscaler.cli import app
    from autoscaler.runtime.loadtest import host_problem

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert host_problem(f"127.0.0.1:{port}") is None and host_problem(f"http://127.0.0.1:{port}") is None
    # the port is closed again: nothing listens there
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: resnet, model_dir: r, slo: {p99_ms: 50}}\n")
    res = CliRunner().invoke(app, ["loadtest", str(models), "--host", f"http://127.0.0.1:{port}", "--duration", "60s",
                                   "--results", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert f"--host: nothing answers at 127.0.0.1:{port} (Connection refused), got 'http://127.0.0.1:{port}'" in res.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
    assert "not HOST:PORT" in (host_problem("http://") or "")


# ---------------------------------------------------------------- the recorder, nothing judged, bad options


def test_the_recorder_never_reads_a_miss_as_a_pass_and_keeps_latency_to_a_tenth_of_a_percent():
    from loadtests.slo import LatencyHistogram, SloRecorder

    rec = SloRecorder([])
    for _ in range(1000):  # locust's own percentile would read 154.9 ms as 150 and pass a 150 ms target
        rec.on_request("infer-http", "resnet", 154.9, 10)
    got = rec.results()["resnet"]
    assert 154.9 <= got.p99_ms <= 154.9 * 1.001
    assert not verdict(rec.results(), {"resnet": SloTarget(p99_ms=150)}).passed
    h = LatencyHistogram()
    values = [0.2 * i for i in range(1, 1001)]  # 0.2 .. 200 ms
    for v in values:
        h.add(v)
    for q, true in ((0.5, 100.0), (0.95, 190.0), (0.99, 198.0)):
        assert true <= h.percentile(q) <= true * 1.001, q
    assert LatencyHistogram().percentile(0.99) is None


def test_a_model_whose_every_request_failed_has_no_latency_to_pass():
    from loadtests.slo import SloRecorder

    rec = SloRecorder([])
    for _ in range(20):
        rec.on_request("infer-http", "bert", 3.0, 0, exception=RuntimeError("500"))
    v = verdict(rec.results(), {"bert": SloTarget(p99_ms=200)})
    assert [(c.metric, c.ok, c.note) for c in v.checks] == [
        ("p99_ms", False, "no successful requests"), ("error_rate", False, "")]


def test_nothing_judged_is_no_pass():
    v = verdict({"m": r()}, {})
    assert not v.passed and v.checks[0].note == "no model has a target to judge"


def test_load_test_options_are_checked_against_the_models_they_name():
    from loadtests.checks import option_problems

    known = {"resnet", "bert"}
    assert option_problems(known, models="resnet:3,bert:1", slo="bert:p99_ms=80", slo_models="resnet",
                           slo_ignore="0-10", warmup_s=5, duration_s=60) == []
    got = option_problems(known, models="resnt:1", slo="bert:max_error_rate=5;rnn:p99_ms=5", slo_models="resnt",
                          user_rps=float("nan"), warmup_s=60, duration_s=60, trace_models={"gpt"})
    assert got == [
        "--slo: bert: max_error_rate is a fraction <= 1, got 5",
        "--models: 'resnt' is not a model of MODELS (it has bert, resnet)",
        "--slo: 'rnn' is not a model of MODELS (it has bert, resnet)",
        "--slo-models: 'resnt' is not a model of MODELS (it has bert, resnet)",
        "--shape-args path (the trace): 'gpt' is not a model of MODELS (it has bert, resnet)",
        "--user-rps: must be a finite number > 0, got nan",
        "--warmup: must be shorter than --duration (60s): every request would be excluded, got 60s",
    ]
    assert option_problems(known, models="resnet:0,bert:0") == [
        "--models: at least one weight must be > 0, got 'resnet:0,bert:0'"]
    assert option_problems(None, models="anything:1") == []  # no models.yaml: names are not checked


def test_loadtest_refuses_what_would_judge_nothing_or_overwrite_before_touching_results(tmp_path):
    import socket

    from typer.testing import CliRunner

    from autoscaler.cli import app

    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {name: resnet, model_dir: r, slo: {p99_ms: 50}}\n")
    with socket.socket() as s:  # something listens: the host check passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        host = f"http://127.0.0.1:{s.getsockname()[1]}"
        runner = CliRunner()
        res = runner.invoke(app, ["loadtest", str(models), "--host", host, "--slo-models", "resnt",
                                  "--results", str(tmp_path / "out")])
        assert res.exit_code == 2 and "--slo-models: 'resnt' is not a model of MODELS (it has resnet)" in res.output
        assert not (tmp_path / "out").exists()
        (tmp_path / "notes.txt").write_text("mine")
        res = runner.invoke(app, ["loadtest", str(models), "--host", host, "--results", str(tmp_path / "notes.txt")])
        assert res.exit_code == 2 and f"--results: not a folder, got '{tmp_path / 'notes.txt'}'" in res.output
        assert (tmp_path / "notes.txt").read_text() == "mine"
        res = runner.invoke(app, ["loadtest", str(models), "--host", host, "--duration", "99999999999999d"])
        assert res.exit_code == 2 and "--duration: must be at most 30d" in res.output
        # a folder holding a report loadtest did not write is refused, and its files kept ...
        mine = tmp_path / "mine"
        mine.mkdir()
        (mine / "report.html").write_text("my report")
        res = runner.invoke(app, ["loadtest", str(models), "--host", host, "--results", str(mine)])
        assert res.exit_code == 2
        assert (f"--results: holds report.html, which migscale loadtest did not write; give another folder or "
                f"--force, got '{mine}'") in res.output
        assert sorted(p.name for p in mine.iterdir()) == ["report.html"]
        # ... unless --force, or the folder is one loadtest wrote (its mark); the bad duration stops both runs
        for extra in (["--force"], []):
            if not extra:
                (mine / ".migscale-loadtest").write_text("")
            res = runner.invoke(app, ["loadtest", str(models), "--host", host, "--results", str(mine),
                                      "--duration", "0s", *extra])
            assert res.exit_code == 2 and "--results" not in res.output and "--duration" in res.output
