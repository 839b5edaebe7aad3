"""Pure pieces of the local backend: first placement, status document, Triton counter parsing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autoscaler.act.local.probe import ReplicaCounters, load_between, parse_counters
from autoscaler.config import parse_cluster, parse_models
from autoscaler.mig import Placement
from autoscaler.policy.types import ActionKind, ClusterState, Replica, ReplicaState
from autoscaler.runtime.local_setup import initial_actions, local_gpus
from autoscaler.status import ReplicaEndpoint, ReplicaNumbers, build_status, render_table

REPO = Path(__file__).resolve().parents[2] / "triton_models"


def _configs(ha: bool):
    models = parse_models(
        {
            "models": [
                {
                    "name": "resnet",
                    "model_dir": str(REPO / "resnet"),
                    "slo": {"p99_ms": 150},
                    "min_replicas": 1,
                    "high_availability": ha,
                    "profiles": ["1g.10gb", "2g.20gb"],
                    "capacity": {"1g.10gb": 58, "2g.20gb": 113},
                },
                {
                    "name": "rnn",
                    "model_dir": str(REPO / "rnn"),
                    "slo": {"p99_ms": 150},
                    "min_replicas": 2,
                    "profiles": ["2g.20gb"],
                    "capacity": {"2g.20gb": 145},
                },
            ]
        }
    )
    cluster = parse_cluster(
        {
            "gpus": [
                {
                    "node": "n",
                    "product": "A100-SXM4-80GB",
                    "count": 2,
                    "emulated": True,
                    "layouts": [["3g.40gb@0", "1g.10gb@6"], []],
                }
            ]
        }
    )
    return models, cluster


def test_initial_placement_is_the_planners_min_replicas_on_carved_instances():
    models, cluster = _configs(ha=False)
    gpus, uuids = local_gpus(cluster)
    assert uuids == {}
    acts = initial_actions(models, cluster, ClusterState(gpus=tuple(gpus)))
    creates = [(a.model, a.gpu, a.profile, a.start) for a in acts if a.kind is ActionKind.CREATE]
    assert sorted(c[0] for c in creates) == ["resnet", "rnn", "rnn"]  # min_replicas, no more
    assert ("resnet", "n/0", "1g.10gb", 6) in creates  # the idle 1g@6 is used as it is
    assert len({(c[1], c[3]) for c in creates}) == 3  # no instance used twice
    # rnn's 2g instances are carved first (the contract: a CREATE needs its instance),
    # on the GPU already in use rather than a second one (fewest GPUs)
    (cut,) = [a for a in acts if a.kind is ActionKind.REPARTITION]
    assert acts.index(cut) < min(i for i, a in enumerate(acts) if a.kind is ActionKind.CREATE)
    assert {(c[1], c[2], c[3]) for c in creates if c[0] == "rnn"} <= {("n/0", str(p.profile), p.start)
                                                                      for p in cut.layout}
    assert acts[-1].kind is ActionKind.WAIT_READY


def test_high_availability_places_two_replicas_on_distinct_gpus():
    models, cluster = _configs(ha=True)
    gpus, _ = local_gpus(cluster)
    acts = initial_actions(models, cluster, ClusterState(gpus=tuple(gpus)))
    resnet = [a.gpu for a in acts if a.kind is ActionKind.CREATE and a.model == "resnet"]
    assert len(resnet) == 2 and len(set(resnet)) == 2


def test_existing_replicas_count_toward_min_replicas():
    models, cluster = _configs(ha=False)
    gpus, _ = local_gpus(cluster)
    running = (Replica("r1", "rnn", "2g.20gb", "n/1", 0), Replica("r2", "rnn", "2g.20gb", "n/1", 2))
    gpus = [g if g.id != "n/1" else replace(g, layout=(Placement(0, "2g.20gb"), Placement(2, "2g.20gb")))
            for g in gpus]
    acts = initial_actions(models, cluster, ClusterState(gpus=tuple(gpus), replicas=running))
    assert [a.model for a in acts if a.kind is ActionKind.CREATE] == ["resnet"]


def test_status_document_keys_and_unknowns_stay_null():
    state = ClusterState(
        replicas=(
            Replica("a", "rnn", "1g.10gb", "n/0", 6, ReplicaState.READY),
            Replica("b", "bert", "3g.40gb", "n/0", 0, ReplicaState.STARTING),
        )
    )
    doc = build_status(
        state,
        frontdoor="http://127.0.0.1:1",
        metrics_api="http://127.0.0.1:2",
        prometheus=None,
        endpoints={"a": ReplicaEndpoint(9001, 42)},
        numbers={"a": ReplicaNumbers(12.345, 30.0)},
    )
    assert set(doc) >= {"frontdoor", "metrics_api", "prometheus", "replicas"}
    assert [r["model"] for r in doc["replicas"]] == ["bert", "rnn"]
    b, a = doc["replicas"]
    assert a == {
        "id": "a",
        "model": "rnn",
        "profile": "1g.10gb",
        "gpu": "n/0",
        "start": 6,
        "port": 9001,
        "state": "ready",
        "pid": 42,
        "req_s": 12.35,
        "p99_ms": 30.0,
    }
    assert b["port"] is None and b["req_s"] is None and b["state"] == "starting"
    table = render_table(doc)
    assert "n/0@6" in table and "12.3" in table and "direct scrape" in table


TRITON = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="rnn",version="1"} 120
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="rnn",reason="BACKEND",version="1"} 3
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="rnn",version="1"} 2
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="rnn",version="1"} 123
nv_inference_request_summary_us_sum{model="rnn",version="1"} 1000
nv_inference_request_summary_us{model="rnn",version="1",quantile="0.99"} 25000
"""


def test_parse_counters_and_rate_between_samples():
    cur = parse_counters(TRITON, t_s=12.0)
    assert (cur.pending, cur.completed, cur.p99_us) == (2, 123, 25000)
    prev = ReplicaCounters(t_s=10.0, pending=0, completed=103, p99_us=None)
    load = load_between(prev, cur)
    assert load.req_s == 10.0 and load.p99_ms == 25.0
    # a restart resets the counters: no rate rather than a negative one
    assert load_between(ReplicaCounters(10.0, 0, 500, None), cur).req_s is None
    # no series at all: unknown, never zero
    empty = parse_counters("", t_s=1.0)
    assert empty.completed is None and empty.pending is None
    assert load_between(None, cur).req_s is None
