"""What the local backend needs before it starts anything: checked once, named with its fix (act/).

Place in the loop: before the first process. ``migscale validate`` and
``migscale up`` (and the demo) call ``preflight`` after the config checks; any
problem exits 2 with one line per problem naming the model and the install
command, instead of a replica that crash-loops with the cause buried in a
rank's ``worker.log``. Checks:

* the ``tritonserver`` binary (``local.tritonserver`` or the nvidia-pytriton
  wheel's) exists and is executable, and the wheel has the Python-backend stub
  for this Python version;
* every model directory holds ``config.pbtxt`` (config/build.py checks it too;
  here the message names the model);
* a ``backend: multinode`` model has ``worker.py`` for ranks 1..N-1, and torch
  imports in the interpreter the Triton Python stub runs -- the first
  ``python3`` on the PATH that ``triton_env`` gives the replica (the stub embeds
  libpython and takes its packages from there) -- and in the one that runs the
  worker ranks (``sys.executable``), with that same environment and an empty
  working directory, as a rank would. ``migscale up`` imports it (~2.5 s warm,
  catches a broken install too); ``validate`` only looks it up (~0.1 s,
  catches a missing one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from autoscaler.act.local.procs import error_lines
from autoscaler.act.local.triton import TritonError, find_tritonserver, stub_dir, triton_env
from autoscaler.config import ClusterConfig, ModelsConfig

MULTINODE_INSTALL = "pip install 'migscale[multinode]'"
TRITON_INSTALL = "pip install nvidia-pytriton"
# A cold `import torch` takes 2-5 s on a small machine; 120 s means it hangs.
IMPORT_TIMEOUT_S = 120.0


def stub_python(env: dict[str, str] | None = None) -> str | None:
    """The interpreter the Triton Python stub takes its packages from: ``python3`` on its PATH."""
    env = env or triton_env()
    return shutil.which("python3", path=env.get("PATH", ""))


def import_error(python: str, module: str, env: dict[str, str], *, full: bool = True) -> str | None:
    """None when ``module`` imports (``full``) or is found (not ``full``) by ``python`` there;
    else what it said."""
    code = (f"import {module}" if full else
            f"import importlib.util, sys\nif importlib.util.find_spec({module!r}) is None:\n"
            f"    sys.exit(\"ModuleNotFoundError: No module named '{module}'\")")
    with tempfile.TemporaryDirectory(prefix="migscale-preflight-") as cwd:
        try:
            r = subprocess.run(
                [python, "-c", code],
                cwd=cwd, env=env, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, check=False,
            )
        except subprocess.TimeoutExpired:
            return f"import {module} did not finish within {IMPORT_TIMEOUT_S:.0f}s"
        except OSError as e:
            return f"cannot run {python}: {e.strerror}"
    if r.returncode == 0:
        return None
    lines = error_lines((r.stderr or r.stdout).splitlines(), keep=1)
    return lines[-1].strip() if lines else f"exit {r.returncode}"


def preflight(models_cfg: ModelsConfig, cluster_cfg: ClusterConfig, *, import_modules: bool = True) -> list[str]:
    """One line per missing piece (empty: ready to start); ``import_modules=False`` only looks
    modules up instead of importing them."""
    problems: list[str] = []
    local = cluster_cfg.local
    try:
        find_tritonserver(local.tritonserver)
        stub_dir()
    except TritonError as e:
        fix = f"; install it: {TRITON_INSTALL}" if not local.tritonserver else ""
        problems.append(f"local.tritonserver: {e}{fix}")
    env = None
    for i, m in enumerate(models_cfg.models):
        d = models_cfg.resolve(m.model_dir).resolve()
        at = f"models[{i}] ({m.name})"
        if not (d / "config.pbtxt").is_file():
            problems.append(f"{at}.model_dir: model {m.name!r} has no Triton config.pbtxt in {d}")
        if m.backend != "multinode":
            continue
        if not (d / "worker.py").is_file():
            problems.append(f"{at}.model_dir: multinode model {m.name!r} needs worker.py (ranks 1..N-1) in {d}")
        try:
            env = env or triton_env()
        except ImportError:
            continue  # no pytriton: reported above
        # .venv/bin/python3 and .venv/bin/python are one environment: same folder, same binary
        pythons = {(os.path.dirname(p), os.path.realpath(p)): p for p in (stub_python(env), sys.executable) if p}
        for py in pythons.values():
            err = import_error(py, "torch", env, full=import_modules)
            if err:
                problems.append(
                    f"{at}.backend: multinode model {m.name!r} needs torch in the Python its Triton "
                    f"stub and ranks run ({py}): {err}; install it: {MULTINODE_INSTALL}"
                )
                break
    return problems
