"""The pure core (``autoscaler/mig``, ``autoscaler/policy``) imports no I/O library.

Two independent checks: an AST walk of every module in those packages
(including imports inside functions and ``importlib.import_module("x")``
calls), and import-linter's ``forbidden`` contract from pyproject.toml run
through its real CLI. Both are shown to FAIL on a violating module, so a pass
means something.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = REPO / ".venv" / "bin" / "lint-imports"
PURE_PACKAGES = ("autoscaler/mig", "autoscaler/policy")

FORBIDDEN = (
    "kubernetes",
    "fastapi",
    "httpx",
    "requests",
    "urllib",
    "urllib3",
    "subprocess",
    "socket",
    "time",
    "tritonclient",
    "prometheus_api_client",
    "aiohttp",
    "uvicorn",
    "http",
    "shutil",
    "multiprocessing",
    "autoscaler.observe",
    "autoscaler.act",
    "autoscaler.api",
    "autoscaler.loop",
    "autoscaler.cli",
    "autoscaler.commands",
)


def _is_forbidden(module: str) -> str | None:
    for bad in FORBIDDEN:
        if module == bad or module.startswith(bad + "."):
            return bad
    return None


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """Absolute name of ``from <level dots><module> import ...`` inside ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def forbidden_imports(source: str, importer: str, is_package: bool = False) -> list[str]:
    """Each forbidden import in ``source`` as 'line N: module'."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module, node.level, importer, is_package)
            # `from autoscaler import loop` imports the module autoscaler.loop
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in ("import_module", "__import__"):
                names = [node.args[0].value]
        for name in names:
            if _is_forbidden(name):
                found.append(f"line {node.lineno}: {name}")
    return sorted(set(found))


def _pure_modules() -> list[Path]:
    return sorted(p for pkg in PURE_PACKAGES for p in (REPO / pkg).rglob("*.py"))


# ---------------------------------------------------------------- the checker itself


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import subprocess\n", "subprocess"),
        ("import os, socket\n", "socket"),
        ("from urllib.request import urlopen\n", "urllib.request"),
        ("import time as t\n", "time"),
        ("def f():\n    import kubernetes.client\n", "kubernetes.client"),
        ("from autoscaler import loop\n", "autoscaler.loop"),
        ("from autoscaler.act.local.triton import TritonProcess\n", "autoscaler.act.local.triton"),
        ("from ..observe import prometheus\n", "autoscaler.observe"),
        ("import importlib\nimportlib.import_module('tritonclient.http')\n", "tritonclient.http"),
        ("x = __import__('requests')\n", "requests"),
        ("if True:\n    from fastapi import FastAPI\n", "fastapi"),
    ],
)
def test_checker_catches_violations(source: str, module: str) -> None:
    found = forbidden_imports(source, "autoscaler.policy.fake")
    assert any(f.endswith(": " + module) for f in found), found


@pytest.mark.parametrize(
    "source",
    [
        "import math\nfrom autoscaler.mig import Placement\n",
        "import timeit\nimport sockets_lib\nimport requests_toolbelt_like\n",  # prefixes, not the modules
        "from . import types\nfrom .hpa import desired\n",
        "from autoscaler.policy.types import Plan\n",
        "'import subprocess'\n",
    ],
)
def test_checker_passes_clean_code(source: str) -> None:
    assert forbidden_imports(source, "autoscaler.policy.fake") == []


def test_relative_import_from_package_init() -> None:
    # in autoscaler/policy/__init__.py, `from ..act import x` means autoscaler.act
    assert forbidden_imports("from ..act import x\n", "autoscaler.policy", is_package=True) == [
        "line 1: autoscaler.act",
        "line 1: autoscaler.act.x",
    ]


# ---------------------------------------------------------------- the real code


def test_pure_packages_exist() -> None:
    mods = _pure_modules()
    assert any(p.name == "layout.py" for p in mods) and any(p.name == "types.py" for p in mods)


@pytest.mark.parametrize("path", _pure_modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_pure_core_imports_no_io(path: Path) -> None:
    rel = path.relative_to(REPO).with_suffix("")
    is_package = rel.name == "__init__"
    importer = ".".join(rel.parent.parts if is_package else rel.parts)
    assert forbidden_imports(path.read_text(), importer, is_package) == []


def _pyproject_contract() -> dict:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in cfg["contracts"] if c["type"] == "forbidden"]
    return contract


def test_ast_list_is_at_least_as_strict_as_the_contract() -> None:
    contract = _pyproject_contract()
    assert set(contract["source_modules"]) == {"autoscaler.mig", "autoscaler.policy"}
    assert set(contract["forbidden_modules"]) <= set(FORBIDDEN)


def test_lint_imports_contract_is_kept() -> None:
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_lint_imports_catches_a_violation(tmp_path: Path) -> None:
    """The same forbidden list, on a throwaway package whose mig/ imports time in a function."""
    pkg = tmp_path / "fakecore"
    (pkg / "mig").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mig" / "__init__.py").write_text("def now():\n    import time\n    return time.time()\n")
    external = [m for m in _pyproject_contract()["forbidden_modules"] if not m.startswith("autoscaler")]
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = fakecore\ninclude_external_packages = True\n\n"
        "[importlinter:contract:pure]\nname = pure\ntype = forbidden\nsource_modules =\n    fakecore.mig\n"
        "forbidden_modules =\n" + "".join(f"    {m}\n" for m in external)
    )
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fakecore.mig is not allowed to import time" in proc.stdout


def test_importing_the_core_loads_no_io_module() -> None:
    """Runtime view: a fresh interpreter importing the core does not pull in an I/O library."""
    code = (
        "import sys, autoscaler.mig, autoscaler.policy.types\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "{'kubernetes','fastapi','httpx','requests','tritonclient','prometheus_api_client','aiohttp','uvicorn'}"
        " or m.startswith(('autoscaler.act','autoscaler.observe','autoscaler.api','autoscaler.loop'))]\n"
        "print(bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _layers_contract() -> dict:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in cfg["contracts"] if c["type"] == "layers"]
    return contract


def test_every_top_level_module_has_a_layer() -> None:
    """A new top-level module or package cannot escape the layering by being left out."""
    named = {m.strip() for layer in _layers_contract()["layers"] for m in layer.split("|")}
    pkg = REPO / "autoscaler"
    present = {
        f"autoscaler.{p.stem if p.is_file() else p.name}"
        for p in pkg.iterdir()
        if (p.is_file() and p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert present - named == set()


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of size > 1 (iterative: the package has hundreds of modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_tarjan_finds_a_cycle() -> None:
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycles() -> None:
    """No two modules import each other, directly or through others -- type-only imports included."""
    import grimp  # import-linter's graph builder (dev dependency)

    g = grimp.build_graph("autoscaler")
    graph = {
        m: {w for w in g.find_modules_directly_imported_by(m) if w.startswith("autoscaler")} for m in g.modules
    }
    assert _strongly_connected(graph) == []
