"""The Kubernetes-side commands' log on stderr (commands/_common.log_to_stderr)."""

from __future__ import annotations

import logging

import pytest

from autoscaler.commands._common import log_to_stderr


@pytest.fixture
def restore_logger():
    root = logging.getLogger("migscale")
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_info_lines_reach_stderr_timestamped_and_once(restore_logger, capsys):
    log_to_stderr()
    log_to_stderr()  # a second invocation in one process does not double every line
    logging.getLogger("migscale.leader").info("pod-a: leading (%s)", "lease acquired")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith(" INFO migscale.leader: pod-a: leading (lease acquired)")
    assert err[0][:4].isdigit()  # the time comes first


def test_a_one_shot_command_gets_a_failure_as_one_line(restore_logger, capsys):
    log_to_stderr(tracebacks=False)
    try:
        raise ConnectionError("GET /api/v1/nodes:\n  connection refused")
    except ConnectionError:
        logging.getLogger("migscale.loop").exception("tick %d raised", 1)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.rstrip().endswith("ERROR migscale.loop: tick 1 raised: ConnectionError: GET /api/v1/nodes: connection refused")
    log_to_stderr()  # the long-running form keeps the whole traceback
    try:
        raise ConnectionError("refused")
    except ConnectionError:
        logging.getLogger("migscale.loop").exception("tick %d raised", 2)
    assert "Traceback" in capsys.readouterr().err
