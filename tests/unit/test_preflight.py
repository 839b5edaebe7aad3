"""The local backend's preflight (act/local/preflight.py): a missing piece is named, with its fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autoscaler.act.local.preflight import MULTINODE_INSTALL, import_error, preflight
from autoscaler.act.local.triton import triton_env
from autoscaler.config import parse_cluster, parse_models

TRITON = Path(__file__).resolve().parents[2] / "triton_models"

NO_TORCH = Path(__file__).resolve().parents[1] / "notorch"  # its sitecustomize hides torch


def _configs(tmp_path: Path, llm_dir: Path, resnet_dir: Path, tritonserver: str | None = None):
    models = parse_models({"models": [
        {"name": "resnet", "model_dir": str(resnet_dir), "slo": {"p99_ms": 150}, "profiles": ["1g.10gb"],
         "capacity": {"1g.10gb": 58}},
        {"name": "llm", "model_dir": str(llm_dir), "slo": {"p99_ms": 2000}, "memory_gb": 120, "backend": "multinode",
         "multinode": {"nodes_per_group": 2, "gpus_per_node": 1, "group_capacity_rps": 4}},
    ]}, tmp_path)
    cluster = parse_cluster({
        "gpus": [{"node": "a", "product": "A100-SXM4-80GB", "count": 1}],
        "rdma_pool": {"nodes": [{"name": f"r{i}", "product": "H100-SXM5-80GB", "gpus": 1, "fabric": "f"}
                                for i in range(2)]},
        "local": {"tritonserver": tritonserver},
    })
    return models, cluster


def test_the_examples_pass(tmp_path):
    models, cluster = _configs(tmp_path, TRITON / "llm", TRITON / "resnet")
    assert preflight(models, cluster, import_modules=False) == []


def test_each_missing_piece_is_named_with_the_model_and_the_fix(tmp_path):
    empty = tmp_path / "llm"
    empty.mkdir()
    models, cluster = _configs(tmp_path, empty, tmp_path / "nowhere", tritonserver=str(tmp_path / "tritonserver"))
    problems = preflight(models, cluster, import_modules=False)
    assert any(p.startswith("local.tritonserver:") and "is not an executable file" in p for p in problems), problems
    assert any(p.startswith("models[0] (resnet).model_dir: model 'resnet' has no Triton config.pbtxt")
               for p in problems), problems
    assert any(p.startswith("models[1] (llm).model_dir: multinode model 'llm' needs worker.py") for p in problems)


def test_torch_missing_from_the_stubs_interpreter_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(NO_TORCH), os.environ.get("PYTHONPATH", "")]))
    err = import_error(sys.executable, "torch", triton_env())
    assert err == "ModuleNotFoundError: No module named 'torch'"
    assert import_error(sys.executable, "torch", triton_env(), full=False) == err
    models, cluster = _configs(tmp_path, TRITON / "llm", TRITON / "resnet")
    problems = preflight(models, cluster, import_modules=False)
    assert len(problems) == 1, problems
    assert problems[0].startswith("models[1] (llm).backend: multinode model 'llm' needs torch")
    assert problems[0].endswith(f"No module named 'torch'; install it: {MULTINODE_INSTALL}")
