"""Shedding at the SLO (docs/shedding.md) against a real ``tritonserver``: a model whose
queue policy rejects what waited past a timeout answers the overflow with 503s, and the
demand migscale reads from the replica's ``/metrics`` (success + failure, every reason)
still counts every request offered, so shedding never hides load from the autoscaler."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from autoscaler.act.local.emulation import emulation_env
from autoscaler.act.local.triton import TritonProcess
from autoscaler.observe.scrape import ScrapeSource

pytestmark = [pytest.mark.integration, pytest.mark.alone]

REPO = Path(__file__).resolve().parents[2]
POLICY = "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 50000 }"


def _repo_with_queue_policy(tmp: Path) -> Path:
    repo = tmp / "repo"
    shutil.copytree(REPO / "triton_models" / "resnet", repo / "resnet")
    shutil.copytree(REPO / "triton_models" / "_common", repo / "_common")
    cfg = (repo / "resnet" / "config.pbtxt").read_text()
    anchor = "max_queue_delay_microseconds: 2000"
    assert anchor in cfg
    (repo / "resnet" / "config.pbtxt").write_text(cfg.replace(anchor, f"{anchor}\n  {POLICY}"))
    return repo


def test_rejected_requests_are_shed_and_still_counted_as_demand(tmp_path):
    import tritonclient.http as th

    repo = _repo_with_queue_policy(tmp_path)
    # a 1g slice pads a batch of one to ~31 ms: 128 requests at once wait far past 50 ms
    env = emulation_env("A100-SXM4-80GB", "1g.10gb", "g0", 0, "resnet")
    offered = 384
    with TritonProcess(repo, ["resnet"], tmp_path / "work", env=env, run_dir=tmp_path / "run") as t:
        t.wait_ready(120)
        src = ScrapeSource(lambda: {"r0": ("resnet", t.url_metrics)}, window_s=600.0, long_window_s=600.0,
                           metrics_stale_s=600.0)
        src.scrape(0.0, [])
        cli = th.InferenceServerClient(t.url_http, concurrency=128)
        try:
            x = np.zeros((1, 3, 32, 32), dtype=np.float32)
            handles = []
            for _ in range(offered):
                inp = th.InferInput("INPUT", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                handles.append(cli.async_infer("resnet", [inp]))
            served, shed, other = 0, 0, []
            for h in handles:
                try:
                    h.get_result()
                    served += 1
                except Exception as exc:  # noqa: BLE001 - each failure is classified below
                    if "timeout" in str(exc).lower() and getattr(exc, "status", lambda: None)() in ("503", 503):
                        shed += 1
                    else:
                        other.append(str(exc)[:200])
        finally:
            cli.close()
        models, _ = src.read(["resnet"], [], 100.0)
    assert not other, other[:3]
    assert shed > 0 and served > 0 and served + shed == offered
    sig = models["resnet"]
    assert sig is not None and sig.request_rate is not None
    # rates over the 100 s between the two scrapes: demand is every request, served or shed
    assert sig.request_rate * 100.0 == pytest.approx(offered, abs=1e-6)
