"""Every kind of bad config gives one line naming the field path and the offending value.

Each case starts from a VALID pair of files (a test pins that the base is
valid, so a case cannot pass by accident), breaks one thing, and asserts that
a single problem line contains both the dotted field path and the value.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from autoscaler.cli import app
from autoscaler.config import ConfigError, load_cluster, load_models, validate_pair

REPO = Path(__file__).resolve().parents[2]
MIGSCALE = REPO / ".venv" / "bin" / "migscale"

BASE_MODELS: dict[str, Any] = {
    "models": [
        {
            "name": "resnet",
            "model_dir": "repo/resnet",
            "slo": {"p99_ms": 100},
            "profiles": ["1g.10gb", "2g.20gb"],
            "min_replicas": 1,
            "max_replicas": 4,
            "capacity": {"1g.10gb": 60, "2g.20gb": 90},
        },
        {
            "name": "bert",
            "model_dir": "repo/bert",
            "slo": {"p99_ms": 200},
            "memory_gb": 12,
            "capacity": {"2g.20gb": 80, "3g.40gb": 110},
        },
        {
            "name": "llm",
            "model_dir": "repo/llm",
            "slo": {"p99_ms": 2000},
            "backend": "multinode",
            "min_replicas": 1,
            "max_replicas": 1,
            "multinode": {
                "nodes_per_group": 2,
                "gpus_per_node": 1,
                "fabric": "ib-a",
                "group_capacity_rps": 4,
            },
        },
    ]
}

BASE_CLUSTER: dict[str, Any] = {
    "namespace": "default",
    "gpus": [
        {"node": "node-a", "product": "A100-SXM4-80GB", "count": 2, "layout": ["3g.40gb@0", "3g.40gb@4"]},
    ],
    "rdma_pool": {
        "nodes": [
            {"name": "rdma-0", "product": "H100-SXM5-80GB", "gpus": 1, "fabric": "ib-a"},
            {"name": "rdma-1", "product": "H100-SXM5-80GB", "gpus": 1, "fabric": "ib-a"},
        ]
    },
    "policy": {"tick_s": 5, "churn_budget": 4},
}


def _make_repo(root: Path) -> None:
    for name in ("resnet", "bert", "llm"):
        (root / "repo" / name).mkdir(parents=True, exist_ok=True)
        (root / "repo" / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    # the multinode model's ranks 1..N-1 (the preflight of `validate` checks it is there)
    (root / "repo" / "llm" / "worker.py").write_text("")


def _problems(models_text: str, cluster_text: str, root: Path) -> list[str]:
    """All problems the two files have, alone and together (what `validate` prints)."""
    _make_repo(root)
    (root / "models.yaml").write_text(models_text)
    (root / "cluster.yaml").write_text(cluster_text)
    out: list[str] = []
    m = c = None
    try:
        m = load_models(root / "models.yaml")
    except ConfigError as exc:
        out += exc.problems
    try:
        c = load_cluster(root / "cluster.yaml")
    except ConfigError as exc:
        out += exc.problems
    if m is not None and c is not None:
        out += validate_pair(m, c)
    return out


def _dump(d: Any) -> str:
    return yaml.safe_dump(d, sort_keys=False)


Mut = Callable[[dict], Any]


def m(fn: Mut) -> tuple[str, str]:
    d = copy.deepcopy(BASE_MODELS)
    fn(d)
    return _dump(d), _dump(BASE_CLUSTER)


def c(fn: Mut) -> tuple[str, str]:
    d = copy.deepcopy(BASE_CLUSTER)
    fn(d)
    return _dump(BASE_MODELS), _dump(d)


def m0(**kw: Any) -> tuple[str, str]:
    return m(lambda d: d["models"][0].update(kw))


def gpu0(**kw: Any) -> tuple[str, str]:
    return c(lambda d: d["gpus"][0].update(kw))


def raw_models(text: str) -> tuple[str, str]:
    return text, _dump(BASE_CLUSTER)


_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)
_MANY_ALIASES = "x: &x 1\nl: [" + ", ".join(["*x"] * 150) + "]\n"

# (id, (models text, cluster text), field path, offending value) -- both must be on ONE line.
CASES: list[tuple[str, tuple[str, str], str, str]] = [
    # ---- models.yaml: types and ranges
    ("slo-negative", m(lambda d: d["models"][0]["slo"].update(p99_ms=-5)), "models[0].slo.p99_ms", "-5"),
    (
        "slo-string",
        m(lambda d: d["models"][1]["slo"].update(p99_ms="fast")),
        "models[1].slo.p99_ms",
        "'fast'",
    ),
    (
        "slo-nan",
        m(lambda d: d["models"][0]["slo"].update(p99_ms=float("nan"))),
        "models[0].slo.p99_ms",
        "nan",
    ),
    # nothing reads a queue-time target, so the file may not claim one
    ("queue-ms-unused", m(lambda d: d["models"][0]["slo"].update(queue_ms=20)), "models[0].slo.queue_ms",
     "unknown key"),
    ("min-replicas-word", m0(min_replicas="two"), "models[0].min_replicas", "'two'"),
    ("min-replicas-float", m0(min_replicas=1.5), "models[0].min_replicas", "1.5"),
    ("max-replicas-bool", m0(max_replicas=True), "models[0].max_replicas", "True"),
    ("memory-zero", m0(memory_gb=0), "models[0].memory_gb", "0"),
    ("priority-huge", m0(priority=10**6), "models[0].priority", "1000000"),
    ("backend-unknown", m0(backend="gpu"), "models[0].backend", "'gpu'"),
    ("ha-string", m0(high_availability="maybe"), "models[0].high_availability", "'maybe'"),
    ("profiles-not-list", m0(profiles="1g.10gb"), "models[0].profiles", "'1g.10gb'"),
    ("profiles-empty", m0(profiles=[]), "models[0].profiles", "[]"),
    ("capacity-int-key", m0(capacity={1: 5}), "models[0].capacity", "keys must be strings, got 1"),
    ("model-not-mapping", m(lambda d: d["models"].append("llm2")), "models[3]", "'llm2'"),
    ("models-empty", m(lambda d: d.update(models=[])), "models", "[]"),
    ("models-mapping", m(lambda d: d.update(models={"resnet": 1})), "models", "{'resnet': 1}"),
    # ---- models.yaml: unknown keys (with a suggestion where one is close)
    ("unknown-key", m0(colour="red"), "models[0].colour", "'red'"),
    ("typo-key", m0(prioirty=3), "models[0].prioirty", "did you mean 'priority'"),
    ("typo-top", m(lambda d: d.update(modles=[])), "modles", "did you mean 'models'"),
    ("slo-unknown", m(lambda d: d["models"][0]["slo"].update(p95_ms=3)), "models[0].slo.p95_ms", "3"),
    # ---- models.yaml: cross-field rules
    ("min-gt-max", m0(min_replicas=5, max_replicas=2), "models[0].min_replicas", "5"),
    ("duplicate-name", m(lambda d: d["models"][1].update(name="resnet")), "models[1].name", "'resnet'"),
    ("name-not-dns", m0(name="Res_Net"), "models[0].name", "'Res_Net'"),
    ("profile-unknown", m0(profiles=["1g.10gb", "9g.90gb"]), "models[0].profiles[1]", "'9g.90gb'"),
    ("profile-twice", m0(profiles=["1g.10gb", "1g.10gb"]), "models[0].profiles[1]", "'1g.10gb'"),
    ("capacity-negative", m0(capacity={"1g.10gb": -3}), "models[0].capacity.1g.10gb", "-3"),
    ("capacity-unknown-profile", m0(capacity={"5g.50gb": 3}), "models[0].capacity.5g.50gb", "'5g.50gb'"),
    (
        "ha-one-replica",
        m0(high_availability=True, max_replicas=1, min_replicas=1),
        "models[0].max_replicas",
        "1",
    ),
    ("multinode-block-missing", m(lambda d: d["models"][2].pop("multinode")), "models[2].multinode", "None"),
    (
        "multinode-on-mig",
        m(lambda d: d["models"][0].update(multinode={"nodes_per_group": 2})),
        "models[0].multinode",
        "'mig'",
    ),
    (
        "multinode-world-size",
        m(lambda d: d["models"][2]["multinode"].update(tensor_parallel=3)),
        "models[2].multinode.tensor_parallel",
        "3",
    ),
    (
        "multinode-with-profiles",
        m(lambda d: d["models"][2].update(profiles=["7g.80gb"])),
        "models[2].profiles",
        "['7g.80gb']",
    ),
    # ---- cluster.yaml
    ("product-unknown", gpu0(product="A200-80GB"), "gpus[0].product", "'A200-80GB'"),
    ("count-zero", gpu0(count=0), "gpus[0].count", "0"),
    ("count-string", gpu0(count="two"), "gpus[0].count", "'two'"),
    ("layout-bad-start", gpu0(layout=["3g.40gb@2"]), "gpus[0].layout[0]", "'3g.40gb@2'"),
    ("layout-overlap", gpu0(layout=["4g.40gb@0", "3g.40gb@0"]), "gpus[0].layout[0]", "overlaps 3g.40gb@0"),
    ("layout-other-product", gpu0(layout=["1g.5gb@0"]), "gpus[0].layout[0]", "'1g.5gb@0'"),
    (
        "layout-too-much-compute",
        gpu0(layout=["7g.80gb@0", "1g.10gb@3"]),
        "gpus[0].layout",
        "uses 8 compute slices",
    ),
    ("layout-two-me", gpu0(layout=["1g.10gb+me@0", "1g.10gb+me@1"]), "gpus[0].layout", "'+me'"),
    ("layout-not-list", gpu0(layout="3g.40gb@0"), "gpus[0].layout", "'3g.40gb@0'"),
    ("layout-syntax", gpu0(layout=["3g.40gb"]), "gpus[0].layout[0]", "'3g.40gb'"),
    ("layouts-count", gpu0(layout=None, layouts=[["7g.80gb@0"]]), "gpus[0].layouts", "[['7g.80gb@0']]"),
    (
        "layouts-impossible",
        gpu0(layout=None, layouts=[["7g.80gb@0"], ["7g.80gb@0", "1g.10gb@7"]]),
        "gpus[0].layouts[1][1]",
        "'1g.10gb@7'",
    ),
    ("node-not-dns", gpu0(node="Node A"), "gpus[0].node", "'Node A'"),
    ("namespace-not-dns", c(lambda d: d.update(namespace="Default")), "namespace", "'Default'"),
    ("tick-zero", c(lambda d: d["policy"].update(tick_s=0)), "policy.tick_s", "0"),
    ("headroom-negative", c(lambda d: d["policy"].update(headroom=-0.5)), "policy.headroom", "-0.5"),
    ("churn-word", c(lambda d: d["policy"].update(churn_budget="many")), "policy.churn_budget", "'many'"),
    (
        "windows-swapped",
        c(lambda d: d["policy"].update(short_window_s=120, long_window_s=60)),
        "policy.short_window_s",
        "120",
    ),
    (
        "hpa-policy-type",
        c(
            lambda d: d["policy"].update(
                scale_down={"policies": [{"type": "Pod", "value": 1, "period_s": 15}]}
            )
        ),
        "policy.scale_down.policies[0].type",
        "'Pod'",
    ),
    (
        "hpa-period-cap",
        c(
            lambda d: d["policy"].update(
                scale_up={"policies": [{"type": "Pods", "value": 4, "period_s": 3600}]}
            )
        ),
        "policy.scale_up.policies[0].period_s",
        "3600",
    ),
    ("port-range", c(lambda d: d.update(local={"api_port": 70000})), "local.api_port", "70000"),
    (
        "port-clash",
        c(lambda d: d.update(local={"api_port": 8000, "frontdoor_port": 8000})),
        "local.api_port",
        "8000",
    ),
    # YAML 1.1 reads `yes` as true: a string field must say so rather than accept it.
    (
        "prometheus-yes",
        (_dump(BASE_MODELS), _dump(BASE_CLUSTER) + "local: {prometheus: yes}\n"),
        "local.prometheus",
        "'yes'",  # YAML 1.2: text, not a boolean
    ),
    (
        "rdma-fabric-missing",
        c(lambda d: d["rdma_pool"]["nodes"][0].pop("fabric")),
        "rdma_pool.nodes[0].fabric",
        "missing",
    ),
    (
        "rdma-duplicate",
        c(lambda d: d["rdma_pool"]["nodes"][1].update(name="rdma-0")),
        "rdma_pool.nodes[1].name",
        "'rdma-0'",
    ),
    (
        "rdma-also-mig",
        c(lambda d: d["rdma_pool"]["nodes"][0].update(name="node-a")),
        "rdma_pool.nodes[0].name",
        "'node-a'",
    ),
    (
        "nccl-gdr",
        c(lambda d: d["rdma_pool"].update(nccl={"net_gdr_level": "XYZ"})),
        "rdma_pool.nccl.net_gdr_level",
        "'XYZ'",
    ),
    ("no-gpus", c(lambda d: (d.update(gpus=[]), d.pop("rdma_pool"))), "gpus", "[]"),
    # ---- both files together
    (
        "profile-not-in-cluster",
        m0(profiles=["1g.5gb"], capacity={"1g.5gb": 50}),
        "models[0].profiles[0]",
        "'1g.5gb'",
    ),
    ("memory-too-big", m(lambda d: d["models"][1].update(memory_gb=500)), "models[1].memory_gb", "500"),
    ("profile-too-small", m0(memory_gb=15), "models[0].profiles[0]", "'1g.10gb'"),
    ("multinode-no-pool", c(lambda d: d.pop("rdma_pool")), "models[2].backend", "'multinode'"),
    (
        "multinode-group-too-big",
        m(lambda d: d["models"][2]["multinode"].update(nodes_per_group=3, pipeline_parallel=3)),
        "models[2].multinode.nodes_per_group",
        "3",
    ),
    (
        "multinode-fabric",
        m(lambda d: d["models"][2]["multinode"].update(fabric="ib-z")),
        "models[2].multinode.fabric",
        "'ib-z'",
    ),
    ("model-dir-missing", m0(model_dir="repo/nothing"), "models[0].model_dir", "'repo/nothing'"),
    ("no-capacity", m0(capacity=None), "models[0].capacity", "None"),
    (
        "capacity-file-missing",
        m0(capacity=None, capacity_file="cap.yaml"),
        "models[0].capacity_file",
        "'cap.yaml'",
    ),
    # ---- the files themselves
    ("yaml-syntax", raw_models("models:\n  - name: a\n   bad: [\n"), "line 3", "YAML syntax error"),
    ("yaml-unclosed-quote", raw_models('models: "abc\n'), "line", "YAML syntax error"),
    ("empty-file", raw_models(""), "models.yaml", "empty"),
    ("only-comments", raw_models("# nothing here\n\n"), "models.yaml", "empty"),
    ("top-level-list", raw_models("- 1\n- 2\n"), "(top level)", "list [1, 2]"),
    ("top-level-int-key", raw_models("1: 2\n"), "(top level)", "keys must be strings, got 1"),
    ("top-level-scalar", raw_models("hello\n"), "(top level)", "'hello'"),
    ("null-document", raw_models("~\n"), "(top level)", "None"),
    ("duplicate-key", raw_models("models: []\nmodels: []\n"), "line 2", "'models'"),
    ("alias-bomb", raw_models(_BOMB), "models.yaml", "alias bomb"),
    ("too-many-aliases", raw_models(_MANY_ALIASES), "models.yaml", "more than 100 YAML aliases"),
    ("recursive-alias", raw_models("a: &a [*a]\n"), "models.yaml", "recursive YAML alias"),
    (
        "deep-nesting",
        raw_models("x: " + "[" * 5000 + "]" * 5000 + "\n"),
        "models.yaml",
        "nesting deeper than 64",
    ),
    (
        "python-tag",
        raw_models("models: !!python/object/apply:os.system [echo hi]\n"),
        "line 1",
        "python/object/apply:os.system",
    ),
    ("huge-file", raw_models("x: '" + "a" * (1 << 20) + "'\n"), "models.yaml", "limit is 1048576 bytes"),
]


def test_base_files_are_valid(tmp_path: Path) -> None:
    assert _problems(_dump(BASE_MODELS), _dump(BASE_CLUSTER), tmp_path) == []


def test_exponent_numbers_are_numbers_as_in_yaml_1_2(tmp_path: Path) -> None:
    # PyYAML's YAML 1.1 reads 1.5e2 as the text "1.5e2"; a config must not be refused for it
    text = _dump(BASE_MODELS).replace("p99_ms: 100", "p99_ms: 1.0e2", 1)
    assert "1.0e2" in text and _problems(text, _dump(BASE_CLUSTER), tmp_path) == []
    models = load_models(tmp_path / "models.yaml")
    assert models.models[0].slo.p99_ms == 100.0
    assert all(isinstance(p, str) for m in models.models for p in (m.capacity or {}))  # 1g.10gb stays a name
    from autoscaler.config.build import load_demand

    (tmp_path / "d.yaml").write_text(f"{models.models[0].name}: 2e3\n")
    assert load_demand(tmp_path / "d.yaml") == {models.models[0].name: 2000.0}
    (tmp_path / "d.yaml").write_text(f"{models.models[0].name}: 2e3x\n")
    with pytest.raises(ConfigError, match="req/s must be a number >= 0, got '2e3x'"):
        load_demand(tmp_path / "d.yaml")


def test_at_least_25_distinct_cases() -> None:
    assert len({case[0] for case in CASES}) == len(CASES) >= 25
    assert len({case[1] for case in CASES}) == len(CASES)  # every input differs


@pytest.mark.parametrize(
    ("files", "path", "value"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_problem_names_field_and_value(tmp_path: Path, files: tuple[str, str], path: str, value: str) -> None:
    problems = _problems(*files, tmp_path)
    assert problems, "a malformed input was accepted"
    assert any(path in line and value in line for line in problems), problems
    assert all("Traceback" not in line and "\n" not in line for line in problems)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_models(tmp_path / "nope.yaml")
    assert err.value.problems == [f"{tmp_path / 'nope.yaml'}: file not found"]


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_cluster(tmp_path)
    assert "is a directory" in err.value.problems[0]


@pytest.mark.timeout(20)
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.yaml")  # opening a FIFO with no writer would block forever
    with pytest.raises(ConfigError) as err:
        load_models(tmp_path / "pipe.yaml")
    assert "not a regular file" in err.value.problems[0]


def test_non_utf8_file(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_bytes(b"models: \xff\xfe\n")
    with pytest.raises(ConfigError) as err:
        load_models(tmp_path / "m.yaml")
    assert "not UTF-8" in err.value.problems[0] and "xff" in err.value.problems[0]


def test_several_problems_one_line_each(tmp_path: Path) -> None:
    text = m(lambda d: (d["models"][0].update(min_replicas="x"), d["models"][1]["slo"].update(p99_ms=-1)))[0]
    problems = _problems(text, _dump(BASE_CLUSTER), tmp_path)
    assert any(p.startswith("models[0].min_replicas:") for p in problems)
    assert any(p.startswith("models[1].slo.p99_ms:") for p in problems)


# ---------------------------------------------------------------- the CLI: exit 2, never a traceback

runner = CliRunner()


def _write_pair(root: Path, models_text: str, cluster_text: str) -> tuple[str, str]:
    _make_repo(root)
    (root / "models.yaml").write_text(models_text)
    (root / "cluster.yaml").write_text(cluster_text)
    return str(root / "models.yaml"), str(root / "cluster.yaml")


@pytest.mark.parametrize(
    ("case_id"),
    [
        "slo-negative",
        "layout-overlap",
        "yaml-syntax",
        "alias-bomb",
        "empty-file",
        "huge-file",
        "multinode-no-pool",
        "top-level-list",
        "duplicate-key",
        "deep-nesting",
    ],
)
def test_cli_validate_exits_2_with_the_problem(tmp_path: Path, case_id: str) -> None:
    _, files, path, value = next(case for case in CASES if case[0] == case_id)
    mp, cp = _write_pair(tmp_path, *files)
    res = runner.invoke(app, ["validate", mp, cp])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.stderr.strip().splitlines()
    assert any(path in ln and value in ln for ln in lines), lines
    # every line names the file it is about
    assert all(ln.startswith((mp, cp)) for ln in lines), lines


def test_cli_reports_both_files_at_once(tmp_path: Path) -> None:
    mp, cp = _write_pair(tmp_path, m0(min_replicas=9)[0], gpu0(count=0)[1])
    res = runner.invoke(app, ["validate", mp, cp])
    assert res.exit_code == 2
    assert any(ln.startswith(f"{mp}: models[0].min_replicas") for ln in res.stderr.splitlines())
    assert any(ln.startswith(f"{cp}: gpus[0].count") for ln in res.stderr.splitlines())


def test_cli_missing_file(tmp_path: Path) -> None:
    res = runner.invoke(app, ["validate", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")])
    assert res.exit_code == 2
    assert f"{tmp_path / 'a.yaml'}: file not found" in res.stderr
    assert f"{tmp_path / 'b.yaml'}: file not found" in res.stderr


def test_cli_valid_files_print_a_summary(tmp_path: Path) -> None:
    mp, cp = _write_pair(tmp_path, _dump(BASE_MODELS), _dump(BASE_CLUSTER))
    res = runner.invoke(app, ["validate", mp, cp])
    assert res.exit_code == 0, res.output
    for word in ("resnet", "bert", "llm", "node-a/1", "rdma-1/0", "valid: 3 models, 4 GPUs"):
        assert word in res.stdout


@pytest.mark.parametrize("case_id", ["alias-bomb", "layout-bad-start", "huge-file"])
def test_installed_script_exit_2_no_traceback(tmp_path: Path, case_id: str) -> None:
    """The real console script, in a real process: what a user sees."""
    _, files, path, value = next(case for case in CASES if case[0] == case_id)
    mp, cp = _write_pair(tmp_path, *files)
    exe = [str(MIGSCALE)] if MIGSCALE.exists() else [sys.executable, "-m", "autoscaler.cli"]
    proc = subprocess.run([*exe, "validate", mp, cp], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert any(path in ln and value in ln for ln in proc.stderr.splitlines()), proc.stderr


def test_examples_validate() -> None:
    res = runner.invoke(
        app, ["validate", str(REPO / "examples/models.yaml"), str(REPO / "examples/cluster.yaml")]
    )
    assert res.exit_code == 0, res.output
    assert "valid: 4 models, 4 GPUs (2 MIG, 2 RDMA pool)" in res.stdout
