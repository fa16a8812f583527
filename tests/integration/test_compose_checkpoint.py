"""rad2 train compose (rad2_training.compose): the generator of one checkpoint with the trained
discriminator of another, both runs' records kept, mismatched or untrained inputs refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from rad2_planner.networks import PlannerModel
from tiny_models import randomised_model, tiny_config

TOOL = ["-m", "rad2_bringup.cli", "train", "compose"]


def _save(model: PlannerModel, d: Path, trained: bool, record: dict) -> Path:
    model.discriminator_trained = trained
    model.training_info = record
    return model.save(d)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *TOOL, *args], capture_output=True, text=True, timeout=120)


def test_compose_keeps_the_generator_of_one_and_the_discriminator_of_the_other(tmp_path):
    gen = _save(randomised_model(seed=1), tmp_path / "gen", False, {"rl_command": "ogo run"})
    disc = _save(randomised_model(seed=2), tmp_path / "disc", True, {"rl_command": "tc-grpo run"})
    res = _run("--generator", str(gen), "--discriminator", str(disc), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    out = PlannerModel.load(tmp_path / "out")
    g, d = PlannerModel.load(gen), PlannerModel.load(disc)
    assert out.discriminator_trained
    # float16 on disk by default: equal to the sources within half precision, and different from the other
    for name, value in out.generator_state().items():
        assert torch.allclose(value, g.generator_state()[name], atol=2e-3, rtol=2e-3), name
    disc_out, disc_src = out.discriminator.state_dict(), d.discriminator.state_dict()
    for name, value in disc_out.items():
        assert torch.allclose(value, disc_src[name], atol=2e-3, rtol=2e-3), name
    assert any(not torch.allclose(v, g.discriminator.state_dict()[k], atol=1e-2) for k, v in disc_out.items())
    meta = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["weights_dtype"] == "float16"
    training = meta["training"]
    assert training["generator_training"]["rl_command"] == "ogo run"
    assert training["discriminator_training"]["rl_command"] == "tc-grpo run"
    composed = training["composed"]
    assert composed["generator_from"] == str(gen) and "--discriminator" in composed["command"]


def test_compose_refuses_mismatched_configs_untrained_discriminators_and_overwriting_an_input(tmp_path):
    gen = _save(randomised_model(seed=1), tmp_path / "gen", False, {})
    narrow = randomised_model(tiny_config(d_model=16, num_heads=2), seed=2)
    other = _save(narrow, tmp_path / "other", True, {})
    untrained = _save(randomised_model(seed=3), tmp_path / "untrained", False, {})
    res = _run("--generator", str(gen), "--discriminator", str(other), "--out", str(tmp_path / "o1"))
    assert res.returncode == 2 and "d_model" in res.stderr, res.stderr
    res = _run("--generator", str(gen), "--discriminator", str(untrained), "--out", str(tmp_path / "o2"))
    assert res.returncode == 2 and "discriminator_trained is false" in res.stderr, res.stderr
    res = _run("--generator", str(gen), "--discriminator", str(untrained), "--out", str(gen))
    assert res.returncode == 2 and "must differ" in res.stderr, res.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"format_version": 1}')
    res = _run("--generator", str(broken), "--discriminator", str(untrained), "--out", str(tmp_path / "o3"))
    assert res.returncode == 2 and "no model section" in res.stderr, res.stderr
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_compose_cli_help():
    res = _run("--help")
    assert res.returncode == 0 and "--discriminator" in res.stdout


def test_lossless_keeps_a_half_precision_generator_in_float16_and_a_trained_discriminator_exact(tmp_path):
    """--lossless: the generator of a float16 checkpoint stays float16 (no value changes), the
    discriminator whose weights are not exact float16s is written float32, bit for bit."""
    gen_model = randomised_model(seed=1)
    gen = tmp_path / "gen"
    gen_model.discriminator_trained = False
    gen_model.save(gen, dtype=torch.float16)
    disc = _save(randomised_model(seed=2), tmp_path / "disc", True, {})
    res = _run("--generator", str(gen), "--discriminator", str(disc), "--out", str(tmp_path / "out"),
               "--lossless")
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["weights_dtype"] == {"generator": "float16", "discriminator": "float32"}
    out, g, d = (PlannerModel.load(p) for p in (tmp_path / "out", gen, disc))
    for name, value in out.generator_state().items():
        assert torch.equal(value, g.generator_state()[name]), name
    for name, value in out.discriminator.state_dict().items():
        assert torch.equal(value, d.discriminator.state_dict()[name]), name
    res = _run("--generator", str(gen), "--discriminator", str(disc), "--out", str(tmp_path / "o2"),
               "--lossless", "--fp32")
    assert res.returncode == 2 and "not allowed with" in res.stderr, res.stderr
