"""``migscale crd``, ``migscale render --migmodels`` and ``migscale import``: models.yaml <-> MigModels.

The bridge between the file a platform team keeps and the namespaced
``MigModel`` objects serving teams apply. ``render --migmodels`` (wired in
``commands/k8s.py``) prints one MigModel per model; ``import`` reads what
``kubectl get migmodels -o yaml`` (or ``-o json``) prints and writes
models.yaml back; ``crd`` prints the CustomResourceDefinition that
``k8s/base/migmodel-crd.yaml`` holds. Nothing here talks to a cluster. Bad
input exits 2 with the field, as it sits in the input, and the value.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from autoscaler.act.kubernetes.crd import crd_yaml
from autoscaler.act.kubernetes.migmodel import from_migmodel, list_items, models_from_migmodels, to_migmodel
from autoscaler.commands._common import fail, load_or_exit
from autoscaler.config import ConfigError, capacity_table, parse_models
from autoscaler.config.io import dump_yaml, dump_yaml_all, parse_documents, read_text, short
from autoscaler.config.schema import DNS_LABEL


def _dump_all(objs: list[dict]) -> str:
    return dump_yaml_all(objs, width=100)


def _header(name: str, source: str) -> str:
    return f"# MigModel {name}, from {source} (migscale render --migmodels --out-dir)\n"


def _ours(path: Path, name: str) -> bool:
    """Whether ``path`` starts with the header ``render --migmodels --out-dir`` writes for ``name``."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(512)
    except OSError:
        return False
    return first.startswith(f"# MigModel {name}, from ".encode()) and first.rstrip().endswith(
        b"(migscale render --migmodels --out-dir)"
    )


def migmodel_objects(models: str, cluster: str, namespace: str | None) -> list[dict]:
    """One MigModel per model of MODELS (validated with CLUSTER), in ``namespace`` or cluster.yaml's.

    A ``capacity_file`` is read here and its table goes inline as ``capacity``:
    the controller in the cluster cannot open a file on the author's disk.
    """
    # The model directories live in the Triton pods' volume, not here (as for `migscale controller`).
    models_cfg, cluster_cfg = load_or_exit(models, cluster, check_dirs=False)
    ns = namespace if namespace is not None else cluster_cfg.namespace
    if not DNS_LABEL.match(ns):
        fail([f"--namespace: must be a DNS-1123 label, got {ns!r}"])
    objs, problems = [], []
    for i, m in enumerate(models_cfg.models):
        table = capacity_table(models_cfg, m) if m.capacity_file else None
        obj = to_migmodel(m, ns, table)
        _, errs = from_migmodel(obj)  # what the API server will see must still validate
        problems += [f"{models}: models[{i}] as a MigModel: {e}" for e in errs]
        objs.append(obj)
    if problems:
        fail(problems)
    return objs


def render_migmodels(
    models: str, cluster: str, namespace: str | None, out_dir: str | None, force: bool = False
) -> None:
    objs = migmodel_objects(models, cluster, namespace)
    source = Path(models).name
    if out_dir is None:
        typer.echo(
            f"# {len(objs)} MigModel(s) from {source} (migscale render --migmodels)\n" + _dump_all(objs),
            nl=False,
        )
        return
    folder = Path(out_dir)
    if not folder.is_dir():
        fail([f"--out-dir: no such directory, got {out_dir!r}"])
    files = {folder / f"migmodel-{o['metadata']['name']}.yaml": o for o in objs}
    problems = [p for path, o in files.items() if (p := _target_problem(path, o["metadata"]["name"], force))]
    if problems:
        fail(problems)
    _write_all({path: _header(o["metadata"]["name"], source) + _dump_all([o]) for path, o in files.items()})
    for path in files:
        typer.echo(str(path))


def _target_problem(path: Path, name: str, force: bool) -> str | None:
    """Why ``path`` may not be (over)written, or None.

    A file this command wrote (its first line is our header for the same model) is replaced;
    any other file only with ``--force``; a directory, link or device never.
    """
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        return f"--out-dir: {path} exists and is not a regular file, got {str(path)!r}"
    if not force and not _ours(path, name):
        return (f"--out-dir: {path} exists and was not written by migscale render --migmodels "
                f"(move it away or give --force), got {str(path)!r}")
    return None


def _write_all(texts: dict[Path, str]) -> None:
    """Write every file or none: each goes to a temporary file beside it first, and only when
    all are written are they renamed into place."""
    temps: dict[Path, Path] = {}
    umask = os.umask(0)
    os.umask(umask)
    try:
        for path, text in texts.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps[path] = Path(tmp)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o666 & ~umask)  # as open() would create it; mkstemp makes 0600
        for path, tmp in temps.items():
            os.replace(tmp, path)
    except OSError as exc:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        fail([f"--out-dir: cannot write {exc.filename or next(iter(texts)).parent}: {exc.strerror or exc}"])


def import_models(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="MigModels as YAML or JSON (a List, one object, or several documents); - = stdin"
        ),
    ],
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="import only this namespace's MigModels")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="write models.yaml here (default: stdout)")
    ] = None,
) -> None:
    """Turn MigModel objects back into models.yaml.

    Example:

      kubectl get migmodels -n team-a -o yaml | migscale import - -o models.yaml
    """
    try:
        docs = parse_documents(read_text(source), source)
    except ConfigError as exc:
        fail(exc.problems)
    objs: list[Any] = []
    problems: list[str] = []
    for k, doc in enumerate(docs):
        items = list_items(doc)
        if items is None:
            problems.append(
                f"{source}: document {k + 1}: not a Kubernetes object or List, got {short(doc, 60)}"
            )
        else:
            objs += items
    if not objs and not problems:
        problems.append(f"{source}: no objects, got {short(docs, 60)}")
    if problems:
        fail(problems)
    doc, errs = models_from_migmodels(objs, namespace)
    if doc is None:
        fail([f"{source}: {e}" for e in errs])
    try:
        parse_models(doc)  # the file we write must load; a failure here is a bug, said plainly
    except ConfigError as exc:
        fail([f"{source}: the imported models do not validate together: {p}" for p in exc.problems])
    where = f" (namespace {namespace})" if namespace else ""
    text = f"# models.yaml imported from {source}{where} by `migscale import`\n" + dump_yaml(doc, width=100)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text)
    except OSError as exc:
        fail([f"--output: cannot write {output}: {exc.strerror or exc}"])


def crd() -> None:
    """Print the MigModel CustomResourceDefinition (the same as k8s/base/migmodel-crd.yaml).

    Example: migscale crd | kubectl apply -f -
    """
    typer.echo(crd_yaml(), nl=False)


def register(app: typer.Typer) -> None:
    app.command("import")(import_models)
    app.command("crd")(crd)
