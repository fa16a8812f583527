"""runtime.consistency on recordings of the fused sampler (runtime.fused_sampler true, the default): the
generator graph's inputs are recorded and checked; a recording with neither per-step denoiser nor
generator inputs is refused with a clear message instead of StopIteration. TensorRT itself is not
available here: the comparison runs ONNX Runtime against itself, and trt_vs_ort must get as far as
loading TensorRT."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
from rad2_core.config import load_merged, load_params
from rad2_planner.policy import Rad2Policy
from rad2_planner.runtime import BackendUnavailableError
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.consistency import (
    _recording_backend,
    check_recording,
    compare_calls,
    load_recorded_calls,
    ort_runners,
    recording_paths,
    save_recorded_calls,
    trt_vs_ort,
)
from rad2_planner.runtime.onnx_export import example_inputs
from tiny_models import randomised_model

PARAMS = load_merged()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """One planning cycle of a tiny model recorded with the step-by-step sampler and with the fused one
    (same model and ONNX directory: the second export adds only the generator graph)."""
    tmp = tmp_path_factory.mktemp("consistency")
    model = randomised_model()
    model.discriminator_trained = True
    ex = example_inputs(model.cfg, batch=1)
    out = {}
    for fused in (False, True):
        params = copy.deepcopy(load_params("planner"))
        params["runtime"]["fused_sampler"] = fused
        policy = Rad2Policy(model, params={**PARAMS, **params}, backend="onnxruntime", onnx_dir=tmp / "onnx")
        rec = _recording_backend(policy.backend)
        policy.plan({k: ex[k][0] for k in SCENE_INPUTS}, seed=0)
        path = tmp / f"rec_fused_{fused}.npz"
        save_recorded_calls(rec, path, policy.backend)
        out[fused] = (path, params["runtime"])
    return tmp / "onnx", out


@pytest.mark.parametrize("fused", [True, False])
def test_recordings_hold_the_denoising_graph_that_ran_and_check_against_it(recordings, fused):
    onnx_dir, recorded = recordings
    path, runtime = recorded[fused]
    calls = load_recorded_calls(path)
    graphs = check_recording(calls)
    assert graphs == {"scene_encoder", "discriminator", "generator" if fused else "denoiser"}
    paths = recording_paths(onnx_dir, path)
    assert ("generator" in paths) == fused and all(p.is_file() for p in paths.values())
    runners = ort_runners({g: paths[g] for g in graphs}, runtime)
    worst = compare_calls(runners, runners, calls)
    assert ("generator/x0" in worst) == fused and ("denoiser/x0" in worst) != fused
    assert all(err == [0.0, 0.0] for err in worst.values())
    if importlib.util.find_spec("tensorrt") is None:  # past the recording checks, up to TensorRT
        with pytest.raises(BackendUnavailableError):
            trt_vs_ort(paths, runtime, calls)


def test_a_recording_without_denoiser_or_generator_inputs_is_refused_clearly(recordings, tmp_path):
    """What the recorder wrote before it recorded the fused generator: encoder and discriminator only."""
    onnx_dir, recorded = recordings
    path, runtime = recorded[True]
    with np.load(path) as data:
        old = {k: data[k] for k in data.files if not k.startswith("generator")}
    np.savez(tmp_path / "old.npz", **old)
    calls = load_recorded_calls(tmp_path / "old.npz")
    with pytest.raises(ValueError, match="no per-step denoiser and no fused generator inputs"):
        trt_vs_ort(recording_paths(onnx_dir, tmp_path / "old.npz"), runtime, calls)


def test_a_file_that_is_not_a_recording_is_named(tmp_path):
    """A pickle, a non-zip file or an entry that is no call: ValueError naming the file (the tool turns
    it into an argparse error), never numpy's own traceback."""
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "text.npz").write_text("not a zip")
    np.savez(tmp_path / "keys.npz", **{"scene_encoder/first/bev": np.zeros(3)})
    for name, why in (("pickled.npy", "not a recording"), ("text.npz", "not a recording"),
                      ("keys.npz", "'scene_encoder/first/bev' is not <graph>/<call index>/<input>")):
        with pytest.raises(ValueError, match=f"{name}.*{why}" if why != "not a recording" else name):
            load_recorded_calls(tmp_path / name)
    with pytest.raises(ValueError, match="text.npz: not a recording"):
        recording_paths(tmp_path, tmp_path / "text.npz")
