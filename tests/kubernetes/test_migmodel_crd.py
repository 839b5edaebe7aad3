"""The MigModel CRD: generated, structural, valid for Kubernetes, and as strict as ``migscale validate``.

The checked-in YAML (k8s/base, k8s/examples) must equal what the code
generates. The schema and its CEL rules are exercised through
``crdvalidate.CrdValidator`` (an emulation of the API server's create-time
validation, see its docstring) on the inputs the config tests already use
and on generated specs, so every rule is shown to accept and to reject.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crdvalidate import CrdValidator, rules, structural_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from autoscaler.act.kubernetes.crd import SchemaError, build_crd, crd_yaml, structural
from autoscaler.cli import app
from autoscaler.config import ConfigError, parse_models
from autoscaler.config.io import parse_documents
from autoscaler.config.schema import ModelConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from test_config_errors import CASES

CRD = build_crd()
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def validator() -> CrdValidator:
    return CrdValidator(CRD)


def migmodel(entry: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    """A models.yaml entry as a MigModel, raw (no pydantic on the way)."""
    spec = {k: v for k, v in entry.items() if k != "name"}
    meta = {"name": entry.get("name"), "namespace": namespace}
    return {"apiVersion": "migscale.io/v1alpha1", "kind": "MigModel", "metadata": meta, "spec": spec}


# ---------------------------------------------------------------- generated, not hand-kept


def test_checked_in_crd_is_what_the_code_generates():
    on_disk = (REPO / "k8s/base/migmodel-crd.yaml").read_text()
    assert on_disk == crd_yaml(), "regenerate: migscale crd > k8s/base/migmodel-crd.yaml"
    assert "migmodel-crd.yaml" in yaml.safe_load((REPO / "k8s/base/kustomization.yaml").read_text())["resources"]


def test_checked_in_examples_are_what_render_generates(tmp_path: Path):
    res = CliRunner().invoke(app, ["render", str(REPO / "examples/models.yaml"), str(REPO / "examples/cluster.yaml"),
                                   "--migmodels", "--out-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    made = {p.name: p.read_text() for p in tmp_path.glob("migmodel-*.yaml")}
    kept = {p.name: p.read_text() for p in (REPO / "k8s/examples").glob("migmodel-*.yaml")}
    names = {m.name for m in parse_models(yaml.safe_load((REPO / "examples/models.yaml").read_text())).models}
    assert set(made) == {f"migmodel-{n}.yaml" for n in names}
    assert kept == made, ("regenerate: migscale render examples/models.yaml examples/cluster.yaml "
                          "--migmodels --out-dir k8s/examples")


def test_a_new_models_yaml_field_reaches_the_crd():
    """The schema follows ModelConfig: every field but name is in spec, name's rules are on metadata.name."""
    fields = set(ModelConfig.model_fields) - {"name"}
    assert set(SCHEMA["properties"]["spec"]["properties"]) == fields
    name = SCHEMA["properties"]["metadata"]["properties"]["name"]
    assert name["maxLength"] == 63 and name["pattern"].startswith("^[a-z]")  # a letter first: it names a Service


# ---------------------------------------------------------------- a valid CRD, a structural schema


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_crd_validates_with_kubernetes_validate(version: str):
    kubernetes_validate.validate(CRD, version, strict=True)


def test_schema_is_structural():
    assert structural_problems(SCHEMA) == []


def test_structural_check_can_fail():
    bad = copy.deepcopy(SCHEMA)
    spec = bad["properties"]["spec"]
    spec["properties"]["slo"].pop("type")
    spec["properties"]["profiles"]["uniqueItems"] = True
    spec["x-kubernetes-validations"][0]["fieldPath"] = ".min_replicaz"
    spec["properties"]["min_replicas"]["default"] = -1
    bad["properties"]["metadata"]["properties"]["labels"] = {"type": "object"}
    found = "\n".join(structural_problems(bad))
    for what in ("spec.slo: no type", "uniqueItems", "'.min_replicaz' names no field", "default -1",
                 "only name and generateName"):
        assert what in found


def test_conversion_details():
    spec = SCHEMA["properties"]["spec"]["properties"]
    assert spec["memory_gb"]["nullable"] is True  # Optional -> nullable
    assert spec["slo"]["properties"]["p99_ms"]["exclusiveMinimum"] is True  # gt=0, OpenAPI 3.0 style
    assert spec["slo"]["properties"]["p99_ms"]["minimum"] == 0
    assert spec["backend"]["enum"] == ["mig", "multinode"] and spec["backend"]["default"] == "mig"
    assert spec["profiles"]["x-kubernetes-list-type"] == "set"  # uniqueItems is forbidden in CRDs
    assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(SCHEMA)  # nothing is free-form
    assert "$ref" not in json.dumps(SCHEMA) and "anyOf" not in json.dumps(SCHEMA)
    status = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert status["x-kubernetes-list-map-keys"] == ["type"]
    assert set(status["items"]["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}


@pytest.mark.parametrize(
    "schema",
    [
        {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        {"oneOf": [{"type": "integer"}]},
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
        {"type": "object", "propertyNames": {"pattern": "^a"}},
    ],
)
def test_converter_refuses_what_has_no_structural_form(schema: dict):
    with pytest.raises(SchemaError):
        structural(schema)


def test_printer_columns():
    cols = {c["name"]: c for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert [n for n, c in cols.items() if not c.get("priority")] == ["Ready", "Profiles", "Req/s", "P99", "SLO", "Age"]
    assert cols["SLO"]["jsonPath"] == ".spec.slo.p99_ms"
    assert cols["Age"]["type"] == "date"
    names = CRD["spec"]["names"]
    assert (names["kind"], names["plural"], CRD["spec"]["scope"]) == ("MigModel", "migmodels", "Namespaced")
    assert "mm" in names["shortNames"] and CRD["spec"]["versions"][0]["subresources"] == {"status": {}}


# ---------------------------------------------------------------- accepts what validate accepts ...


def test_examples_are_accepted(validator: CrdValidator):
    for path in sorted((REPO / "k8s/examples").glob("migmodel-*.yaml")):
        assert validator.validate(yaml.safe_load(path.read_text())) == [], path


def test_defaults_are_the_models_yaml_defaults(validator: CrdValidator):
    stored = validator.default(migmodel({"name": "a", "model_dir": "a", "slo": {"p99_ms": 100},
                                         "backend": "multinode", "multinode": {"nodes_per_group": 2}}))
    model = ModelConfig.model_validate({"name": "a", **stored["spec"]})
    plain = ModelConfig.model_validate({"name": "a", "model_dir": "a", "slo": {"p99_ms": 100},
                                        "backend": "multinode", "multinode": {"nodes_per_group": 2}})
    assert model == plain
    assert stored["spec"]["min_replicas"] == 1 and stored["spec"]["multinode"]["gpus_per_node"] == 1


# ---------------------------------------------------------------- ... and rejects what it rejects, on the same field


def _llm(**kw: Any) -> str:
    entry = {"name": "llm", "model_dir": "m", "slo": {"p99_ms": 2000}, "backend": "multinode",
             "multinode": {"nodes_per_group": 2, "group_capacity_rps": 4}, **kw}
    return yaml.safe_dump({"models": [entry]})


# Two more, so that every CEL rule meets an input it must refuse.
EXTRA = [("multinode-with-capacity", _llm(capacity={"7g.80gb": 3})),
         ("multinode-with-capacity-file", _llm(capacity_file="cap.yaml"))]


def _spec_cases() -> list[tuple[str, dict, list[str]]]:
    """(id, MigModel, validate's problem lines relocated to the object) for each config-test case
    that is about one models.yaml entry alone and that JSON can carry (no NaN, no int keys)."""
    out = []
    for case_id, models_text in [(c[0], c[1][0]) for c in CASES] + EXTRA:
        try:  # the bounded reader: some cases are alias bombs and 5000-deep nesting
            (data,) = parse_documents(models_text, "models.yaml")
            json.dumps(data, allow_nan=False)
        except (ConfigError, ValueError, TypeError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            continue
        try:
            parse_models(data)
            continue  # valid alone: a cross-file case (see test_cross_file_cases_pass_the_crd)
        except ConfigError as exc:
            lines = exc.problems
        heads = {ln.split("]", 1)[0] + "]" for ln in lines}
        if len(heads) != 1 or not lines[0].startswith("models["):
            continue
        i = int(lines[0][len("models["):].split("]")[0])
        entry = data["models"][i]
        if not isinstance(entry, dict) or any("duplicate model name" in ln for ln in lines):
            continue
        moved = [ln.replace(f"models[{i}].name", "metadata.name").replace(f"models[{i}].", "spec.") for ln in lines]
        out.append((case_id, migmodel(entry), moved))
    return out


SPEC_CASES = _spec_cases()
CEL_MESSAGES = {"min-gt-max", "ha-one-replica", "multinode-block-missing", "multinode-on-mig",
                "multinode-world-size", "multinode-with-profiles", "capacity-unknown-profile",
                "multinode-with-capacity", "multinode-with-capacity-file"}


def test_enough_cases_carry_over():
    ids = {c[0] for c in SPEC_CASES}
    assert len(ids) >= 25 and CEL_MESSAGES <= ids


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_crd_rejects_on_the_same_field_with_the_value(validator: CrdValidator, obj: dict, expected: list[str]):
    got = validator.validate(obj)
    assert got, f"the CRD accepts what migscale validate refuses: {expected}"
    for line in expected:
        path, _, message = line.partition(": ")
        value = message.rsplit(", got ", 1)[-1]
        same_field = [g for g in got if g.split(": ", 1)[0] == path]
        # A CEL rule on a map cannot name the key (fieldPath takes no key): it names the map, quotes the key.
        parent = [g for g in got if path.startswith(g.split(": ", 1)[0] + ".") and value in g]
        assert same_field or parent, (line, got)
        # The value is quoted, except by a CEL rule about a whole list or map (CEL cannot print one).
        stem_only = f"{path}: {message.rsplit(', got ', 1)[0]}"
        assert any(value in g or g == stem_only for g in same_field + parent), (line, got)


@pytest.mark.parametrize("case_id", sorted(CEL_MESSAGES))
def test_cel_messages_are_validates_messages(validator: CrdValidator, case_id: str):
    _, obj, expected = next(c for c in SPEC_CASES if c[0] == case_id)
    got = validator.validate(obj)
    for line in expected:
        path, _, message = line.partition(": ")
        stem = message.rsplit(", got ", 1)[0]
        # same field (or, for a map's key, the map), same words; a list or map value is not quoted
        assert any(
            (gpath == path or path.startswith(gpath + ".")) and gmessage in (message, stem)
            for gpath, _, gmessage in (g.partition(": ") for g in got)
        ), (line, got)


def test_cross_file_cases_pass_the_crd(validator: CrdValidator):
    """What only the fleet can refuse (a profile no GPU has, memory no slice has) passes the API
    server: the controller reports it as ConfigValid=False instead."""
    passed = 0
    for case_id, (models_text, _), path, _ in CASES:
        if case_id not in ("profile-not-in-cluster", "memory-too-big", "profile-too-small", "no-capacity"):
            continue
        data = yaml.safe_load(models_text)
        parse_models(data)
        i = int(path[len("models["):].split("]")[0])
        assert validator.validate(migmodel(data["models"][i])) == [], case_id
        passed += 1
    assert passed == 4


# ---------------------------------------------------------------- the CEL rules agree with the Python checks


_PROFILES = st.sampled_from(["1g.10gb", "2g.20gb", "7g.80gb", "9g.90gb"])


def _opt(strategy):
    return st.one_of(st.just(...), strategy)


@st.composite
def entries(draw) -> dict[str, Any]:
    e: dict[str, Any] = {"name": draw(st.sampled_from(["resnet", "Res_Net", "a" * 64])), "model_dir": "m",
                         "slo": {"p99_ms": draw(st.sampled_from([150, 0, -1, 0.5]))}}
    fields = {
        "min_replicas": st.sampled_from([-1, 0, 1, 2, 5, 1001]),
        "max_replicas": st.sampled_from([0, 1, 2, 8]),
        "high_availability": st.booleans(),
        "backend": st.sampled_from(["mig", "multinode", "gpu"]),
        "profiles": st.lists(_PROFILES, max_size=3),
        "memory_gb": st.sampled_from([0, 12, 20000]),
        "capacity": st.dictionaries(_PROFILES, st.sampled_from([-1, 5, 1e10]), max_size=2),
        "capacity_file": st.sampled_from(["cap.yaml", ""]),
        "priority": st.sampled_from([0, 2000]),
        "multinode": st.fixed_dictionaries(
            {"nodes_per_group": st.sampled_from([1, 2, 4])},
            optional={"gpus_per_node": st.sampled_from([1, 2]), "tensor_parallel": st.sampled_from([1, 2, 3]),
                      "pipeline_parallel": st.sampled_from([1, 2, 4]), "group_capacity_rps": st.sampled_from([4, 0])},
        ),
    }
    for key, strategy in fields.items():
        value = draw(_opt(strategy))
        if value is not ...:
            e[key] = value
    return e


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries())
def test_crd_and_pydantic_agree(entry: dict[str, Any]):
    """On specs drawn around every bound and rule: the CRD refuses exactly what ModelConfig refuses."""
    try:
        ModelConfig.model_validate(entry)
        pydantic_ok = True
    except ValidationError:
        pydantic_ok = False
    got = _AGREE.validate(migmodel(entry))
    assert not any("failed to evaluate" in g for g in got), got
    assert pydantic_ok == (got == []), (entry, got)


_AGREE = CrdValidator(CRD)


def test_every_rule_refuses_a_case_and_passes_the_examples():
    """Each CEL rule has an input it must refuse (above) and is evaluated on the valid examples."""
    fresh = CrdValidator(CRD)
    for _, obj, _ in SPEC_CASES:
        fresh.validate(obj)
    every = {r["rule"] for _, _, r in rules(SCHEMA)}
    assert len(every) == 9 and every == set(fresh.fired), every - set(fresh.fired)
