"""Live model changes: what `migscale apply` hands over and how the local controller takes it (no servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.pids import is_run_dir
from autoscaler.config import ConfigError, load_cluster, load_models
from autoscaler.runtime.live_models import APPLIED, LiveModels, current_generation, submit
from autoscaler.runtime.local import LocalController
from autoscaler.runtime.local_setup import local_gpus, model_runtimes

CLUSTER = "gpus:\n  - {node: node-a, product: A100-SXM4-80GB, count: 1, emulated: true}\n"


def entry(name: str, p99: float = 150, extra: str = "") -> str:
    return (f"  - {{name: {name}, model_dir: {name}, slo: {{p99_ms: {p99}}}, profiles: [1g.10gb],"
            f" min_replicas: 1, max_replicas: 4, capacity: {{1g.10gb: 58}}{extra}}}\n")


@pytest.fixture
def world(tmp_path: Path):
    for name in ("resnet", "rnn", "bert"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "models.yaml").write_text("models:\n" + entry("resnet") + entry("rnn"))
    models, cluster = load_models(tmp_path / "models.yaml"), load_cluster(tmp_path / "cluster.yaml")
    gpus, _ = local_gpus(cluster)
    lc = LocalCluster(tmp_path / "run", model_runtimes(models), gpus)  # not started: no process runs
    assert is_run_dir(lc.run_dir)  # `down` may clear it (the demo's run dir is made this way)
    ctl = LocalController(lc, models, cluster)
    ctl.build_loop()
    said: list[str] = []
    live = LiveModels(ctl, lc, say=said.append)
    return tmp_path, ctl, lc, live, cluster, said


def write(tmp_path: Path, text: str, name: str = "new.yaml") -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_add_remove_and_change_take_effect_at_the_next_poll(world):
    tmp_path, ctl, lc, live, cluster, said = world
    new = write(tmp_path, "models:\n" + entry("resnet", 80) + entry("bert"))
    gen = submit(lc.run_dir, new, cluster)
    assert gen == 2 and live.generation == 1
    assert [s.name for s in ctl.loop.config.models] == ["resnet", "rnn"]  # nothing changes before the poll
    change = live.poll()
    assert change is not None and (change.added, change.removed, change.changed) == (("bert",), ("rnn",), ("resnet",))
    # what the next tick decides with
    assert [s.name for s in ctl.loop.config.models] == ["resnet", "bert"]
    assert ctl.loop.config.slo_p99_ms == {"resnet": 80.0, "bert": 150.0}
    assert ctl.slo_p99_ms["resnet"] == 80.0 and [s.name for s in ctl.specs] == ["resnet", "bert"]
    # bert can start; rnn had no replica, so its runtime goes at once
    assert "bert" in lc.models and "rnn" not in lc.models
    doc = live.describe()
    assert doc["generation"] == 2 and doc["models"] == ["resnet", "bert"] and "+bert" in doc["change"]
    from autoscaler.status import render_table

    assert "config:      generation 2 (resnet, bert)" in render_table({"replicas": [], "config": doc})
    assert live.poll() is None  # the same generation is taken once
    assert any("generation 2" in s for s in said)


def test_removed_model_keeps_its_runtime_until_its_last_replica_is_gone(world):
    tmp_path, ctl, lc, live, cluster, _ = world

    class Rep:
        model = "rnn"

    lc._replicas["rnn-0"] = Rep()  # type: ignore[assignment]  # a replica still draining
    submit(lc.run_dir, write(tmp_path, "models:\n" + entry("resnet")), cluster)
    live.poll()
    assert [s.name for s in ctl.loop.config.models] == ["resnet"]  # the planner drains rnn's replicas
    assert "rnn" in lc.models  # its route and restarts stay while a replica is left
    del lc._replicas["rnn-0"]
    live.poll()
    assert "rnn" not in lc.models


@pytest.mark.parametrize(("text", "field", "value"), [
    ("models:\n" + entry("resnet", -5), "models[0].slo.p99_ms", "-5"),
    ("models:\n" + entry("resnet", extra=", profiles_typo: [1g.10gb]"), "models[0].profiles_typo", ""),
    ("models:\n" + entry("resnet").replace("1g.10gb]", "1g.5gb]").replace("{1g.10gb: 58}", "{1g.5gb: 58}"),
     "models[0].profiles[0]", "'1g.5gb'"),
    ("models:\n" + entry("resnet").replace("model_dir: resnet", "model_dir: nowhere"), "models[0].model_dir",
     "'nowhere'"),
    ("models: [\n", "new.yaml", ""),
])
def test_invalid_file_is_refused_naming_field_and_value_and_nothing_is_handed_over(world, text, field, value):
    tmp_path, ctl, lc, live, cluster, _ = world
    with pytest.raises(ConfigError) as err:
        submit(lc.run_dir, write(tmp_path, text), cluster)
    lines = "\n".join(err.value.problems)
    assert field in lines and value in lines, lines
    assert not (lc.run_dir / APPLIED).exists()
    assert live.poll() is None and live.generation == 1
    assert [s.name for s in ctl.loop.config.models] == ["resnet", "rnn"]


def test_generations_increase_across_applies_and_a_refused_one_keeps_the_config_in_force(world):
    tmp_path, ctl, lc, live, cluster, said = world
    first = write(tmp_path, "models:\n" + entry("resnet") + entry("bert"), "a.yaml")
    assert submit(lc.run_dir, first, cluster) == 2
    assert submit(lc.run_dir, first, cluster) == 3  # handed over twice, never the same number
    # the model directory goes away between `apply` and the controller's poll: refused at pickup
    (tmp_path / "bert" / "config.pbtxt").unlink()
    assert live.poll() is None
    assert live.generation == 1 and live.refused == 3 and "config.pbtxt" in (live.error or "")
    assert [s.name for s in ctl.loop.config.models] == ["resnet", "rnn"]
    assert any("refused" in s for s in said)
    # status.json carries it: the next apply numbers after both
    (lc.run_dir / "status.json").write_text(json.dumps({"config": live.describe()}))
    assert current_generation(lc.run_dir) == 3
    assert live.describe()["refused_generation"] == 3


def test_a_running_models_directory_cannot_change_and_the_same_one_named_elsewhere_is_no_change(world):
    tmp_path, ctl, lc, live, cluster, _ = world

    class Rep:
        model = "resnet"

    lc._replicas["resnet-0"] = Rep()  # type: ignore[assignment]  # serving from resnet/
    # the same directories, named absolutely from a file in another folder: only the SLO changed
    (tmp_path / "elsewhere").mkdir()
    same = write(tmp_path / "elsewhere", "models:\n" + entry("resnet", 90).replace("model_dir: resnet",
                 f"model_dir: {tmp_path / 'resnet'}") + entry("rnn").replace("model_dir: rnn", "model_dir: ../rnn"))
    submit(lc.run_dir, same, cluster)
    change = live.poll()
    assert change is not None and (change.added, change.removed, change.changed) == ((), (), ("resnet",))
    # another directory for a running model (a new version): running replicas would keep the old
    # one and the front door would route to the new name -- refused, naming field and both values
    (tmp_path / "resnet_v2").mkdir()
    (tmp_path / "resnet_v2" / "config.pbtxt").write_text('name: "resnet_v2"\n')
    moved = write(tmp_path, "models:\n" + entry("resnet").replace("model_dir: resnet", "model_dir: resnet_v2")
                  + entry("rnn"))
    gen = submit(lc.run_dir, moved, cluster)  # valid on its own: only the controller knows what runs
    assert live.poll() is None and live.refused == gen and live.generation == 2
    assert "models[0].model_dir: resnet runs " in live.error and str(tmp_path / "resnet_v2") in live.error
    assert "remove resnet" in live.error
    assert lc.models["resnet"].triton_name == "resnet"  # the route still names what the replicas serve
    assert ctl.loop.config.slo_p99_ms["resnet"] == 90.0
    # rnn has no replica: nothing runs its old directory, so it may move
    (tmp_path / "rnn_v2").mkdir()
    (tmp_path / "rnn_v2" / "config.pbtxt").write_text('name: "rnn_v2"\n')
    submit(lc.run_dir, write(tmp_path, "models:\n" + entry("resnet", 90)
                             + entry("rnn").replace("model_dir: rnn", "model_dir: rnn_v2"), "c.yaml"), cluster)
    change = live.poll()
    assert change is not None and change.changed == ("rnn",) and lc.models["rnn"].triton_name == "rnn_v2"


def test_a_removed_model_comes_back_from_another_directory_only_once_its_replicas_are_gone(world):
    tmp_path, _ctl, lc, live, cluster, _ = world

    class Rep:
        model = "rnn"

    lc._replicas["rnn-0"] = Rep()  # type: ignore[assignment]  # still draining from rnn/
    submit(lc.run_dir, write(tmp_path, "models:\n" + entry("resnet"), "a.yaml"), cluster)
    assert live.poll() is not None and "rnn" in lc.models
    (tmp_path / "rnn2").mkdir()
    (tmp_path / "rnn2" / "config.pbtxt").write_text('name: "rnn2"\n')
    back = write(tmp_path, "models:\n" + entry("resnet") + entry("rnn").replace("model_dir: rnn", "model_dir: rnn2"))
    gen = submit(lc.run_dir, back, cluster)
    assert live.poll() is None and live.refused == gen and "models[1].model_dir: rnn runs" in live.error
    del lc._replicas["rnn-0"]  # its last replica is gone: the runtime retires, the model may come back
    submit(lc.run_dir, back, cluster)
    change = live.poll()
    assert change is not None and change.added == ("rnn",) and lc.models["rnn"].triton_name == "rnn2"


def test_a_half_written_file_is_never_read(world):
    tmp_path, ctl, lc, live, cluster, _ = world
    submit(lc.run_dir, write(tmp_path, "models:\n" + entry("resnet")), cluster)
    assert not list(lc.run_dir.glob("*.tmp"))  # written beside and renamed over
    (lc.run_dir / APPLIED).write_text('{"generation": 9, "mod')  # not what submit writes; but if it were
    assert live.poll() is None and "unreadable" in (live.error or "")
    assert [s.name for s in ctl.loop.config.models] == ["resnet", "rnn"]


def test_cli_apply_without_a_running_controller_exits_1(tmp_path):
    from typer.testing import CliRunner

    from autoscaler.cli import app

    out = CliRunner().invoke(app, ["apply", str(tmp_path / "m.yaml"), "--run-dir", str(tmp_path)])
    assert out.exit_code == 1 and "no controller running" in out.output
