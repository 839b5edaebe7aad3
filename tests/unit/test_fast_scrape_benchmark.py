"""``benchmarks/fast_scrape.py`` on a tiny fleet: both forms scrape every pod through the emulated
pod network, and a silent pod costs its model the signals and nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_both_forms_read_every_pod_and_a_silent_pod_only_loses_its_own_model(tmp_path):
    import fast_scrape

    out = tmp_path / "fs.json"
    # a small direct fleet and no real Triton: the benchmark's forms all run, light enough that the
    # 0.5 s timeout it scrapes with is not met by this test's own load
    assert fast_scrape.main(["--pods", "12", "--rounds", "1", "--silent-at", "20", "--direct", "16", "--no-triton",
                             "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    for form in ("serial", "pooled"):
        run = got["pods"]["12"][form]
        assert run["failures"] == 0 and run["models_with_signals"] == 12, run
        # 20 pods, one silent (5%, at least one): two rounds, one timeout each; its model alone goes without
        silent = got["silent_5pct"]["20"][form]
        assert silent["failures"] == 2 and silent["models_with_signals"] == 19, silent
    assert got["pods"]["12"]["pooled"]["every_s"] >= 1.0
    assert {"kept", "reconnect", "httpx_pool16"} <= set(got["direct"]["16"])
    assert len(got["code"]) == 12
