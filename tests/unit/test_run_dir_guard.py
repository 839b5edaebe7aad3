"""`up` and `down` delete a run directory's records; they touch only a run directory (act/local/pids.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autoscaler.act.local.pids import RUN_DIR_MARKER, is_run_dir, mark_run_dir, run_dir_problem
from autoscaler.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _foreign(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "status.json").write_text('{"mine": 1}')
    (d / "pids.json").write_text("[1, 2]")
    return d


def test_down_on_a_folder_that_is_not_a_run_directory_touches_nothing(tmp_path):
    d = _foreign(tmp_path)
    res = CliRunner().invoke(app, ["down", "--run-dir", str(d)])
    assert res.exit_code == 0 and "not a migscale run directory, nothing in it touched" in res.output
    assert sorted(p.name for p in d.iterdir()) == ["pids.json", "status.json"]  # nor a lock file made
    assert (d / "status.json").read_text() == '{"mine": 1}'
    res = CliRunner().invoke(app, ["down", "--run-dir", str(tmp_path / "absent")])
    assert res.exit_code == 0 and "(no folder)" in res.output and not (tmp_path / "absent").exists()


def test_up_refuses_a_folder_that_is_not_a_run_directory(tmp_path):
    d = _foreign(tmp_path)
    res = CliRunner().invoke(app, ["up", str(ROOT / "examples/models.yaml"), str(ROOT / "examples/cluster.yaml"),
                                   "--run-dir", str(d)])
    assert res.exit_code == 2 and "--run-dir:" in res.output and "not a migscale run directory" in res.output
    assert sorted(p.name for p in d.iterdir()) == ["pids.json", "status.json"]


def test_what_counts_as_a_run_directory(tmp_path):
    assert run_dir_problem(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert run_dir_problem(tmp_path / "empty") is None
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "status.json").write_text("{}")
    assert not is_run_dir(ours) and run_dir_problem(ours)
    mark_run_dir(ours)
    assert (ours / RUN_DIR_MARKER).is_file() and is_run_dir(ours) and run_dir_problem(ours) is None
    older = tmp_path / "older"  # made before the marker: its lock beside the controller's log
    older.mkdir()
    (older / "controller.lock").write_text("")
    assert not is_run_dir(older)
    (older / "controller.log").write_text("")
    assert is_run_dir(older)
    (tmp_path / "file").write_text("x")
    assert "is not a folder" in (run_dir_problem(tmp_path / "file") or "")


def test_owned_tempdir_removes_what_a_killed_run_left_and_nothing_else(tmp_path, monkeypatch):
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from dataclasses import asdict

    from autoscaler.act.local.pids import OWNER_FILE, ProcRecord, owned_tempdir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = ProcRecord.of(gone.pid, "owner")
    gone.kill()
    gone.wait()
    for name, owner in (("p-killed", dead), ("p-running", ProcRecord.of(os.getpid(), "owner")), ("p-foreign", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "replica.log").write_text("x" * 1000)
        if owner is not None:
            (tmp_path / name / OWNER_FILE).write_text(json.dumps(asdict(owner)))
    with owned_tempdir("p-") as mine:
        assert json.loads((mine / OWNER_FILE).read_text())["pid"] == os.getpid()
        left = sorted(p.name for p in tmp_path.iterdir())
    assert "p-killed" not in left and {"p-running", "p-foreign", mine.name} <= set(left)
    assert not mine.exists()  # its own folder goes at the end


def test_status_from_a_controller_that_stopped_updating_it_is_flagged_not_shown_as_current(tmp_path):
    """status.json is rewritten every second: a stopped (SIGSTOP) or stuck controller leaves an old one,
    which `status` printed as the present, exit 0, while nothing was serving."""
    import json
    import time

    from autoscaler.act.local.pids import RunDirLock

    rd = tmp_path / "run"
    rd.mkdir()
    mark_run_dir(rd)
    doc = {"controller_pid": 4242, "replicas": [], "gpus": [], "frontdoor": "http://127.0.0.1:1"}
    lock = RunDirLock(rd)
    assert lock.acquire()  # the controller holds its lock, hung or not
    try:
        (rd / "status.json").write_text(json.dumps({**doc, "t_s": time.time()}))
        fresh = CliRunner().invoke(app, ["status", "--run-dir", str(rd)])
        assert fresh.exit_code == 0 and "not updating" not in fresh.output
        (rd / "status.json").write_text(json.dumps({**doc, "t_s": time.time() - 120}))
        stale = CliRunner().invoke(app, ["status", "--run-dir", str(rd)])
        assert stale.exit_code == 1
        assert "s old: the controller (pid 4242) is not updating it" in stale.output
    finally:
        lock.release()


def test_down_refuses_a_negative_or_absurd_timeout(tmp_path):
    for bad in ("-1", "nan", "1e9"):
        res = CliRunner().invoke(app, ["down", "--run-dir", str(tmp_path), "--timeout-s", bad])
        assert res.exit_code == 2 and "--timeout-s" in res.output, (bad, res.output)


def test_down_removes_what_killed_servers_of_its_run_directory_left_in_dev_shm_and_nothing_else(tmp_path):
    from autoscaler.act.local.triton import SHM_DIR, shm_prefix

    rd = tmp_path / "run"
    rd.mkdir()
    mark_run_dir(rd)
    ours = SHM_DIR / (shm_prefix(rd / "replicas" / "resnet-0", rd.resolve()) + "0f1e2d3c")
    other_run = SHM_DIR / (shm_prefix(tmp_path / "w", (tmp_path / "other").resolve()) + "0f1e2d3c")
    foreign = SHM_DIR / f"triton_python_backend_shm_region_{tmp_path.name}"
    for f in (ours, other_run, foreign):
        f.write_bytes(b"\\0" * 16)
    try:
        res = CliRunner().invoke(app, ["down", "--run-dir", str(rd)])
        assert res.exit_code == 0, res.output
        assert not ours.exists() and other_run.exists() and foreign.exists()
    finally:
        for f in (ours, other_run, foreign):
            f.unlink(missing_ok=True)
