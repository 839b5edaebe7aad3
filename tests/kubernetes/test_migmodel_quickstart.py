"""The README's Kubernetes quick start, run with the real ``kubectl`` against the emulated cluster.

The emulated API server (``fakeapi.py``, with ``kubectl_views.py`` for
discovery, the OpenAPI document ``kubectl apply`` reads and Tables) stands
in for a real one, which cannot run here; the MigModel CRD is installed in
it as ``kubectl apply -k k8s/base`` would. The controller and its MigModel
source are the shipped code; Prometheus is a scripted metrics source. The
transcript in the README is this test's output: the test fails when the
README's ``kubectl get migmodels`` lines no longer match what kubectl prints.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from emulated import EmulatedCluster
from gpu_operator import gpu_node
from kubectl_views import KubectlViews

from autoscaler.act.kubernetes.config import build_backend
from autoscaler.clock import VirtualClock
from autoscaler.config import parse_cluster
from autoscaler.fakes import FakeMetricsSource
from autoscaler.policy.replan import Replan
from autoscaler.runtime.kubernetes import KubernetesController
from autoscaler.runtime.migmodels import MigModelSource

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = {"namespace": "migscale-system",
           "gpus": [{"node": n, "product": "A100-SXM4-80GB", "count": 1, "emulated": False} for n in ("gpu-1", "gpu-2")],
           "policy": {"tick_s": 5}}
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (apt-get install kubectl)")


def kubectl(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([KUBECTL, "--server", url, *args], capture_output=True, text=True, timeout=60, check=False)


def readme_block(after: str) -> list[str]:
    """The lines of the README's code block that follow the line ``after``."""
    lines = (ROOT / "README.md").read_text().splitlines()
    i = lines.index(after) + 1
    out = []
    while i < len(lines) and lines[i] != "```" and not lines[i].startswith("$ "):
        out.append(lines[i])
        i += 1
    return out


def no_age(text: str) -> list[str]:
    """Table lines with the AGE column blanked (it depends on when the test runs)."""
    return [re.sub(r"\s+\d+[smhd](\s+|$)", " <age> ", line).rstrip() for line in text.strip().splitlines()]


def test_quickstart_transcript_matches_kubectl_against_the_emulated_cluster(tmp_path):
    c = EmulatedCluster(ready_delay_s=0.2, stop_s=0.1, mig_delay_s=0.3, bookmark_s=0.1).start()
    c.fake.views.append(KubectlViews([yaml.safe_load((ROOT / "k8s/base/migmodel-crd.yaml").read_text())]))
    ctl = None
    try:
        for name in ("gpu-1", "gpu-2"):
            c.fake.put_object(gpu_node(name, {"3g.40gb": 2}, config="all-3g.40gb"), manager="kubelet")
        for ns in ("default", "migscale-system"):
            c.namespace(ns)
        cluster_cfg = parse_cluster(CLUSTER)
        be = build_backend([], cluster_cfg, host=c.url, identity="migscale-0", lease_namespace="migscale-system",
                           clock=VirtualClock(1_800_000_000.0),
                           backend_options={"all_namespaces": True, "watch_timeout_s": 5})
        metrics = FakeMetricsSource()
        metrics.set_rate("resnet", 140.0, p99_ms=61.0)
        ctl = KubernetesController(be, metrics, None, cluster_cfg, clock=be.clock,
                                   model_source=MigModelSource(be.rest, cluster_cfg, watch_timeout_s=5))

        applied = kubectl(c.url, "apply", "-f", str(ROOT / "k8s/examples/migmodel-resnet.yaml"))
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.strip() == "migmodel.migscale.io/resnet created"

        def converged() -> bool:
            ctl.check_lease()
            r = ctl.tick()
            ctl.clock.advance(5)
            # the planner saw this very cluster and wants nothing more (a held plan has not seen it)
            planned = ctl.loop.state.replan is not Replan.HOLD and not r.actions
            st = (c.fake.get("MigModel", "resnet", "default") or {}).get("status") or {}
            reps = st.get("replicas") or []
            # settled: every workload at its size, and no swap step or node re-cut still under way
            # (at a fast API the status can show the old cut's replicas Ready while the re-cut waits)
            return (planned and bool(reps) and all(x["ready"] == x["desired"] for x in reps)
                    and st.get("readyReplicas", 0) >= 2 and not be.rollout.chains and not be.repartitioner.in_progress())

        c.wait(converged, 30, "resnet ready")
        got = kubectl(c.url, "get", "migmodels")
        assert got.returncode == 0, got.stderr
        print(got.stdout)
        assert no_age(got.stdout) == no_age("\n".join(readme_block("$ kubectl get migmodels")))
        wide = kubectl(c.url, "get", "migmodels", "-A", "-o", "wide")
        print(wide.stdout)
        assert no_age(wide.stdout) == no_age("\n".join(readme_block("$ kubectl get migmodels -A -o wide")))

        # a spec the CRD's rules refuse never reaches the cluster: kubectl prints the field and value
        bad = yaml.safe_load((ROOT / "k8s/examples/migmodel-resnet.yaml").read_text())
        bad["spec"]["min_replicas"] = 9
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
        refused = kubectl(c.url, "apply", "-f", str(tmp_path / "bad.yaml"))
        print(refused.stderr)
        assert refused.returncode == 1 and "spec.min_replicas" in refused.stderr and "got 9" in refused.stderr
        assert refused.stderr.strip() == "\n".join(readme_block("$ kubectl apply -f bad-resnet.yaml")).strip()
    finally:
        if ctl is not None:
            ctl.close()
        c.stop()
