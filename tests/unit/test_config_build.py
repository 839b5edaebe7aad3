"""From config to the core's values: ModelSpec per model and the initial ClusterState."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoscaler.config import (
    ConfigError,
    initial_cluster_state,
    load_capacity_file,
    load_cluster,
    load_demand,
    load_models,
    model_specs,
    parse_cluster,
    parse_models,
    validate_pair,
)
from autoscaler.mig import Placement

REPO = Path(__file__).resolve().parents[2]

CLUSTER = {
    "gpus": [
        {
            "node": "node-a",
            "product": "A100-SXM4-80GB",
            "count": 2,
            "layouts": [["3g.40gb@0", "3g.40gb@4"], ["7g.80gb@0"]],
        },
        {"node": "node-a", "product": "A100-SXM4-80GB", "layout": ["1g.10gb@6"]},
        {"node": "node-b", "product": "H100-SXM5-80GB", "emulated": False},
    ],
    "rdma_pool": {"nodes": [{"name": "rdma-0", "product": "H100-SXM5-80GB", "gpus": 2, "fabric": "ib-a"}]},
}


def _model(**kw):
    return {"name": "m", "model_dir": "d", "slo": {"p99_ms": 100}, **kw}


def test_gpu_ids_count_per_node_and_rdma_nodes_are_whole_gpus() -> None:
    state = initial_cluster_state(parse_cluster(CLUSTER))
    assert [g.id for g in state.gpus] == [
        "node-a/0",
        "node-a/1",
        "node-a/2",
        "node-b/0",
        "rdma-0/0",
        "rdma-0/1",
    ]
    assert state.gpu("node-a/0").layout == (Placement(0, "3g.40gb"), Placement(4, "3g.40gb"))
    assert state.gpu("node-a/1").layout == (Placement(0, "7g.80gb"),)
    assert state.gpu("node-a/2").layout == (Placement(6, "1g.10gb"),)
    assert state.gpu("node-b/0").emulated is False and state.gpu("node-b/0").layout == ()
    rdma = state.gpu("rdma-0/1")
    assert (rdma.mig_enabled, rdma.rdma, rdma.fabric, rdma.product) == (False, True, "ib-a", "H100-SXM5-80GB")
    assert all(g.mig_enabled and not g.rdma for g in state.gpus[:4])
    assert state.replicas == ()


def test_one_layout_for_every_gpu_of_an_entry() -> None:
    cfg = parse_cluster({"gpus": [{"node": "n", "product": "A30-24GB", "count": 3, "layout": ["2g.12gb@2"]}]})
    assert [g.layout for g in initial_cluster_state(cfg).gpus] == [(Placement(2, "2g.12gb"),)] * 3


def test_profiles_derived_from_memory_and_filtered_by_capacity() -> None:
    models = parse_models(
        {
            "models": [
                _model(name="small", memory_gb=15, capacity={"2g.20gb": 90, "3g.40gb": 110, "1g.10gb": 60}),
                _model(name="any"),
                _model(
                    name="explicit", profiles=["3g.40gb", "1g.10gb"], capacity={"1g.10gb": 10, "3g.40gb": 30}
                ),
            ]
        }
    )
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB"}]})
    small, any_, explicit = model_specs(models, cluster)
    # 1g.10gb has 10 GB < 15 GB: dropped even though it has a capacity figure; 4g/7g have no figure.
    assert small.allowed_profiles == ("2g.20gb", "3g.40gb")
    assert dict(small.capacity) == {"2g.20gb": 90.0, "3g.40gb": 110.0}
    assert small.memory_gb == 15
    # no memory, no profiles, no capacity: every standard profile of the cluster, smallest first
    assert any_.allowed_profiles == ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    assert dict(any_.capacity) == {}
    assert explicit.allowed_profiles == ("3g.40gb", "1g.10gb")  # the user's order is kept


def test_memory_derivation_spans_products_in_the_cluster() -> None:
    cluster = parse_cluster(
        {"gpus": [{"node": "a", "product": "A100-SXM4-40GB"}, {"node": "b", "product": "H200-141GB"}]}
    )
    (spec,) = model_specs(parse_models({"models": [_model(memory_gb=39)]}), cluster)
    # A100-40GB: only 7g.40gb holds 39 GiB (39.50 usable); H200: 3g.71gb and up, 2g.35gb (32.50) is too small
    assert set(spec.allowed_profiles) == {"7g.40gb", "3g.71gb", "4g.71gb", "7g.141gb"}
    # what a profile holds is its usable memory, not the GB in its name: 40 GiB does not fit 7g.40gb
    (spec,) = model_specs(parse_models({"models": [_model(memory_gb=40)]}), cluster)
    assert set(spec.allowed_profiles) == {"3g.71gb", "4g.71gb", "7g.141gb"}


def test_a_profile_holds_its_usable_memory_not_its_name() -> None:
    """H200's 1g.18gb holds 16.00 GiB (read through NVML on a real H200, docs/mig-geometry.md):
    a 17 GiB model goes to 2g.35gb and up, and naming 1g.18gb for it is a config error."""
    from autoscaler.mig import get_product

    h200 = get_product("H200-141GB")
    assert h200.profile("1g.18gb").fit_gib == 16.0 and h200.profile("1g.18gb").usable_read
    cluster = parse_cluster({"gpus": [{"node": "b", "product": "H200-141GB"}]})
    (spec,) = model_specs(parse_models({"models": [_model(memory_gb=17)]}), cluster)
    assert spec.allowed_profiles[:2] == ("2g.35gb", "3g.71gb") and "1g.18gb" not in spec.allowed_profiles
    models = parse_models({"models": [_model(memory_gb=17, profiles=["1g.18gb"], capacity={"1g.18gb": 10})]})
    problems = validate_pair(models, cluster, check_dirs=False)
    assert any("profiles[0]: holds 16 GiB usable, less than memory_gb 17, got '1g.18gb'" in p for p in problems)
    # no reading published for H100 NVL: the estimate takes the lowest share read for the kind (H200's 16/18)
    nvl = get_product("H100-NVL-94GB").profile("1g.12gb")
    assert not nvl.usable_read and nvl.fit_gib == round(12 * 16.0 / 18.0, 2)


def test_capacity_file_is_read_relative_to_models_yaml_and_inline_wins(tmp_path: Path) -> None:
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump({"models": {"m": {"1g.10gb": 50, "2g.20gb": 80}}}))
    (tmp_path / "models.yaml").write_text(
        yaml.safe_dump(
            {
                "models": [
                    _model(
                        profiles=["1g.10gb", "2g.20gb", "3g.40gb"],
                        capacity_file="cap.yaml",
                        capacity={"2g.20gb": 85},
                    )
                ]
            }
        )
    )
    models = load_models(tmp_path / "models.yaml")
    assert models.base_dir == tmp_path.resolve()
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB"}]})
    (spec,) = model_specs(models, cluster)
    assert dict(spec.capacity) == {"1g.10gb": 50.0, "2g.20gb": 85.0}
    assert spec.allowed_profiles == ("1g.10gb", "2g.20gb")  # 3g has no figure: the planner cannot size it


def test_bad_capacity_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "cap.yaml").write_text("models: {m: {1g.10gb: -1, 2g.20gb: fast}}\n")
    with pytest.raises(ConfigError) as err:
        load_capacity_file(tmp_path / "cap.yaml")
    assert any("models.m.1g.10gb" in p and "-1" in p for p in err.value.problems)
    assert any("models.m.2g.20gb" in p and "'fast'" in p for p in err.value.problems)


def test_profile_invalid_for_every_product_in_cluster_is_an_error() -> None:
    models = parse_models({"models": [_model(profiles=["1g.5gb"], capacity={"1g.5gb": 10})]})
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB"}]})
    with pytest.raises(ConfigError) as err:
        model_specs(models, cluster)
    assert err.value.problems == [
        "models[0].profiles[0]: not valid for any GPU product in the cluster (A100-SXM4-80GB), got '1g.5gb'"
    ]


def test_multinode_spec() -> None:
    models = parse_models(
        {
            "models": [
                _model(
                    backend="multinode",
                    multinode={
                        "nodes_per_group": 2,
                        "gpus_per_node": 1,
                        "fabric": "ib-a",
                        "group_capacity_rps": 4,
                    },
                )
            ]
        }
    )
    (spec,) = model_specs(models, parse_cluster(CLUSTER))
    assert (spec.backend, spec.nodes_per_group, spec.gpus_per_node, spec.group_capacity_rps, spec.fabric) == (
        "multinode",
        2,
        1,
        4.0,
        "ib-a",
    )
    assert spec.allowed_profiles == () and dict(spec.capacity) == {}


def test_multinode_group_fits_when_one_node_has_enough_gpus() -> None:
    """rdma-0 has 2 GPUs but a group of 2 nodes needs 2 distinct nodes."""
    models = parse_models(
        {"models": [_model(backend="multinode", multinode={"nodes_per_group": 2, "group_capacity_rps": 4})]},
        base_dir=REPO,
    )
    problems = validate_pair(models, parse_cluster(CLUSTER))
    assert any("models[0].multinode.nodes_per_group: rdma_pool has only 1 node(s)" in p for p in problems)


def test_examples_build() -> None:
    models = load_models(REPO / "examples/models.yaml")
    cluster = load_cluster(REPO / "examples/cluster.yaml")
    assert validate_pair(models, cluster) == []
    specs = {s.name: s for s in model_specs(models, cluster)}
    assert set(specs) == {"resnet", "bert", "rnn", "llm"}
    assert "1g.10gb" not in specs["bert"].allowed_profiles  # 12 GB does not fit 10 GB
    assert specs["llm"].backend == "multinode"
    state = initial_cluster_state(cluster)
    assert sum(g.mig_enabled for g in state.gpus) == 2 and sum(g.rdma for g in state.gpus) == 2
    demand = load_demand(REPO / "examples/demand.yaml", list(specs))
    assert set(demand) == set(specs) and all(v > 0 for v in demand.values())
    assert cluster.policy.churn_budget == 4  # policy_config is cluster_cfg.policy


def test_demand_file_errors(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("resnet: -3\nbogus: 4\nbert: true\n")
    with pytest.raises(ConfigError) as err:
        load_demand(tmp_path / "d.yaml", ["resnet", "bert"])
    text = "\n".join(err.value.problems)
    assert "resnet: req/s must be a number >= 0, got -3" in text
    assert "bogus: unknown model" in text
    assert "bert: req/s must be a number >= 0, got True" in text


def test_config_objects_are_frozen() -> None:
    cluster = parse_cluster(CLUSTER)
    with pytest.raises(Exception):  # noqa: B017  (pydantic raises ValidationError for frozen instances)
        cluster.policy.tick_s = 1  # type: ignore[misc]


def test_hpa_defaults() -> None:
    pol = parse_cluster({"gpus": [{"node": "n", "product": "A30-24GB"}]}).policy
    assert pol.scale_down.stabilization_window_s == 300
    assert [(p.type, p.value, p.period_s) for p in pol.scale_up.policies] == [
        ("Percent", 100, 15),
        ("Pods", 4, 15),
    ]
    assert pol.scale_up.select_policy == "Max"


def test_a_partial_behavior_keeps_the_kubernetes_defaults_of_the_fields_left_out() -> None:
    gpus = [{"node": "n", "product": "A30-24GB"}]
    pol = parse_cluster({"gpus": gpus, "policy": {"scale_down": {"stabilization_window_s": 120},
                                                  "scale_up": {"select_policy": "Min"}}}).policy
    # scale-down keeps its -100% per 15 s policy (it used to end up with none: no scale-down at all)
    assert pol.scale_down.stabilization_window_s == 120
    assert [(p.type, p.value, p.period_s) for p in pol.scale_down.policies] == [("Percent", 100, 15)]
    assert pol.scale_up.select_policy == "Min" and pol.scale_up.stabilization_window_s == 0
    assert len(pol.scale_up.policies) == 2
    with pytest.raises(ConfigError) as e:
        parse_cluster({"gpus": gpus, "policy": {"scale_down": {"policies": []}}})
    assert any(m.startswith("policy.scale_down.policies: must list at least one policy") for m in e.value.problems)


def test_check_dirs_off_skips_only_the_model_directory(tmp_path: Path) -> None:
    models = parse_models(
        {"models": [_model(model_dir="nowhere", profiles=["1g.5gb"], capacity={"1g.5gb": 1})]}, base_dir=tmp_path
    )
    cluster = parse_cluster({"gpus": [{"node": "n", "product": "A100-SXM4-80GB"}]})
    on = validate_pair(models, cluster)
    off = validate_pair(models, cluster, check_dirs=False)
    assert any(".model_dir: no such directory" in p for p in on)
    assert not any(".model_dir" in p for p in off)
    assert off and all(p in on for p in off)  # the profile problem is still reported


def test_triton_max_batch_reads_the_dynamic_batcher_of_a_model_config(tmp_path: Path) -> None:
    """The batch Triton forms from separate requests: ``max_batch_size`` with ``dynamic_batching``,
    1 without it (or when the model cannot batch), None without a config."""
    from autoscaler.config import model_max_batches, triton_max_batch

    def model(name: str, text: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.pbtxt").write_text(text)
        return d

    on = model("on", 'name: "on"\n# max_batch_size: 64 (an old value)\nmax_batch_size: 8\n'
                     "dynamic_batching {\n  max_queue_delay_microseconds: 2000\n}\n")
    assert triton_max_batch(on) == 8
    assert triton_max_batch(model("off", 'name: "off"\nmax_batch_size: 8\n')) == 1
    assert triton_max_batch(model("zero", "max_batch_size: 0\ndynamic_batching { }\n")) == 1
    assert triton_max_batch(tmp_path) is None
    with pytest.raises(ConfigError, match="max_batch_size: must be >= 0, got -2"):
        triton_max_batch(model("neg", "max_batch_size: -2\ndynamic_batching { }\n"))
    # the example models: each repository's own config (resnet batches up to 8)
    assert model_max_batches(load_models(REPO / "examples" / "models.yaml"))["resnet"] == 8
