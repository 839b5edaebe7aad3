"""Local multinode glue, pure parts: the first placement of groups and the status document."""

from __future__ import annotations

from pathlib import Path

from autoscaler.config import load_cluster, load_models, model_specs
from autoscaler.policy.planner import plan
from autoscaler.policy.types import ActionKind, ClusterState, Replica, ReplicaState
from autoscaler.runtime.local_setup import initial_actions, local_gpus
from autoscaler.status import GroupView, ReplicaEndpoint, build_status, render_table

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example():
    m, c = load_models(EXAMPLES / "models.yaml"), load_cluster(EXAMPLES / "cluster.yaml")
    gpus, _ = local_gpus(c)
    return m, c, ClusterState(gpus=tuple(gpus))


def _as_created(state: ClusterState, actions) -> ClusterState:
    reps = [
        Replica(a.replica or f"{a.model}-{i}", a.model, a.profile, a.gpu, a.start, ReplicaState.READY, 0.0)
        for i, a in enumerate(actions)
        if a.kind is ActionKind.CREATE
    ]
    return ClusterState(gpus=state.gpus, replicas=tuple(reps))


def test_example_starts_one_llm_group_on_the_two_rdma_nodes():
    m, c, state = _example()
    assert {g.id for g in state.gpus if g.rdma} == {"rdma-0/0", "rdma-1/0"}
    llm = [a for a in initial_actions(m, c, state) if a.model == "llm" and a.kind is ActionKind.CREATE]
    assert [(a.kind, a.replica, a.gpu, a.profile) for a in llm] == [
        (ActionKind.CREATE, "llm-g0-0", "rdma-0/0", "whole"),
        (ActionKind.CREATE, "llm-g0-1", "rdma-1/0", "whole"),
    ]


def test_the_planner_keeps_the_initial_group():
    m, c, state = _example()
    llm_only = [s for s in model_specs(m, c) if s.name == "llm"]
    after = _as_created(state, [a for a in initial_actions(m, c, state) if a.model == "llm"])
    # No traffic yet (0 req/s) and no metrics yet (None): min_replicas holds the group.
    for demand in ({"llm": 0.0}, {}):
        p = plan(llm_only, demand, after)
        assert [a for a in p.actions if a.model == "llm"] == []


def test_a_second_group_is_not_placed_on_gpus_already_held():
    m, c, state = _example()
    after = _as_created(state, [a for a in initial_actions(m, c, state) if a.model == "llm"])
    assert [a for a in initial_actions(m, c, after) if a.model == "llm" and a.kind is ActionKind.CREATE] == []


def test_status_lists_a_group_once_with_its_members():
    reps = (
        Replica("llm-g0-0", "llm", "whole", "rdma-0/0", 0, ReplicaState.READY),
        Replica("llm-g0-1", "llm", "whole", "rdma-1/0", 0, ReplicaState.READY),
        Replica("rnn-0", "rnn", "1g.10gb", "node-a/0", 6, ReplicaState.READY),
    )
    members = (
        {"rank": 0, "pid": 10, "port": 9000, "state": "ready", "role": "leader", "gpu": "rdma-0/0"},
        {"rank": 1, "pid": 11, "port": None, "state": "ready", "role": "worker", "gpu": "rdma-1/0"},
    )
    doc = build_status(
        ClusterState(replicas=reps),
        frontdoor=None,
        metrics_api=None,
        prometheus=None,
        endpoints={"llm-g0": ReplicaEndpoint(9000, 10)},
        groups={"llm-g0": GroupView(("llm-g0-0", "llm-g0-1"), ("rdma-0/0", "rdma-1/0"), members)},
    )
    rows = {r["id"]: r for r in doc["replicas"]}
    assert set(rows) == {"llm-g0", "rnn-0"}
    g = rows["llm-g0"]
    assert (g["pid"], g["port"], g["gpus"]) == (10, 9000, ["rdma-0/0", "rdma-1/0"])
    assert [(x["rank"], x["pid"], x["port"], x["state"]) for x in g["members"]] == [
        (0, 10, 9000, "ready"),
        (1, 11, None, "ready"),
    ]
    assert "members" not in rows["rnn-0"]
    assert "rdma-0/0+rdma-1/0" in render_table(doc)
