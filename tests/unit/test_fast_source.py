"""The burst layer's 1 s direct scrape: arrivals inferred from completions + queue growth."""

from __future__ import annotations

import pytest

from autoscaler.observe.fast import FastScrape, WithFast
from autoscaler.policy.types import ModelSignals


def expo(success: float, pending: float, queue_us: float, infer_us: float, failure: float = 0.0) -> str:
    return "\n".join([
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="resnet",version="1"}} {success}',
        "# TYPE nv_inference_request_failure counter",
        f'nv_inference_request_failure{{model="resnet",reason="REJECTED",version="1"}} {failure}',
        "# TYPE nv_inference_queue_duration_us counter",
        f'nv_inference_queue_duration_us{{model="resnet",version="1"}} {queue_us}',
        "# TYPE nv_inference_compute_infer_duration_us counter",
        f'nv_inference_compute_infer_duration_us{{model="resnet",version="1"}} {infer_us}',
        "# TYPE nv_inference_pending_request_count gauge",
        f'nv_inference_pending_request_count{{model="resnet",version="1"}} {pending}',
        "",
    ])


class Pages:
    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        self.down: set[str] = set()

    def fetch(self, url: str, timeout_s: float) -> str:
        if url in self.down:
            raise ConnectionError(url)
        return self.text[url]


def test_arrivals_are_completions_plus_failures_plus_queue_growth():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1"), "r2": ("resnet", "u2")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(1000, 4, 0, 0), "u2": expo(500, 0, 0, 0)}
    fs.sample(100.0)
    # 3 s later: r1 completed 600 (200/s) with 1 failure and its queue grew 4 -> 154; r2 completed 150 (50/s)
    pages.text = {"u1": expo(1600, 154, 600 * 30_000, 600 * 20_000, failure=3),
                  "u2": expo(650, 0, 150 * 10_000, 150 * 20_000)}
    fs.sample(103.0)
    f = fs.signals(103.0)["resnet"]
    assert f.t_s == 103.0 and f.window_s == pytest.approx(3.0)
    assert f.completed_rps == pytest.approx(250.0)
    assert f.arrival_rps == pytest.approx(250.0 + 1.0 + 50.0)
    assert f.pending == 154
    assert f.avg_queue_ms == pytest.approx((600 * 30 + 150 * 10) / 750)
    assert f.avg_compute_ms == pytest.approx(20.0)


def test_a_replica_that_joined_inside_the_window_counts_over_the_models_span():
    # r1 serves 70 req/s, scraped every second; r2 becomes ready and is scraped at
    # 102.9 and, for the tick, at 103.0, having completed 6 requests between. Over its
    # own 0.1 s that is 60 req/s; over the model's 3 s it is 2 req/s.
    pages = Pages()
    targets = {"r1": ("resnet", "u1")}
    fs = FastScrape(lambda: targets, window_s=3.0, fetch=pages.fetch)
    for i, t in enumerate((100.0, 101.0, 102.0)):
        pages.text = {"u1": expo(70 * i, 0, 0, 0)}
        fs.sample(t)
    targets["r2"] = ("resnet", "u2")
    pages.text = {"u1": expo(70 * 2.9, 0, 0, 0), "u2": expo(10, 1, 0, 0)}
    fs.sample(102.9)
    pages.text = {"u1": expo(70 * 3, 0, 0, 0), "u2": expo(16, 0, 0, 0)}
    fs.sample(103.0)
    f = fs.signals(103.0)["resnet"]
    assert f.window_s == pytest.approx(3.0)
    assert f.completed_rps == pytest.approx(70.0 + 6 / 3.0)
    assert f.arrival_rps == pytest.approx(70.0 + 6 / 3.0 - 1 / 3.0)  # its queue fell by one
    # a model whose only scrapes are a moment apart has no rate yet, not a huge one
    solo = FastScrape(lambda: {"r2": ("resnet", "u2")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u2": expo(10, 0, 0, 0)}
    solo.sample(200.0)
    pages.text = {"u2": expo(16, 0, 0, 0)}
    solo.sample(200.1)
    assert solo.signals(200.1) == {}


def test_no_fresh_pair_of_scrapes_means_no_fast_signals_not_zero():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, stale_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(10, 0, 0, 0)}
    fs.sample(0.0)
    assert fs.signals(0.0) == {}  # one scrape: no rate yet
    fs.sample(1.0)
    assert "resnet" in fs.signals(1.0)
    pages.down.add("u1")
    fs.sample(2.0)
    fs.sample(9.0)
    assert fs.signals(9.0) == {}  # the replica stopped answering: stale, absent
    # idle replicas: no request in the window -> averages undefined
    pages.down.clear()
    fs.sample(10.0)
    fs.sample(11.0)
    f = fs.signals(11.0)["resnet"]
    assert f.arrival_rps == 0.0 and f.avg_queue_ms is None and f.avg_compute_ms is None


def test_with_fast_attaches_to_the_main_sources_signals_only():
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, fetch=pages.fetch)
    pages.text = {"u1": expo(0, 0, 0, 0)}
    fs.sample(0.0)
    pages.text = {"u1": expo(300, 0, 0, 0)}

    class Inner:
        last_notes = ("n",)

        def read(self, models, replicas, now_s):
            return {"resnet": ModelSignals(model="resnet", t_s=now_s, request_rate=80.0), "bert": None}, {}

    src = WithFast(Inner(), fs)
    sigs, _ = src.read(["resnet", "bert"], [], 2.0)
    assert sigs["bert"] is None  # blind stays blind
    assert sigs["resnet"].request_rate == 80.0
    assert sigs["resnet"].fast is not None and sigs["resnet"].fast.arrival_rps == pytest.approx(150.0)
    assert src.last_notes == ("n",)


def test_a_tick_that_takes_the_idle_hooks_rounds_never_runs_one_itself():
    """Hundreds of pods (``fresh_each_read=False``): a round takes seconds, so a tick reads the
    idle hook's last rounds even when the next is due, and its actions do not wait for one."""
    pages = Pages()
    fetched: list[float] = []

    def fetch(url: str, timeout_s: float) -> str:
        fetched.append(timeout_s)
        return pages.fetch(url, timeout_s)

    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, fetch=fetch)
    pages.text = {"u1": expo(0, 0, 0, 0)}
    fs.sample_if_due(0.0)
    pages.text = {"u1": expo(200, 0, 0, 0)}
    fs.sample_if_due(1.0)

    class Inner:
        def read(self, models, replicas, now_s):
            return {"resnet": ModelSignals(model="resnet", t_s=now_s, request_rate=80.0)}, {}

    src = WithFast(Inner(), fs, fresh_each_read=False)
    pages.text = {"u1": expo(900, 0, 0, 0)}
    sigs, _ = src.read(["resnet"], [], 2.5)  # a round is due (1.5 s since the last)
    assert len(fetched) == 2  # the hook's two rounds only
    assert sigs["resnet"].fast.arrival_rps == pytest.approx(200.0)  # their rates, 1.5 s old
    fresh = WithFast(Inner(), fs)  # a few local replicas: the tick scrapes for itself
    assert fresh.read(["resnet"], [], 2.5)[0]["resnet"].fast.arrival_rps > 200.0 and len(fetched) == 3


def test_a_pool_of_workers_reads_the_same_rates_and_counts_a_pod_that_does_not_answer():
    """The Kubernetes controller's form: fetches side by side; one pod down is a failure of that
    round (in ``last``, for status) and its model goes on with the pods that answered."""
    pages = Pages()
    targets = {f"r{i}": ("resnet", f"u{i}") for i in range(6)}
    pooled = FastScrape(lambda: targets, window_s=3.0, fetch=pages.fetch, workers=4)
    serial = FastScrape(lambda: targets, window_s=3.0, fetch=pages.fetch)
    try:
        for t, done in ((100.0, 0.0), (103.0, 300.0)):
            pages.text = {f"u{i}": expo(done * (i + 1), 0, 0, 0) for i in range(6)}
            pooled.sample(t)
            serial.sample(t)
        assert pooled.signals(103.0)["resnet"] == serial.signals(103.0)["resnet"]
        assert pooled.signals(103.0)["resnet"].completed_rps == pytest.approx(100.0 * 21)
        assert {k: pooled.last[k] for k in ("t_s", "targets", "failures", "error")} == {
            "t_s": 103.0, "targets": 6, "failures": 0, "error": None}
        pages.down = {"u2"}
        pooled.sample(104.0)
        assert pooled.last["targets"] == 6 and pooled.last["failures"] == 1
        assert "r2: scrape of u2 failed: ConnectionError" in pooled.last["error"]
    finally:
        pooled.close()
    assert pooled._pool._shutdown


def test_an_idle_hook_faster_than_the_interval_scrapes_once_a_second():
    pages = Pages()
    pages.text = {"u1": expo(0, 0, 0, 0)}
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, fetch=pages.fetch, interval_s=1.0)
    # a driver slicing its wait in halves calls every 0.5 s: a round at 0, 1.0, 2.0 -- not 1.5 s apart
    rounds = [t for t in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5) if fs.sample_if_due(t)]
    assert rounds == [0.0, 1.0, 2.0]


def test_workers_below_one_are_refused():
    with pytest.raises(ValueError, match="workers: must be >= 1, got 0"):
        FastScrape(dict, workers=0)


def test_rounds_that_take_long_come_further_apart_and_stay_usable():
    """``max_duty`` 0.25: a round of 2 s puts the next 8 s after it (the controller keeps
    three quarters of the time), and the model's signals are not stale in between."""
    pages = Pages()
    # the timer is read at each round's start and end: the first round takes 0.01 s, the second 2 s
    timer = iter([0.0, 0.01, 5.0, 7.0, 20.0, 20.01]).__next__
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, fetch=pages.fetch, max_duty=0.25, timer=timer)
    pages.text = {"u1": expo(0, 0, 0, 0)}
    assert fs.sample_if_due(0.0)
    assert fs.gap_s == 1.0  # a quick round: every second
    pages.text = {"u1": expo(100, 0, 0, 0)}
    assert fs.sample_if_due(1.0)
    assert fs.gap_s == 8.0 and fs.last["next_in_s"] == 8.0
    # 6 s after that round the model still has its signals (stale only after two gaps)
    assert fs.signals(7.0)["resnet"].completed_rps == pytest.approx(100.0)
    pages.text = {"u1": expo(800, 0, 0, 0)}
    assert [t for t in (2.0, 4.0, 6.0, 8.0, 9.0) if fs.sample_if_due(t)] == [9.0]  # 8 s after 1.0
    # a quick round again: back to every second; the rate is over the 8 s between the rounds
    assert fs.gap_s == 1.0
    assert fs.signals(10.0)["resnet"].completed_rps == pytest.approx(700 / 8.0)
    with pytest.raises(ValueError, match="max_duty"):
        FastScrape(dict, max_duty=0.0)


def test_a_due_round_that_would_make_the_tick_late_waits_unless_the_signals_would_go_stale():
    """Rounds of 1.2 s (``max_duty`` 0.25: due 4.8 s apart). With 0.5 s before the next tick a
    due round waits, so the tick starts on time; with 2 s it runs; and past 1.5 gaps it runs
    whatever the tick, since at two gaps the last round's signals are stale."""
    pages = Pages()
    pages.text = {"u1": expo(0, 0, 0, 0)}
    clock = [0.0]

    def timer() -> float:  # read at a round's start and end: each round takes 1.2 s
        clock[0] += 1.2
        return clock[0]

    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, fetch=pages.fetch, max_duty=0.25, timer=timer)
    assert fs.sample_if_due(0.0, free_s=0.5)  # the first round: nothing to go by yet
    assert fs.gap_s == pytest.approx(4.8)
    assert not fs.sample_if_due(4.0, free_s=10.0)  # not due
    assert not fs.sample_if_due(5.0, free_s=0.5)  # due, but 1.2 s would overrun the 0.5 s left
    assert fs.sample_if_due(5.5, free_s=2.0)  # room for it
    assert not fs.sample_if_due(11.0, free_s=0.5)
    assert fs.sample_if_due(12.9, free_s=0.5)  # 7.4 s since the last: past 1.5 gaps, it runs
    assert fs.sample_if_due(20.0)  # no tick waiting (outside a driver's wait)


def test_the_signals_between_rounds_are_the_last_rounds_computed_once(monkeypatch):
    """The wake hooks ask every half second; only a round brings anything new, so the
    signals are computed once per round, as of that round, and again after the next."""
    pages = Pages()
    fs = FastScrape(lambda: {"r1": ("resnet", "u1")}, window_s=3.0, fetch=pages.fetch)
    assert fs.round_signals() == {}  # no round yet: no signals, never zeros
    computed = []
    real = fs.signals
    monkeypatch.setattr(fs, "signals", lambda now_s: computed.append(now_s) or real(now_s))
    pages.text = {"u1": expo(1000, 0, 0, 0)}
    fs.sample(100.0)
    pages.text = {"u1": expo(1200, 0, 0, 0)}
    fs.sample(102.0)
    first = fs.round_signals()
    assert first["resnet"].completed_rps == pytest.approx(100.0) and first["resnet"].t_s == 102.0
    assert fs.round_signals() is first and fs.round_signals() is first
    assert computed == [102.0]
    pages.text = {"u1": expo(1500, 0, 0, 0)}
    fs.sample(103.0)
    assert fs.round_signals()["resnet"].completed_rps == pytest.approx(500 / 3)
    assert computed == [102.0, 103.0]
