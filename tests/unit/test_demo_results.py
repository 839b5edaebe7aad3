"""`migscale demo --results` replaces only its own reports (the demo deletes the folder it writes to)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.runtime.demo import REPORT_MARKER, results_problem

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_that_is_not_a_report_is_refused_and_kept(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    res = CliRunner().invoke(app, ["demo", str(ROOT / "examples/models.yaml"), str(ROOT / "examples/cluster.yaml"),
                                   "--results", str(work), "--no-live"])
    assert res.exit_code == 2, res.output
    assert "--results:" in res.output and "not a `migscale demo` report" in res.output and str(work) in res.output
    assert (work / "notes.txt").read_text() == "mine"  # nothing lost, nothing started
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_which_reports_may_be_replaced(tmp_path):
    # missing, empty and non-folder paths: the shared rule (test_run_dir_guard.py)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / REPORT_MARKER).write_text("")
    (ours / "summary.md").write_text("")
    assert results_problem(ours) is None
    older = tmp_path / "older"  # a report from before the marker
    older.mkdir()
    for f in ("demo-trace.csv", "locust-command.txt", "summary.md"):
        (older / f).write_text("")
    assert results_problem(older) is None
    assert "not a `migscale demo` report" in (results_problem(ROOT) or "")
