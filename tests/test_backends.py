"""Runtime backends: ONNX Runtime vs PyTorch parity, backend switching, TensorRT error, determinism."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from rad2_planner.config import load_params
from rad2_planner.networks import PlannerModel
from rad2_planner.policy import Rad2Policy
from rad2_planner.runtime import BackendUnavailableError, make_backend, onnx_export
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.onnx_export import ensure_onnx, example_inputs
from rad2_planner.runtime.ort_backend import OrtBackend
from rad2_planner.runtime.torch_backend import TorchBackend
from tiny_models import randomised_model, tiny_config


def _tiny_model() -> PlannerModel:
    model = randomised_model(tiny_config())
    model.discriminator_trained = True
    return model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = _tiny_model()
    onnx_dir = tmp_path_factory.mktemp("onnx")
    paths = ensure_onnx(model, onnx_dir)
    yield model, onnx_dir, paths
    torch.set_num_threads(before)


def _obs(cfg, seed=0):
    ex = example_inputs(cfg, batch=1, seed=seed)
    return {k: ex[k][0] for k in SCENE_INPUTS}


def _policy(model, backend, onnx_dir, **kw):
    return Rad2Policy(model, backend=backend, onnx_dir=onnx_dir, **kw)


def test_graph_level_parity(setup):
    model, onnx_dir, paths = setup
    params = load_params("planner")["runtime"]
    pt, ox = TorchBackend(model), OrtBackend(paths, params)
    ex = example_inputs(model.cfg, batch=2, m=7, seed=5)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    s_pt, s_ox = pt.encode(inputs), ox.encode(inputs)
    for k, v in pt.scene_outputs(s_pt).items():
        assert np.abs(v - s_ox[k]).max() < 1e-4, k
    d_pt = pt.denoise(ex["x_t"], ex["t"], s_pt)
    d_ox = ox.denoise(ex["x_t"], ex["t"], s_ox)
    assert d_pt.shape == (2, 7, 8, 2) and np.abs(d_pt - d_ox).max() < 1e-4
    sc_pt = pt.score(ex["trajectories"], inputs, s_pt)
    sc_ox = ox.score(ex["trajectories"], inputs, s_ox)
    assert sc_pt.shape == (2, 7) and np.abs(sc_pt - sc_ox).max() < 1e-4


@pytest.mark.parametrize("sampler", ["ddim", "dpmpp_2m"])
def test_plan_parity_same_noise(setup, sampler):
    model, onnx_dir, _ = setup
    obs = _obs(model.cfg)
    r_pt = _policy(model, "pytorch", onnx_dir, sampler=sampler).plan(obs, seed=11)
    r_ox = _policy(model, "onnxruntime", onnx_dir, sampler=sampler).plan(obs, seed=11)
    assert r_pt.candidates.shape == (load_params("planner")["planner"]["num_candidates"], 8, 2)
    assert np.abs(r_pt.candidates - r_ox.candidates).max() < 1e-4
    assert np.abs(r_pt.scores - r_ox.scores).max() < 1e-4
    assert r_pt.selected == r_ox.selected == int(np.argmax(r_pt.scores))
    assert r_ox.info["backend"] == "onnxruntime" and r_pt.info["backend"] == "pytorch"


def test_backend_parameter_switches(setup):
    model, onnx_dir, _ = setup
    params = load_params("planner")
    params["planner"]["backend"] = "pytorch"
    assert isinstance(Rad2Policy(model, params=params, onnx_dir=onnx_dir).backend, TorchBackend)
    params["planner"]["backend"] = "onnxruntime"
    assert isinstance(Rad2Policy(model, params=params, onnx_dir=onnx_dir).backend, OrtBackend)
    with pytest.raises(ValueError, match="planner.backend"):
        make_backend("tflite", model, params["runtime"])


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_tensorrt_requested_without_tensorrt_is_a_clear_error(setup):
    model, onnx_dir, _ = setup
    with pytest.raises(BackendUnavailableError, match="tensorrt.*cannot be imported"):
        _policy(model, "tensorrt", onnx_dir)


def test_determinism_for_a_seed(setup):
    model, onnx_dir, _ = setup
    obs = _obs(model.cfg)
    pol = _policy(model, "onnxruntime", onnx_dir)
    pol.reset(seed=4)
    first = [pol.plan(obs).candidates for _ in range(3)]
    pol.reset(seed=4)
    again = [pol.plan(obs).candidates for _ in range(3)]
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
    assert not np.allclose(first[0], first[1])  # consecutive cycles draw new noise
    pol.reset(seed=5)
    assert not np.allclose(pol.plan(obs).candidates, first[0])


@pytest.mark.parametrize("m,k", [(1, 1), (5, 3), (16, 2)])
def test_shapes_for_m_and_k(setup, m, k):
    model, onnx_dir, _ = setup
    r = _policy(model, "onnxruntime", onnx_dir, num_candidates=m, num_steps=k).plan(_obs(model.cfg), seed=0)
    assert r.candidates.shape == (m, 8, 2) and r.scores.shape == (m,) and 0 <= r.selected < m
    assert [key for key in r.timings_ms if key.startswith("denoise_") and key != "denoise_total"] == [
        f"denoise_{i}" for i in range(k)
    ]
    assert {"encode", "score", "select", "total"} <= set(r.timings_ms)


def test_untrained_discriminator_uses_fallback_rule(setup):
    model, onnx_dir, _ = setup
    model.discriminator_trained = False
    try:
        r = _policy(model, "pytorch", onnx_dir, fallback_selection="medoid").plan(_obs(model.cfg), seed=1)
        assert np.isnan(r.scores).all() and r.info["selection"] == "medoid"
        d = np.linalg.norm(r.candidates[:, None] - r.candidates[None], axis=-1).mean(-1).sum(1)
        assert r.selected == int(np.argmin(d))
        r = _policy(model, "pytorch", onnx_dir, fallback_selection="first").plan(_obs(model.cfg), seed=1)
        assert r.selected == 0
    finally:
        model.discriminator_trained = True


def test_onnx_cache_reused_and_refreshed(setup, monkeypatch):
    model, onnx_dir, _ = setup
    calls = []
    monkeypatch.setattr(onnx_export, "export_onnx", lambda m, d: calls.append(d) or {})
    ensure_onnx(model, onnx_dir)
    assert calls == []  # same weights: the cached graphs are reused
    other = _tiny_model()
    with torch.no_grad():
        other.denoiser.head.bias.add_(1.0)
    ensure_onnx(other, onnx_dir)
    assert len(calls) == 1  # changed weights: re-exported
