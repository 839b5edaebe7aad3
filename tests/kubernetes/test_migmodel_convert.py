"""models.yaml -> MigModels -> models.yaml: the same validated config; bad input exits 2 with field and value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from crdvalidate import CrdValidator
from typer.testing import CliRunner

from autoscaler.act.kubernetes.crd import build_crd, crd_yaml
from autoscaler.act.kubernetes.migmodel import from_migmodel, to_migmodel
from autoscaler.cli import app
from autoscaler.config import ConfigError, load_cluster, load_models, model_specs, parse_models
from autoscaler.config.io import parse_documents

REPO = Path(__file__).resolve().parents[2]
MODELS, CLUSTER = str(REPO / "examples/models.yaml"), str(REPO / "examples/cluster.yaml")
runner = CliRunner()


def render(*args: str) -> str:
    res = runner.invoke(app, ["render", *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def import_(text: str, *args: str) -> Any:
    res = runner.invoke(app, ["import", "-", *args], input=text)
    assert res.exit_code == 0, res.output
    return yaml.safe_load(res.stdout)


def as_kubectl_list(objs: list[dict]) -> dict:
    """What `kubectl get migmodels -o yaml` prints after the API server stored them: defaults
    filled in, server fields, a last-applied annotation and a status."""
    stored = []
    validator = CrdValidator(build_crd())
    for i, obj in enumerate(objs):
        assert validator.validate(obj) == []
        o = validator.default(obj)
        o["metadata"].update(
            uid=f"00000000-0000-0000-0000-00000000000{i}", resourceVersion=str(100 + i), generation=1,
            creationTimestamp="2026-01-01T00:00:00Z",
            annotations={"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)},
        )
        o["status"] = {"observedGeneration": 1, "readyReplicas": 1}
        stored.append(o)
    return {"apiVersion": "v1", "kind": "List", "items": stored, "metadata": {"resourceVersion": ""}}


def test_round_trip_examples_give_the_same_config():
    original = load_models(MODELS)
    objs = [d for d in yaml.safe_load_all(render(MODELS, CLUSTER, "--migmodels")) if d]
    assert [o["metadata"]["name"] for o in objs] == [m.name for m in original.models]
    assert {o["metadata"]["namespace"] for o in objs} == {load_cluster(CLUSTER).namespace}
    back = parse_models(import_(yaml.safe_dump_all(objs)))
    assert back.models == original.models


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_round_trip_through_the_api_server_form(form: str):
    original = load_models(MODELS)
    objs = [d for d in yaml.safe_load_all(render(MODELS, CLUSTER, "--migmodels", "--namespace", "team-a")) if d]
    listing = as_kubectl_list(objs)
    listing["items"][0]["spec"]["slo"]["p99_ms"] = 0.00001  # Go writes this 1e-05 in JSON
    text = json.dumps(listing, indent=4) if form == "json" else yaml.safe_dump(listing)
    if form == "json":
        assert "1e-05" in text
    back = parse_models(import_(text))
    assert back.models[0].slo.p99_ms == 0.00001
    assert back.models[1:] == original.models[1:]


def test_capacity_file_goes_inline_and_plans_the_same(tmp_path: Path):
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump({"models": {"resnet": {"1g.10gb": 50, "3g.40gb": 140}}}))
    data = yaml.safe_load(Path(MODELS).read_text())
    data["models"][0].pop("capacity")
    data["models"][0]["capacity_file"] = "cap.yaml"
    data["models"][0]["profiles"] = ["1g.10gb", "3g.40gb"]
    data["models"][0]["capacity"] = {"3g.40gb": 150}  # inline wins over the file
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(data))
    objs = [d for d in yaml.safe_load_all(render(str(tmp_path / "models.yaml"), CLUSTER, "--migmodels")) if d]
    assert objs[0]["spec"]["capacity"] == {"1g.10gb": 50, "3g.40gb": 150}
    assert "capacity_file" not in objs[0]["spec"]
    (tmp_path / "back.yaml").write_text(yaml.safe_dump(import_(yaml.safe_dump_all(objs))))
    cluster = load_cluster(CLUSTER)
    assert model_specs(load_models(tmp_path / "back.yaml"), cluster) == model_specs(
        load_models(tmp_path / "models.yaml"), cluster
    )


def test_import_picks_a_namespace_and_writes_a_file(tmp_path: Path):
    objs = [d for d in yaml.safe_load_all(render(MODELS, CLUSTER, "--migmodels")) if d]
    objs[1]["metadata"]["namespace"] = "team-b"
    res = runner.invoke(app, ["import", "-", "-n", "team-b", "-o", str(tmp_path / "m.yaml")],
                        input=yaml.safe_dump_all(objs))
    assert res.exit_code == 0, res.output
    assert [m.name for m in load_models(tmp_path / "m.yaml").models] == [objs[1]["metadata"]["name"]]


def _bad(obj_change, *args: str) -> list[str]:
    objs = [d for d in yaml.safe_load_all(render(MODELS, CLUSTER, "--migmodels")) if d]
    obj_change(objs)
    res = runner.invoke(app, ["import", "-", *args], input=yaml.safe_dump_all(objs))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    return res.stderr.strip().splitlines()


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        (lambda o: o[0]["spec"].update(min_replicas=9), "items[0].spec.min_replicas", "got 9"),
        (lambda o: o[1]["spec"]["slo"].update(p99_ms=-5), "items[1].spec.slo.p99_ms", "got -5"),
        (lambda o: o[0]["metadata"].update(name="Res_Net"), "items[0].metadata.name", "'Res_Net'"),
        (lambda o: o[2]["spec"].update(colour="red"), "items[2].spec.colour", "'red'"),
        (lambda o: o[0]["spec"].update(name="resnet"), "items[0].spec.name", "'resnet'"),
        (lambda o: o[3]["spec"]["multinode"].update(tensor_parallel=3), "items[3].spec.multinode.tensor_parallel",
         "got 3"),
        (lambda o: o[0].update(kind="Deployment"), "items[0].apiVersion/kind", "'Deployment'"),
        (lambda o: o[1].pop("spec"), "items[1].spec", "required"),
        (lambda o: o[1]["metadata"].update(name="resnet"), "items[1].metadata.name", "duplicate model name"),
        (lambda o: o[1]["metadata"].update(namespace="team-b"), "items: objects from 2 namespaces", "team-b"),
    ],
    ids=["min-gt-max", "slo", "name", "unknown", "spec-name", "world-size", "kind", "no-spec", "dup", "namespaces"],
)
def test_import_bad_objects_exit_2_with_field_and_value(change, field: str, value: str):
    lines = _bad(change)
    assert any(ln.startswith(f"-: {field}") and value in ln for ln in lines), lines


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("", "empty"),
        ("models: [\n", "YAML syntax error"),
        ('{"kind": "List", "items": [], "a": NaN}', "NaN"),
        ('{"kind": "MigModel", "kind": "List"}', "duplicate key"),
        ("- 1\n- 2\n", "not a Kubernetes object or List"),
        ("apiVersion: v1\nkind: List\nitems: []\n", "no objects"),
        ("a: &a [*a]\n", "recursive YAML alias"),
    ],
)
def test_import_bad_files_exit_2(text: str, expect: str):
    res = runner.invoke(app, ["import", "-"], input=text)
    assert res.exit_code == 2, res.output
    assert expect in res.stderr and "Traceback" not in res.output


def test_import_missing_file_exits_2(tmp_path: Path):
    res = runner.invoke(app, ["import", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "file not found" in res.stderr


def test_render_migmodels_usage_errors():
    for args, expect in [
        (["--migmodels", "--namespace", "Team_A"], "--namespace: must be a DNS-1123 label, got 'Team_A'"),
        (["--migmodels", "--demand", "x.yaml"], "--demand"),
        (["--namespace", "team-a"], "go with --migmodels"),
        (["--migmodels", "--out-dir", "/nonexistent/dir"], "--out-dir: no such directory"),
    ]:
        res = runner.invoke(app, ["render", MODELS, CLUSTER, *args])
        assert res.exit_code == 2, (args, res.output)
        assert expect in res.stderr


def test_render_migmodels_refuses_an_invalid_models_yaml(tmp_path: Path):
    data = yaml.safe_load(Path(MODELS).read_text())
    data["models"][0]["min_replicas"] = 99
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["render", str(tmp_path / "models.yaml"), CLUSTER, "--migmodels"])
    assert res.exit_code == 2
    assert "models[0].min_replicas: must be <= max_replicas (8), got 99" in res.stderr


def test_crd_command_prints_the_crd():
    res = runner.invoke(app, ["crd"])
    assert res.exit_code == 0 and res.stdout == crd_yaml()


def test_from_migmodel_ignores_what_the_server_adds():
    model = load_models(MODELS).models[0]
    obj = as_kubectl_list([to_migmodel(model, "team-a")])["items"][0]
    back, problems = from_migmodel(obj)
    assert problems == [] and back == model


def test_from_migmodel_refuses_non_objects():
    assert from_migmodel([1])[1] == ["(object): must be a mapping, got [1]"]
    _, problems = from_migmodel({"apiVersion": "migscale.io/v1alpha1", "kind": "MigModel", "spec": {}})
    assert problems and problems[0].startswith("metadata.name: required")


def test_parse_documents_limits():
    assert parse_documents("a: 1\n---\nb: 2\n---\n", "x") == [{"a": 1}, {"b": 2}]
    assert parse_documents('{"q": 1e-05}', "x") == [{"q": 1e-05}]  # JSON's number, not YAML 1.1's string
    assert parse_documents("{q: 1}", "x") == [{"q": 1}]  # YAML flow style, not JSON
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 7)
    )
    with pytest.raises(ConfigError, match="nodes"):
        parse_documents(bomb, "x")
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_documents("[" * 100_000 + "]" * 100_000, "x")
