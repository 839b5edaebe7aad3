"""The web view over a real local cluster: 2 models on real tritonserver replicas.

A ``LocalCluster`` (tritonserver processes, nginx front door; Prometheus off)
on 127.0.0.1 runs resnet and rnn on an emulated A100. A feeder thread plays
the controller's part for the API: every 0.5 s it publishes the cluster's
snapshot and status into the ``ApiState``. The page must show each replica on
its GPU and start slot, and a scale-up (a real new tritonserver) must appear
within 5 s of being published, without a reload.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from autoscaler.api import ApiState, create_app, serve_in_thread
from autoscaler.mig.layout import Placement
from autoscaler.policy.types import Action, ActionKind, GpuState, ModelSpec, Reason

pytestmark = [pytest.mark.browser, pytest.mark.integration]

playwright_sync = pytest.importorskip("playwright.sync_api")
local = pytest.importorskip("autoscaler.act.local.cluster")
replicas_mod = pytest.importorskip("autoscaler.act.local.replicas")

REPO = Path(__file__).resolve().parents[2] / "triton_models"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
GPU = "node-a/0"
LAYOUT = (Placement(0, "3g.40gb"), Placement(4, "2g.20gb"), Placement(6, "1g.10gb"))
SPECS = [
    ModelSpec("resnet", {"1g.10gb": 120.0, "2g.20gb": 200.0, "3g.40gb": 290.0},
              ("1g.10gb", "2g.20gb", "3g.40gb")),
    ModelSpec("rnn", {"1g.10gb": 60.0, "2g.20gb": 100.0}, ("1g.10gb", "2g.20gb")),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    run_dir = tmp_path_factory.mktemp("ui-local")
    models = {m: replicas_mod.ModelRuntime(m, REPO, m) for m in ("resnet", "rnn")}
    cluster = local.LocalCluster(run_dir, models, [GpuState(GPU, "node-a", "A100-SXM4-80GB", layout=LAYOUT)],
                                 prometheus="off")
    state = ApiState()
    stop = threading.Event()
    handle = None
    feeder = None
    try:
        cluster.start()
        errs = cluster.apply_and_wait([
            Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu=GPU, model="resnet", profile="1g.10gb", start=6),
            Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu=GPU, model="rnn", profile="2g.20gb", start=4),
            Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND),
        ])
        assert errs == []

        def feed() -> None:
            while not stop.is_set():
                state.update(None, None, cluster.snapshot(), SPECS, status=cluster.status(), t_s=time.time())
                stop.wait(0.5)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        handle = serve_in_thread(create_app(state), "127.0.0.1", 0)
        yield cluster, handle
    finally:
        stop.set()
        if feeder is not None:
            feeder.join(5)
        if handle is not None:
            handle.stop()
        cluster.stop()


def _replicas_on_page(page) -> dict:
    return page.eval_on_selector_all(
        "article.gpu .inst .rep",
        """els => Object.fromEntries(els.map(e => [e.dataset.replica,
             [e.closest('article.gpu').dataset.gpu, Number(e.closest('.inst').dataset.start)]]))""",
    )


def test_local_cluster_replicas_on_their_slots_and_scale_up(stack):
    cluster, handle = stack
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(handle.url + "/ui")
            page.wait_for_selector("article.gpu .rep[data-replica]", timeout=10_000)
            live = {r.id: [r.gpu, r.start] for r in cluster.snapshot().replicas}
            assert len(live) == 2
            assert _replicas_on_page(page) == live
            page.evaluate("window.__no_reload = 7")
            # scale-up: a real third replica (resnet on the 3g slice at 0)
            errs = cluster.apply([Action(ActionKind.CREATE, Reason.SCALE_UP_DEMAND, gpu=GPU, model="resnet",
                                         profile="3g.40gb", start=0)])
            assert errs == []
            new = next(r for r in cluster.snapshot().replicas if r.start == 0)
            page.wait_for_selector(
                f"article.gpu[data-gpu='{GPU}'] .inst[data-start='0'] .rep[data-replica='{new.id}']", timeout=5_000)
            assert page.evaluate("window.__no_reload") == 7
            errs = cluster.apply_and_wait([Action(ActionKind.WAIT_READY, Reason.SCALE_UP_DEMAND, replica=new.id)])
            assert errs == []
            page.wait_for_selector(f".rep[data-replica='{new.id}'][data-state='ready']", timeout=5_000)
            assert _replicas_on_page(page) == {r.id: [r.gpu, r.start] for r in cluster.snapshot().replicas}
            page.screenshot(path=str(ARTIFACTS / "ui-local-cluster.png"), full_page=True)
        finally:
            browser.close()
