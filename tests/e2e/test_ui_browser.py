"""The live web view in a real headless Chromium (Debian's, driven by Playwright).

The API runs on 127.0.0.1 (free port) fed with synthetic ticks: two A100s,
two models, one GPU with a repartition pending. The page must place every
replica on its GPU and start slot, pick up a scale-up within 5 s without a
reload, and look right at 1280x800 and on a phone. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autoscaler.api import ApiState, create_app, serve_in_thread
from autoscaler.api.synthetic import demo_models, demo_tick
from autoscaler.policy.types import ReplicaState
from autoscaler.status import ReplicaEndpoint, ReplicaHealth, build_status

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def served():
    state = ApiState()
    handle = serve_in_thread(create_app(state), "127.0.0.1", 0)
    try:
        t0 = time.time() - 600
        # ten minutes of history so the sparklines have something to draw
        for k in range(0, 600, 15):
            # a morning ramp with some wobble, ending at the reference load 1.0
            load = 0.55 + 0.45 * k / 585 + 0.08 * math.sin(k / 40) * (1 - k / 600)
            obs, plan, cluster = demo_tick(t0 + k, load=1.0 if k == 585 else load)
            state.update(obs, plan, cluster, demo_models(), slo_p99_ms={"resnet": 50.0, "bert": 200.0})
        yield state, handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _replicas_on_page(page) -> dict[str, tuple[str, str, str]]:
    return page.eval_on_selector_all(
        "article.gpu .inst .rep",
        """els => Object.fromEntries(els.map(e => [e.dataset.replica,
             [e.closest('article.gpu').dataset.gpu, e.closest('.inst').dataset.start, e.dataset.state]]))""",
    )


def test_every_replica_on_its_gpu_slot_then_scale_up_appears(served, browser):
    state, handle = served
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(handle.url + "/ui")
        page.wait_for_selector("article.gpu .rep[data-replica]", timeout=10_000)
        obs, plan, cluster = demo_tick(time.time())
        on_page = _replicas_on_page(page)
        assert on_page == {r.id: [r.gpu, str(r.start), r.state.value] for r in cluster.replicas}
        # the pending repartition of gpu 1 is drawn in outline
        planned = page.eval_on_selector_all(
            "article.gpu[data-gpu='node-a/1'] .inst.planned", "els => els.map(e => e.title)")
        assert planned == ["3g.40gb@0 (planned)", "2g.20gb@4 (planned)", "1g.10gb@6 (planned)"]
        # per model: SLO colour (resnet p99 28 ms vs 50 ms: green; bert 182 vs 200: amber)
        assert "slo-ok" in page.get_attribute("article.model[data-model='resnet']", "class")
        assert "slo-warn" in page.get_attribute("article.model[data-model='bert']", "class")
        assert page.locator("article.model[data-model='resnet'] svg.spark polyline").count() == 2
        page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)

        # scale-up: a new resnet replica on gpu 1 slot 6; it must appear without a reload
        page.evaluate("window.__no_reload = 42")
        obs, plan, cluster = demo_tick(time.time(), extra_replica=True)
        state.update(obs, plan, cluster, demo_models(), slo_p99_ms={"resnet": 50.0, "bert": 200.0})
        page.wait_for_selector("article.gpu[data-gpu='node-a/1'] .inst[data-start='6'] "
                               ".rep[data-replica='resnet-2']", timeout=5_000)
        assert page.evaluate("window.__no_reload") == 42
        assert _replicas_on_page(page)["resnet-2"] == ["node-a/1", "6", "starting"]
        assert page.locator("article.gpu[data-gpu='node-a/1'] .inst.planned").count() == 0
        page.screenshot(path=str(ARTIFACTS / "ui-scaled.png"), full_page=True)
    finally:
        page.close()


def test_phone_width(served, browser):
    _, handle = served
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    try:
        page.goto(handle.url + "/ui")
        page.wait_for_selector("article.gpu .rep[data-replica]", timeout=10_000)
        # nothing overflows sideways on a phone
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0
        page.screenshot(path=str(ARTIFACTS / "ui-phone.png"), full_page=True)
    finally:
        page.close()


def test_crash_looping_replica_is_shown_with_its_error(served, browser):
    """A replica in CrashLoopBackOff: its slot says so, with restarts and the wait; hovering
    shows the last error lines; the header names it. Runs last: it changes the served state."""
    state, handle = served
    obs, plan, cluster = demo_tick(time.time())
    reps = tuple(replace(r, state=ReplicaState.CRASHLOOP) if r.id == "resnet-1" else r for r in cluster.replicas)
    cluster = replace(cluster, replicas=reps)
    err = "E1201 model_lifecycle.cc:642] failed to load 'resnet': RuntimeError: cannot open weights"
    status = build_status(
        cluster, frontdoor="http://127.0.0.1:8000", metrics_api=None, prometheus=None,
        endpoints={r.id: ReplicaEndpoint(None, None) for r in reps},
        health={"resnet-1": ReplicaHealth(restarts=3, next_restart_in_s=37.0, last_error=(err,), exit_code=1)},
    )
    state.update(obs, plan, cluster, demo_models(), status=status, slo_p99_ms={"resnet": 50.0, "bert": 200.0})
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(handle.url + "/ui")
        sel = "article.gpu .rep[data-replica='resnet-1']"
        page.wait_for_selector(sel + ".crashloop", timeout=10_000)
        assert page.inner_text(sel + " .rep-state") == "crashloop · 3 restarts · retry in 37 s"
        assert "cannot open weights" in page.get_attribute(sel, "title")
        page.wait_for_function("document.getElementById('conn').textContent.includes('crash-looping: resnet-1')",
                               timeout=5_000)
        page.screenshot(path=str(ARTIFACTS / "ui-crashloop.png"), full_page=True)
    finally:
        page.close()
