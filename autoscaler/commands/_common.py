"""Shared CLI plumbing: load the two config files or exit 2 with one line per problem.

Every command that takes ``MODELS CLUSTER`` calls ``load_or_exit`` so bad
input looks the same everywhere: each problem on its own stderr line,
prefixed with the file it is in, exit status 2, never a traceback.
``print_rows`` prints the commands' tables so that no cell is cut short on
a narrow terminal. ``log_to_stderr`` gives the long-running Kubernetes-side
commands (``controller``, ``api``) their log: the pod's. The leading underscore
keeps ``cli.py`` from registering this module as commands.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from autoscaler.config import (
    ClusterConfig,
    ConfigError,
    ModelsConfig,
    load_cluster,
    load_models,
    validate_pair,
)

if TYPE_CHECKING:
    from rich.console import Console

EXIT_USAGE = 2  # bad input: config, arguments (the same status click uses for usage errors)


def url_problem(flag: str, value: str | None) -> str | None:
    """Why ``value`` is not an http(s) URL with a host, or None (also for no value)."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        ok = False
    return None if ok else f"{flag}: an http:// or https:// URL with a host, got {value!r}"


class _OneLine(logging.Formatter):
    """A failure as one line (its exception's type and message), for a terminal where the
    command also prints the failure in its own output."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None}))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f": {type(exc).__name__}: {' '.join(str(exc).split())}"
        return line


def log_to_stderr(*, tracebacks: bool = True, level: int = logging.INFO) -> logging.Handler:
    """Send migscale's log (leadership, informer retries, tick failures) to stderr, one
    timestamped line each. Without it Python prints only warnings and errors, bare, and drops
    the INFO lines an operator reads a controller by. ``tracebacks=False`` keeps a failure's
    traceback out of a one-shot command's terminal, where the failure is in its output."""
    root = logging.getLogger("migscale")
    for old in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(old)  # one per process, however often a command is invoked in it
    h = _Stderr()
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    h.setFormatter(logging.Formatter(fmt) if tracebacks else _OneLine(fmt))
    root.addHandler(h)
    root.setLevel(level)
    return h


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (a test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _prefixed(path: str | Path, problems: Iterable[str]) -> list[str]:
    prefix = f"{path}: "
    return [p if p.startswith(prefix) else prefix + p for p in problems]


def fail(problems: Iterable[str], code: int = EXIT_USAGE) -> NoReturn:
    """Print each problem on its own stderr line and exit ``code``."""
    for line in problems:
        typer.echo(line, err=True)
    raise typer.Exit(code)


def load_models_or_exit(path: str | Path) -> ModelsConfig:
    try:
        return load_models(path)
    except ConfigError as exc:
        fail(_prefixed(path, exc.problems))


def load_cluster_or_exit(path: str | Path) -> ClusterConfig:
    try:
        return load_cluster(path)
    except ConfigError as exc:
        fail(_prefixed(path, exc.problems))


def load_or_exit(
    models_path: str | Path, cluster_path: str | Path, *, require_capacity: bool = True, check_dirs: bool = True
) -> tuple[ModelsConfig, ClusterConfig]:
    """Both configs, validated alone and together; on any problem exit 2.

    Problems in both files are reported in one go (a user fixing a typo in
    cluster.yaml should not discover the one in models.yaml on the next run).
    ``require_capacity=False`` is for ``migscale profile``, which produces the
    capacity figures the other commands need; ``check_dirs=False`` for the
    Kubernetes controller, whose model repository lives in the Triton pods.
    """
    problems: list[str] = []
    models = cluster = None
    try:
        models = load_models(models_path)
    except ConfigError as exc:
        problems += _prefixed(models_path, exc.problems)
    try:
        cluster = load_cluster(cluster_path)
    except ConfigError as exc:
        problems += _prefixed(cluster_path, exc.problems)
    if models is not None and cluster is not None:
        problems += _prefixed(models_path, validate_pair(models, cluster, require_capacity=require_capacity,
                                                             check_dirs=check_dirs))
    if problems or models is None or cluster is None:
        fail(problems)
    return models, cluster


def print_rows(console: Console, title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """Print ``rows`` as a table when it fits ``console`` whole, else one record per row.

    A rich table narrower than its cells' longest words cuts them to "…", so on an
    80-column terminal (or a pipe, which rich treats as 80 columns) a wide table
    such as ``explain``'s per-model inputs would lose the very reasons it is read
    for. Then each row is printed as ``first-cell  column: value · column: value``
    instead, wrapped under itself, and empty cells are left out.
    """
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    rows = [tuple(r) for r in rows]
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    # measured unbounded: rich clamps a measurement to the width it is given
    if Measurement.get(console, console.options.update_width(1 << 16), table).minimum <= console.width:
        console.print(table)
        return
    console.print(Text(title, style="table.title"))
    records = Table.grid(padding=(0, 2))
    records.add_column(no_wrap=True)
    records.add_column(overflow="fold")
    for r in rows:
        records.add_row(r[0], " · ".join(f"{col}: {val}" for col, val in zip(columns[1:], r[1:]) if val))
    console.print(records)
