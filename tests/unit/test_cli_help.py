"""Every command's help on an 80-column terminal: each example command can be copied as shown.

Typer reflows help text to the terminal's width. An example line wider than that is cut in
the middle of a command, so the two halves pasted into a shell run something else; each
example line (from ``migscale`` or ``kubectl`` to the line's end, or a ``--flag ...``
continuation) must come out on one line of the help.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from autoscaler.cli import app


def _commands() -> list[tuple[list[str], object]]:
    out: list[tuple[list[str], object]] = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, [*path, name])
        else:
            out.append((path, cmd))

    walk(typer.main.get_command(app), [])
    return out


EXAMPLE = re.compile(r"^(?:[A-Z][^:]*:\s+)?((?:migscale|kubectl) .+|--.+)$")  # "Example: migscale ..."


def _example_lines(text: str) -> list[str]:
    return [m.group(1) for raw in text.splitlines() if (m := EXAMPLE.match(raw.strip()))]


COMMANDS = _commands()


def test_every_command_is_checked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"api", "controller", "plan", "profile", "simulate", "trace generate", "loadtest"} <= names
    assert sum(1 for _, c in COMMANDS if _example_lines((c.help or "") + "\n" + (c.epilog or ""))) >= 15


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_examples_fit_an_80_column_terminal(path, cmd):
    examples = _example_lines((cmd.help or "") + "\n" + (cmd.epilog or ""))
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    shown = [" ".join(line.split()) for line in res.output.splitlines()]
    for ex in examples:
        ex = " ".join(ex.split())
        assert any(ex in line for line in shown), f"{' '.join(path)}: example cut at 80 columns: {ex!r}"


def _summary(cmd) -> str:
    """What ``migscale --help`` lists for a command: its help's first paragraph (Typer's rule)."""
    import inspect

    return inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0]


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_the_command_list_gives_one_whole_sentence(path, cmd):
    # The list keeps a summary's own line breaks, so a summary that runs into the next
    # paragraph ("Example (...):") shows a heading cut from its example.
    summary = _summary(cmd)
    assert summary and "\n" not in summary, f"{' '.join(path)}: summary spans lines: {summary!r}"
    assert summary.endswith("."), f"{' '.join(path)}: summary is not a whole sentence: {summary!r}"


def test_the_top_level_list_shows_each_summary_whole():
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.replace("│", " ").split())
    for path, cmd in COMMANDS:
        if len(path) == 1:
            assert " ".join(_summary(cmd).split()) in text, path
    assert "Example" not in res.output


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_arguments_carry_the_capital_names_the_help_uses(path, cmd):
    # The help texts say "Check MODELS and CLUSTER ..."; the usage line and the
    # "Missing argument" error must use the same names, not the Python parameter's.
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    for a in args:
        assert a.metavar and a.metavar.isupper(), f"{' '.join(path)}: argument {a.name!r} has no capital name"
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    usage = next(line for line in res.output.splitlines() if "Usage:" in line)
    assert [a.metavar for a in args] == re.findall(r"[{\[]([A-Z_]+)[}\]]", usage.replace("[OPTIONS]", "")), usage


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_prose_reads_evenly_at_80_columns(path, cmd):
    # Rich keeps a help text's own line breaks: in a paragraph of several lines, a line
    # wider than the terminal wraps on its own and leaves a ragged fragment after it.
    # A one-line paragraph wraps cleanly. Docstring markup (``x``) is shown as typed.
    import inspect

    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    shown = [" ".join(line.split()) for line in res.output.splitlines()]
    assert not any("``" in line for line in shown), f"{' '.join(path)}: reST markup in the help"
    text = inspect.cleandoc(cmd.help or "") + "\n\n" + inspect.cleandoc(cmd.epilog or "")
    for para in text.split("\n\n"):
        lines = [" ".join(raw.split()) for raw in para.splitlines() if raw.strip()]
        if len(lines) < 2:
            continue
        for line in lines:
            assert any(line in s for s in shown), f"{' '.join(path)}: a line wraps raggedly: {line!r}"
