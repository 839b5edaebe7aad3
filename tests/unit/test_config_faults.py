"""Configuration and offline commands: what a reviewer's bad inputs must get.

Each test names the input and the behaviour: a one-line refusal (exit 2, the field or
option and the value, no traceback), a file left alone, or output that reads back as
what was written.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autoscaler.act.kubernetes.crd import name_schema
from autoscaler.act.kubernetes.migmodel import from_migmodel
from autoscaler.cli import app
from autoscaler.config import (
    ConfigError,
    load_cluster,
    load_models,
    model_specs,
    parse_cluster,
    parse_models,
    validate_pair,
)
from autoscaler.config import io as yio
from autoscaler.config.io import load_yaml, parse_documents

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_MODELS = REPO / "examples" / "models.yaml"
EXAMPLE_CLUSTER = REPO / "examples" / "cluster.yaml"


def _model(name: str = "resnet", **kw: Any) -> dict[str, Any]:
    return {"name": name, "model_dir": str(REPO / "triton_models" / "resnet"), "slo": {"p99_ms": 150},
            "profiles": ["1g.10gb", "2g.20gb"], "capacity": {"1g.10gb": 58, "2g.20gb": 113}, **kw}


def _cluster(**kw: Any) -> dict[str, Any]:
    base = yaml.safe_load(EXAMPLE_CLUSTER.read_text())
    base.update(kw)
    return base


def _problems(fn, *args) -> list[str]:
    with pytest.raises(ConfigError) as e:
        fn(*args)
    return e.value.problems


def _one_line_refusal(res, *words: str) -> None:
    """Exit 2, no traceback, and a stderr line holding every word."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines and any(all(w in ln for w in words) for ln in lines), lines


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1))  # JSON quotes every string: the input is unambiguous
    return path


# ---------------------------------------------------------------- 1. model names are DNS-1035 labels


def test_a_model_name_starting_with_a_digit_is_refused_it_would_name_a_service():
    problems = _problems(parse_models, {"models": [_model("9resnet")]})
    assert len(problems) == 1
    assert "models[0].name" in problems[0] and "DNS-1035" in problems[0] and "'9resnet'" in problems[0]


def test_a_migmodel_named_with_a_leading_digit_is_refused_by_import_and_the_crd_pattern():
    obj = {"apiVersion": "migscale.io/v1alpha1", "kind": "MigModel", "metadata": {"name": "9resnet"},
           "spec": {k: v for k, v in _model().items() if k != "name"}}
    model, problems = from_migmodel(obj)
    assert model is None and any("metadata.name" in p and "'9resnet'" in p for p in problems)
    pattern = re.compile(name_schema()["pattern"])
    assert not pattern.match("9resnet") and pattern.match("resnet") and pattern.match("r9-x")


# ---------------------------------------------------------------- 2. capacity files are checked


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ({"resnet": {"1g.10gb": 58, "2g.20g": 113}}, "models.resnet.2g.20g", "'2g.20g'"),
        ({"resnet": {"1g.10gb": 58, "9g.90gb": 5}}, "models.resnet.9g.90gb", "'9g.90gb'"),
        ({"resnet": {"1g.10gb": 58}, "resnt": {"1g.10gb": 1}}, "models.resnt", "'resnt'"),
    ],
    ids=["misspelt-profile", "unknown-profile", "unknown-model"],
)
def test_a_capacity_file_entry_that_would_be_dropped_is_refused(tmp_path, table, key, value):
    _write(tmp_path / "cap.yaml", {"models": table})
    m = _model(capacity_file="cap.yaml")
    del m["capacity"]
    _write(tmp_path / "models.yaml", {"models": [m]})
    _write(tmp_path / "cluster.yaml", _cluster())
    models, cluster = load_models(tmp_path / "models.yaml"), load_cluster(tmp_path / "cluster.yaml")
    lines = validate_pair(models, cluster)
    assert [ln for ln in lines if key in ln and value in ln and "cap.yaml" in ln], lines
    with pytest.raises(ConfigError, match=re.escape(key)):
        model_specs(models, cluster)
    res = _run("validate", "--no-preflight", str(tmp_path / "models.yaml"), str(tmp_path / "cluster.yaml"))
    _one_line_refusal(res, "cap.yaml", key, value)


# ---------------------------------------------------------------- 3. slo.queue_ms is gone


def test_slo_queue_ms_is_an_unknown_key_since_nothing_reads_it():
    problems = _problems(parse_models, {"models": [_model(slo={"p99_ms": 150, "queue_ms": 20})]})
    assert problems == ["models[0].slo.queue_ms: unknown key (allowed: p99_ms), got 20"]


# ---------------------------------------------------------------- 4. rdma_pool names Kubernetes things


def _pool(**kw: Any) -> dict[str, Any]:
    pool = copy.deepcopy(_cluster()["rdma_pool"])
    pool.update(kw)
    return pool


@pytest.mark.parametrize(
    ("pool", "field", "value"),
    [
        (_pool(fabric_label="fabric label"), "rdma_pool.fabric_label", "'fabric label'"),
        (_pool(fabric_label="Example.com/fabric"), "rdma_pool.fabric_label", "'Example.com/fabric'"),
        (_pool(fabric_label=""), "rdma_pool.fabric_label", "''"),
        (_pool(rdma_resource="nvidia.com/gpu"), "rdma_pool.rdma_resource", "'nvidia.com/gpu'"),
        (_pool(rdma_resource="rdma_shared_device_a"), "rdma_pool.rdma_resource", "'rdma_shared_device_a'"),
        (_pool(rdma_resource="kubernetes.io/rdma"), "rdma_pool.rdma_resource", "'kubernetes.io/rdma'"),
        (_pool(rdma_resource="rdma/a b"), "rdma_pool.rdma_resource", "'rdma/a b'"),
        (_pool(nodes=[{"name": "rdma-0", "product": "H100-SXM5-80GB", "fabric": "ib a"}]),
         "rdma_pool.nodes[0].fabric", "'ib a'"),
        (_pool(nodes=[{"name": "rdma-0", "product": "H100-SXM5-80GB", "fabric": "f" * 64}]),
         "rdma_pool.nodes[0].fabric", "'ffff"),
    ],
    ids=["label-space", "label-upper-prefix", "label-empty", "gpu-resource", "no-domain", "k8s-domain",
         "resource-space", "fabric-space", "fabric-long"],
)
def test_rdma_pool_names_that_kubernetes_would_refuse_are_refused(pool, field, value):
    problems = _problems(parse_cluster, _cluster(rdma_pool=pool))
    assert len(problems) == 1 and field in problems[0] and value in problems[0], problems


def test_rdma_pool_takes_qualified_names_and_refuses_the_gpu_resource():
    cfg = parse_cluster(_cluster(rdma_pool=_pool(fabric_label="net.example.com/fabric_1",
                                                 rdma_resource="rdma.example.com/hca_shared")))
    assert (cfg.rdma_pool.fabric_label, cfg.rdma_pool.rdma_resource) == (
        "net.example.com/fabric_1", "rdma.example.com/hca_shared")
    problems = _problems(parse_cluster, _cluster(rdma_pool=_pool(rdma_resource="nvidia.com/gpu")))
    assert problems == [("rdma_pool.rdma_resource: is a GPU resource; give the RDMA device plugin's resource "
                         "(it would replace the pods' GPU limit), got 'nvidia.com/gpu'")]


def test_a_multinode_fabric_must_be_a_label_value():
    llm = yaml.safe_load(EXAMPLE_MODELS.read_text())["models"][3]
    llm["multinode"]["fabric"] = "ib a"
    problems = _problems(parse_models, {"models": [llm]})
    assert len(problems) == 1 and "models[0].multinode.fabric" in problems[0] and "'ib a'" in problems[0]


# ---------------------------------------------------------------- 5. one YAML reader, one writer


_YAML_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["1e3", "1E3", "+1e3", "1.5e3", "0o10", "0x1F", "010", "2:30", "1_000", "yes", "No", "on", "OFF", "y",
     "~", "null", "True", "FALSE", ".inf", "-.INF", ".nan", "2024-01-01", "2001-12-14t21:59:43.10-05:00",
     "<<", "=", "", " ", "1g.10gb", "0", "-0", ".5", "5."]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_YAML_TEXT, min_size=1, max_size=4))
def test_every_string_the_writer_emits_reads_back_as_the_same_string(words: list[str]):
    doc = {"k": words, **{w: w for w in words}}
    text = yio.dump_yaml(doc)
    assert parse_documents(text, "x.yaml") == [doc]
    assert yaml.safe_load(text) == doc  # a YAML 1.1 reader too


def test_shared_objects_are_written_out_in_full_without_anchors():
    shared = {"limits": {"nvidia.com/gpu": 1}}
    text = yio.dump_yaml_all([{"a": shared, "b": shared}, {"c": shared}])
    assert "&" not in text and "*" not in text
    assert list(yaml.safe_load_all(text)) == [{"a": shared, "b": shared}, {"c": shared}]


def _files_1e3(tmp_path: Path) -> tuple[Path, Path]:
    """models.yaml and cluster.yaml whose strings look like numbers to a YAML reader."""
    llm = yaml.safe_load(EXAMPLE_MODELS.read_text())["models"][3]
    llm["model_dir"] = str(REPO / "triton_models" / "llm")
    llm["multinode"]["fabric"] = "1e3"
    (tmp_path / "1e3").mkdir()
    (tmp_path / "1e3" / "config.pbtxt").write_text('name: "resnet"\n')
    models = _write(tmp_path / "models.yaml", {"models": [_model(model_dir="1e3"), llm]})
    cluster = _cluster(namespace="1e3")
    for node in cluster["rdma_pool"]["nodes"]:
        node["fabric"] = "1e3"
    return models, _write(tmp_path / "cluster.yaml", cluster)


def test_render_migmodels_output_imports_back_when_strings_look_like_numbers(tmp_path):
    models, cluster = _files_1e3(tmp_path)
    res = _run("render", str(models), str(cluster), "--migmodels")
    assert res.exit_code == 0, res.output
    (tmp_path / "mm.yaml").write_text(res.stdout)
    imp = _run("import", str(tmp_path / "mm.yaml"), "-o", str(tmp_path / "back.yaml"))
    assert imp.exit_code == 0, imp.output
    again = load_models(tmp_path / "back.yaml")
    assert [m.model_dir for m in again.models] == ["1e3", str(REPO / "triton_models" / "llm")]
    assert again.models[1].multinode.fabric == "1e3"
    assert again.models == load_models(models).models


def test_render_output_keeps_number_like_strings_as_strings_and_has_no_aliases(tmp_path):
    models, cluster = _files_1e3(tmp_path)
    res = _run("render", str(models), str(cluster))
    assert res.exit_code == 0, res.output
    assert "&id0" not in res.stdout and "*id0" not in res.stdout
    objs = parse_documents(res.stdout, "render")
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "ConfigMap"} == {"1e3"}
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    terms = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["affinity"]["nodeAffinity"]
    exprs = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "migscale.io/fabric", "operator": "In", "values": ["1e3"]} in exprs


@pytest.mark.parametrize(
    ("text", "value"),
    [("max_replicas: 010", 10), ("max_replicas: 0o10", 8)],
)
def test_integers_are_read_as_yaml_1_2_core_reads_them(tmp_path, text, value):
    (tmp_path / "m.yaml").write_text(
        f"models:\n- {{name: a, model_dir: a, slo: {{p99_ms: 150}}, {text}, capacity: {{1g.10gb: 5}}}}\n"
    )
    assert load_models(tmp_path / "m.yaml").models[0].max_replicas == value


@pytest.mark.parametrize(
    ("text", "field", "got"),
    [
        ("slo: {p99_ms: 2:30}", "models[0].slo.p99_ms", "'2:30'"),
        ("slo: {p99_ms: 1_500}", "models[0].slo.p99_ms", "'1_500'"),
        ("slo: {p99_ms: 150}, high_availability: yes", "models[0].high_availability", "'yes'"),
    ],
)
def test_yaml_1_1_only_numbers_and_booleans_are_text_and_refused_by_name(tmp_path, text, field, got):
    (tmp_path / "m.yaml").write_text(f"models:\n- {{name: a, model_dir: a, {text}, capacity: {{1g.10gb: 5}}}}\n")
    problems = _problems(load_models, tmp_path / "m.yaml")
    assert len(problems) == 1 and field in problems[0] and got in problems[0], problems


def test_a_date_like_model_dir_is_a_string(tmp_path):
    (tmp_path / "m.yaml").write_text("models:\n- {name: a, model_dir: 2024-01-01, slo: {p99_ms: 150}}\n")
    assert load_models(tmp_path / "m.yaml").models[0].model_dir == "2024-01-01"


# ---------------------------------------------------------------- 6. refusals instead of tracebacks


def test_render_out_dir_checks_every_target_before_writing_any(tmp_path):
    out = tmp_path / "out"
    (out / "migmodel-bert.yaml").mkdir(parents=True)
    res = _run("render", str(EXAMPLE_MODELS), str(EXAMPLE_CLUSTER), "--migmodels", "--out-dir", str(out))
    _one_line_refusal(res, "--out-dir", "migmodel-bert.yaml", "not a regular file")
    assert sorted(p.name for p in out.iterdir()) == ["migmodel-bert.yaml"]  # nothing else written


def test_render_out_dir_keeps_a_file_it_did_not_write_unless_forced(tmp_path):
    mine = tmp_path / "migmodel-resnet.yaml"
    mine.write_text("# my notes\nkind: MigModel\n")
    args = ["render", str(EXAMPLE_MODELS), str(EXAMPLE_CLUSTER), "--migmodels", "--out-dir", str(tmp_path)]
    res = _run(*args)
    _one_line_refusal(res, "--out-dir", "migmodel-resnet.yaml", "--force")
    assert mine.read_text() == "# my notes\nkind: MigModel\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["migmodel-resnet.yaml"]
    forced = _run(*args, "--force")
    assert forced.exit_code == 0, forced.output
    assert yaml.safe_load(mine.read_text())["metadata"]["name"] == "resnet"
    again = _run(*args)  # now every file is one render wrote: a rerun replaces them
    assert again.exit_code == 0, again.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--out", "/nonexistent-migscale-dir/x.csv"], ["--out", "no such directory"]),
        (["--seed", "-1"], ["--seed", "-1"]),
        (["--mean-rps", "1e18"], ["--mean-rps", "1e+18"]),
        (["--mean-rps", "a=1e18,b=5", "--models", "a,b"], ["--mean-rps", "a"]),
    ],
)
def test_trace_generate_refuses_bad_arguments_in_one_line(extra, words):
    _one_line_refusal(_run("trace", "generate", "diurnal", "--duration", "1h", *extra), *words)


def test_trace_generate_refuses_a_directory_as_out(tmp_path):
    _one_line_refusal(_run("trace", "generate", "diurnal", "--duration", "1h", "--out", str(tmp_path)),
                      "--out", "directory")


def test_trace_generate_takes_means_up_to_the_bound_and_refuses_past_it(tmp_path):
    out = tmp_path / "t.csv"
    args = ["trace", "generate", "azure", "--models", "a,b", "--duration", "2d", "--step", "1h", "--out", str(out)]
    res = _run(*args, "--mean-rps", "1e6")
    assert res.exit_code == 0, res.output
    assert _run("trace", "show", str(out)).exit_code == 0  # its bursts stay within what a trace may hold
    out.unlink()
    _one_line_refusal(_run(*args, "--mean-rps", "1.5e6"), "--mean-rps", "1,000,000 req/s", "1500000.0")
    assert not out.exists()


def _trace(tmp_path: Path, body: bytes, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_bytes(body)
    return p


def test_trace_show_refuses_non_utf8_in_one_line(tmp_path):
    p = _trace(tmp_path, b"t_s,model,rps\n0,a,5\n60,a,\xff\n")
    _one_line_refusal(_run("trace", "show", str(p)), "t.csv", "not UTF-8")


def test_simulate_refuses_a_non_utf8_trace_in_one_line(tmp_path):
    p = _trace(tmp_path, b"t_s,model,rps\n0,resnet,5\xe9\n")
    res = _run("simulate", str(EXAMPLE_MODELS), str(EXAMPLE_CLUSTER), str(p))
    _one_line_refusal(res, "t.csv", "not UTF-8")


def test_trace_show_reads_a_csv_that_starts_with_a_byte_order_mark(tmp_path):
    p = _trace(tmp_path, "\ufefft_s,model,rps\n0,a,5\n60,a,7\n".encode())
    res = _run("trace", "show", str(p), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["models"]["a"]["peak_rps"] == 7


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_trace_show_refuses_a_fifo_instead_of_blocking(tmp_path):
    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    _one_line_refusal(_run("trace", "show", str(fifo)), "t.csv", "not a regular file")


@pytest.mark.parametrize("rate", ["1e308", "inf", "2e9"])
def test_trace_rates_past_the_bound_are_refused_with_it(tmp_path, rate):
    p = _trace(tmp_path, f"t_s,model,rps\n0,a,{rate}\n60,a,1\n".encode())
    _one_line_refusal(_run("trace", "show", str(p)), "line 2", "rps", "1,000,000,000", repr(rate))


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ({"t_s": 1, "models": ["a"]}, ["models", "['a']"]),
        ({"t_s": 1, "actions": [1]}, ["actions[0]", "1"]),
        ({"t_s": 1, "errors": 5}, ["errors", "5"]),
        ({"t_s": 1, "reasons": {"a": 5}}, ["reasons.a", "5"]),
        ({"t_s": 1, "models": {"a": {"headroom": "x"}}}, ["models.a.headroom", "'x'"]),
        ({"t_s": 1, "models": {"a": {"stages": ["x"]}}}, ["models.a.stages[0]", "'x'"]),
    ],
)
def test_explain_refuses_a_log_of_malformed_records_in_one_line(tmp_path, record, words):
    log = tmp_path / "d.jsonl"
    log.write_text(json.dumps(record) + "\n")
    for extra in ([], ["--json"]):
        _one_line_refusal(_run("explain", "--log", str(log), *extra), "--log", "line 1", *words)


def test_explain_refuses_an_infinite_time(tmp_path):
    log = tmp_path / "d.jsonl"
    log.write_text('{"t_s": Infinity}\n')
    _one_line_refusal(_run("explain", "--log", str(log)), "--log", "t_s", "inf")


def test_explain_shows_a_time_past_the_calendar_without_a_date(tmp_path):
    log = tmp_path / "d.jsonl"
    log.write_text('{"t_s": 1e20}\n')
    res = _run("explain", "--log", str(log))
    assert res.exit_code == 0, res.output
    assert "decision at t=1e+20" in res.stdout and "UTC" not in res.stdout


def test_explain_passes_over_a_malformed_record_and_says_so(tmp_path):
    log = tmp_path / "d.jsonl"
    log.write_text('{"t_s": 1, "reasons": {"a": ["min_replicas"]}}\n{"t_s": 2, "errors": 5}\n')
    res = _run("explain", "--log", str(log), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["t_s"] == 1
    assert [ln for ln in res.stderr.splitlines() if ln] == [
        (f"--log: passed over 1 malformed decision record(s) in {log}, the last at line 2: errors: must be a list, "
         "got 5")
    ]


def test_explain_json_is_valid_json_when_the_log_holds_nan(tmp_path):
    log = tmp_path / "d.jsonl"
    log.write_text('{"t_s": 1, "models": {"a": {"p99_ms": NaN, "observed_rps": Infinity}}}\n')
    res = _run("explain", "--log", str(log), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["models"]["a"] == {"p99_ms": None, "observed_rps": None}


def _short_trace(tmp_path: Path) -> Path:
    return _trace(tmp_path, b"t_s,model,rps\n0,resnet,5\n60,resnet,5\n")


def test_simulate_refuses_a_directory_as_plot_before_simulating(tmp_path):
    (tmp_path / "plots").mkdir()
    res = _run("simulate", str(EXAMPLE_MODELS), str(EXAMPLE_CLUSTER), str(_short_trace(tmp_path)),
               "--warmup-s", "0", "--plot", str(tmp_path / "plots"))
    _one_line_refusal(res, "--plot", "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "t.csv"]


def test_simulate_refuses_a_plot_in_a_missing_folder_and_creates_none(tmp_path):
    res = _run("simulate", str(EXAMPLE_MODELS), str(EXAMPLE_CLUSTER), str(_short_trace(tmp_path)),
               "--warmup-s", "0", "--plot", str(tmp_path / "missing" / "x.png"))
    _one_line_refusal(res, "--plot", "no such directory")
    assert not (tmp_path / "missing").exists()


# ---------------------------------------------------------------- 7. render says what it could not place


def _fleet(tmp_path: Path, lo: int, hi: int) -> Path:
    data = yaml.safe_load(EXAMPLE_MODELS.read_text())
    fleet = []
    for m in data["models"]:
        if m.get("backend") == "multinode":
            continue
        m["model_dir"] = str(REPO / "triton_models" / m["name"])
        m.pop("high_availability", None)
        m.update(min_replicas=lo, max_replicas=hi)
        fleet.append(m)
    return _write(tmp_path / "models.yaml", {"models": fleet})


def test_render_names_each_model_it_renders_below_min_replicas(tmp_path):
    models = _fleet(tmp_path, 8, 8)
    res = _run("render", str(models), str(EXAMPLE_CLUSTER))
    assert res.exit_code == 0, res.output
    objs = parse_documents(res.stdout, "render")
    rendered: dict[str, int] = {}
    for o in objs:
        if o["kind"] == "Deployment":
            name = o["metadata"]["labels"]["migscale.io/model"]
            rendered[name] = rendered.get(name, 0) + o["spec"]["replicas"]
    short = {name: n for name, n in rendered.items() if n < 8} | {
        name: 0 for name in ("resnet", "bert", "rnn") if name not in rendered}
    assert short, "the example's GPUs were expected to be too few for 3 x 8 replicas"
    lines = [ln for ln in res.stderr.splitlines() if ln]
    assert sorted(lines) == sorted(
        f"render: {name}: min_replicas 8, rendered {n} (the cluster's GPUs hold no more beside the other models)"
        for name, n in short.items()
    )


def test_render_gives_a_multinode_model_only_the_groups_its_pool_holds(tmp_path):
    data = yaml.safe_load(EXAMPLE_MODELS.read_text())
    llm = next(m for m in data["models"] if m.get("backend") == "multinode")
    llm.update(model_dir=str(REPO / "triton_models" / "llm"), min_replicas=2, max_replicas=2)
    models = _write(tmp_path / "models.yaml", {"models": [llm]})
    res = _run("render", str(models), str(EXAMPLE_CLUSTER))  # two RDMA nodes: one group of two
    assert res.exit_code == 0, res.output
    groups = [o["spec"]["replicas"] for o in parse_documents(res.stdout, "render") if o["kind"] == "LeaderWorkerSet"]
    assert groups == [1]
    assert res.stderr.splitlines() == [
        "render: llm: min_replicas 2, rendered 1 (the cluster's GPUs hold no more beside the other models)"]


def test_render_with_zero_demand_renders_what_plan_decides(tmp_path):
    models = _fleet(tmp_path, 0, 8)
    demand = _write(tmp_path / "demand.yaml", {"resnet": 0, "bert": 0, "rnn": 0})
    plan = _run("plan", str(models), str(EXAMPLE_CLUSTER), "--demand", str(demand), "--json")
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["desired"] == []
    res = _run("render", str(models), str(EXAMPLE_CLUSTER), "--demand", str(demand))
    assert res.exit_code == 0, res.output
    assert [o for o in parse_documents(res.stdout, "render") if o["kind"] == "Deployment"] == []
    assert res.stderr == ""


# ---------------------------------------------------------------- 8. node names are DNS-1123 subdomains


def test_a_node_name_may_be_a_dns_subdomain():
    cluster = _cluster()
    cluster["gpus"][0]["node"] = "ip-10-0-0-1.ec2.internal"
    cluster["rdma_pool"]["nodes"][0]["name"] = "rdma-0.ib.example.com"
    cfg = parse_cluster(cluster)
    assert cfg.gpus[0].node == "ip-10-0-0-1.ec2.internal"
    assert cfg.rdma_pool.nodes[0].name == "rdma-0.ib.example.com"


@pytest.mark.parametrize("node", ["a" * 60 + ".com", "Node-A", "node_a", "-a.b", "a..b"])
def test_a_node_name_kubernetes_would_refuse_is_refused_naming_the_limit(node):
    cluster = _cluster()
    cluster["gpus"][0]["node"] = node
    problems = _problems(parse_cluster, cluster)
    assert len(problems) == 1 and "gpus[0].node" in problems[0] and repr(node) in problems[0]
    assert "63" in problems[0] and "kubernetes.io/hostname" in problems[0]


def test_the_cluster_json_schema_carries_the_name_rules_the_validator_enforces():
    res = _run("schema", "--which", "cluster")
    assert res.exit_code == 0, res.output
    schema = json.loads(res.stdout)
    gpu = schema["$defs"]["GpuConfig"]["properties"]
    ns = schema["properties"]["namespace"]
    assert re.match(ns["pattern"], "team-a") and not re.match(ns["pattern"], "Team_A") and ns["maxLength"] == 63
    assert re.match(gpu["node"]["pattern"], "ip-10-0-0-1.ec2.internal") and gpu["node"]["maxLength"] == 63
    assert not re.match(gpu["node"]["pattern"], "Node A")
    assert "A100-SXM4-80GB" in gpu["product"]["enum"] and "A100" not in gpu["product"]["enum"]
    rdma = schema["$defs"]["RdmaNode"]["properties"]
    assert "enum" in rdma["product"] and "pattern" in rdma["name"] and "pattern" in rdma["fabric"]


def test_load_yaml_reads_back_what_dump_yaml_writes_for_the_examples(tmp_path):
    data = yaml.safe_load(EXAMPLE_CLUSTER.read_text())
    (tmp_path / "c.yaml").write_text(yio.dump_yaml(data))
    assert load_yaml(tmp_path / "c.yaml") == data
