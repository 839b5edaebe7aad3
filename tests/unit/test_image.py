"""The controller image (Dockerfile) agrees with what runs it (k8s/base/deployment.yaml) and what it packs.

No container daemon runs on the build machines, so the image is not built here; these checks
hold the Dockerfile to the repository: what it copies exists and is not ignored, the user is
the Deployment's, the entry point is the package's script, and the Deployment's image tag is
the package's version.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _deployment() -> dict:
    return yaml.safe_load((ROOT / "k8s/base/deployment.yaml").read_text())


def test_what_the_image_copies_exists_and_is_in_the_build_context():
    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    copied = []
    for op, rest in _instructions():
        if op == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            copied += sources
    assert {"pyproject.toml", "autoscaler", "loadtests"} <= set(copied)
    for src in copied:
        assert (ROOT / src).exists(), src
        assert src not in ignored, f"{src} is copied but .dockerignore leaves it out"
    # the package's metadata names these files: the wheel cannot build without them
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["readme"] in copied and all(f in copied for f in project["license-files"])
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} <= set(copied)


def test_the_image_runs_as_the_deployment_expects():
    ops = _instructions()
    user = [rest for op, rest in ops if op == "USER"][-1]
    pod = _deployment()["spec"]["template"]["spec"]
    assert user.split(":")[0] == str(pod["securityContext"]["runAsUser"])
    entry = json.loads([rest for op, rest in ops if op == "ENTRYPOINT"][-1])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["migscale"] and "migscale" in scripts
    container = pod["containers"][0]
    assert container["args"][0] in {"controller", "api"}  # a migscale command, as the entry point expects
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # a read-only root: bytecode is compiled at build time and nothing writes beside the code
    env = " ".join(rest for op, rest in ops if op in {"ENV", "RUN"})
    assert "compileall" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    assert re.search(r"MPLCONFIGDIR=/tmp\b", env)
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])  # the one writable place


def test_the_deployments_image_tag_is_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = _deployment()["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.rsplit(":", 1)[1] == version
    assert f"migscale:{version}" in (ROOT / "Dockerfile").read_text()  # the build line documented there
