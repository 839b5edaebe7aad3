"""The emulated slice curves: env contract, formula, and the models' copy of it agree."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from autoscaler.act.local.emulation import curve_kind, emulation_env, expected_batch_ms, real_mig_env

REPO = Path(__file__).resolve().parents[2] / "triton_models"
MODELS = ("resnet", "bert", "rnn")


def _model_emulation_module():
    spec = importlib.util.spec_from_file_location(
        "migscale_emulation", REPO / "_common" / "migscale_emulation.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_emulation_env_carries_slice_identity():
    env = emulation_env("A100-SXM4-80GB", "1g.20gb", "node-a/0", 4, model="resnet")
    assert env["MIGSCALE_EMULATE"] == "1"
    assert env["MIGSCALE_PROFILE"] == "1g.20gb"
    assert env["MIGSCALE_PROFILE_KIND"] == "1g.dbl"
    assert env["MIGSCALE_GPU"] == "node-a/0"
    assert env["MIGSCALE_START"] == "4"
    assert env["MIGSCALE_MODEL"] == "resnet"


def test_emulation_env_rejects_unknown_profile():
    with pytest.raises(KeyError, match="9g.99gb"):
        emulation_env("A100-SXM4-80GB", "9g.99gb", "n/0", 0)


def test_real_mig_env_prefixes_uuid_once():
    assert real_mig_env("abc")["CUDA_VISIBLE_DEVICES"] == "MIG-abc"
    assert real_mig_env("MIG-abc")["CUDA_VISIBLE_DEVICES"] == "MIG-abc"
    assert real_mig_env("abc")["MIGSCALE_EMULATE"] == "0"


@pytest.mark.parametrize("model", MODELS)
def test_curves_are_complete_and_bigger_slices_are_not_slower(model):
    curve = json.loads((REPO / model / "emulation.json").read_text())
    assert curve["source"]
    order = ["1g", "2g", "3g", "4g", "7g"]
    for key in ("batch1_ms", "per_item_ms"):
        vals = [curve[key][k] for k in order]
        assert all(v > 0 for v in vals)
        assert vals == sorted(vals, reverse=True), f"{model} {key} must not grow with slice size"


def test_expected_batch_ms_formula_worked_example():
    # resnet 1g, batch 8: 31.44 + 7 * 9.524
    assert expected_batch_ms(REPO / "resnet", "1g", 8) == pytest.approx(31.44 + 7 * 9.524)
    # 1g+me and the double-memory 1g run the 1g curve
    assert expected_batch_ms(REPO / "resnet", "1g+me", 1) == expected_batch_ms(REPO / "resnet", "1g", 1)
    assert expected_batch_ms(REPO / "resnet", "1g.dbl", 3) == expected_batch_ms(REPO / "resnet", "1g", 3)


def test_expected_batch_ms_rejects_bad_input():
    with pytest.raises(ValueError, match="batch"):
        expected_batch_ms(REPO / "bert", "1g", 0)
    with pytest.raises(ValueError, match="5g"):
        curve_kind("5g")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind", ["1g", "2g", "3g", "4g", "7g", "1g+me"])
def test_model_side_emulator_matches_controller_formula(model, kind):
    mod = _model_emulation_module()
    env = {"MIGSCALE_EMULATE": "1", "MIGSCALE_PROFILE_KIND": kind}
    em = mod.Emulator(REPO / model, env)
    for batch in (1, 4, 8):
        assert em.target_ms(batch) == pytest.approx(expected_batch_ms(REPO / model, kind, batch))


def test_model_side_emulator_falls_back_to_profile_name_and_is_off_by_default():
    mod = _model_emulation_module()
    em = mod.Emulator(REPO / "rnn", {"MIGSCALE_EMULATE": "1", "MIGSCALE_PROFILE": "3g.40gb"})
    assert em.kind == "3g"
    off = mod.Emulator(REPO / "rnn", {"MIGSCALE_PROFILE_KIND": "1g"})
    assert not off.enabled and off.target_ms(8) == 0.0
    with pytest.raises(ValueError, match="MIGSCALE_PROFILE_KIND"):
        mod.Emulator(REPO / "rnn", {"MIGSCALE_EMULATE": "1"})


def test_pad_sleeps_only_the_remainder():
    mod = _model_emulation_module()
    em = mod.Emulator(REPO / "rnn", {"MIGSCALE_EMULATE": "1", "MIGSCALE_PROFILE_KIND": "7g"})
    # a batch whose real work already took longer than the emulated 20 ms adds nothing
    assert em.pad(1, time.perf_counter() - 1.0) == 0.0
    slept = em.pad(1, time.perf_counter())
    assert 0.0 < slept <= 0.020 + 1e-6
