"""Runtime backends: ONNX Runtime vs PyTorch parity, backend switching, TensorRT error, determinism,
per-row seeds, sampled selection and the recorded discriminator inputs."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rad2_core.config import ParameterError, load_merged, load_params, merge_runtime_overrides
from rad2_planner.diffusion import NoiseSchedule, SamplerSpec
from rad2_planner.networks import PlannerModel
from rad2_planner.policy import Rad2Policy, stack_discriminator_inputs
from rad2_planner.runtime import BackendUnavailableError, make_backend, onnx_export
from rad2_planner.runtime.base import DISCRIMINATOR_OUTPUTS, SCENE_INPUTS
from rad2_planner.runtime.onnx_export import ensure_onnx, example_inputs
from rad2_planner.runtime.openvino_backend import OpenVinoBackend
from rad2_planner.runtime.ort_backend import OrtBackend
from rad2_planner.runtime.torch_backend import TorchBackend
from rad2_planner.selection import CandidateDistribution
from rad2_planner.selection import sample as sample_candidate
from tiny_models import randomised_model, tiny_config

PARAMS = load_merged()


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


def _batch(cfg, batch, seed=0):
    ex = example_inputs(cfg, batch=batch, seed=seed)
    return {k: ex[k] for k in SCENE_INPUTS}


def _row(batch_obs, i):
    return {k: v[i : i + 1] for k, v in batch_obs.items()}


def _argmax_params() -> dict:
    """planner params whose trained discriminator selects by the plain argmax of its logits over all
    candidates (RAD-2's rule), which these backend tests compare against. The shipped params rank
    the safe set with a consensus prior (checked in test_networks.py); parity under them is checked
    in test_plan_parity_same_noise."""
    params = copy.deepcopy(load_params("planner"))
    params["planner"]["discriminator_candidates"] = "all"
    params["planner"]["discriminator_prior_weight"] = 0.0
    return params


def _policy(model, backend, onnx_dir, **kw):
    kw["params"] = {**PARAMS, **kw.get("params", _argmax_params())}
    return Rad2Policy(model, backend=backend, onnx_dir=onnx_dir, **kw)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_graph_level_parity(setup, runtime):
    model, onnx_dir, paths = setup
    params = load_params("planner")["runtime"]
    pt = TorchBackend(model)
    ox = OrtBackend(paths, params) if runtime == "onnxruntime" else OpenVinoBackend(paths, params)
    ex = example_inputs(model.cfg, batch=2, m=7, seed=5)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    s_pt, s_ox = pt.encode(inputs), ox.encode(inputs)
    for k, v in pt.scene_outputs(s_pt).items():
        assert np.abs(v - s_ox[k]).max() < 1e-4, k
    d_pt = pt.denoise(ex["x_t"], ex["t"], s_pt)
    d_ox = ox.denoise(ex["x_t"], ex["t"], s_ox)
    assert d_pt.shape == (2, 7, 8, 2) and np.abs(d_pt - d_ox).max() < 1e-4
    lg_pt, sc_pt = pt.score_logits(ex["trajectories"], inputs, s_pt)
    lg_ox, sc_ox = ox.score_logits(ex["trajectories"], inputs, s_ox)
    assert lg_pt.shape == sc_pt.shape == lg_ox.shape == sc_ox.shape == (2, 7)
    assert np.abs(lg_pt - lg_ox).max() < 1e-4 and np.abs(sc_pt - sc_ox).max() < 1e-4
    for lg, sc in ((lg_pt, sc_pt), (lg_ox, sc_ox)):
        assert np.allclose(sc, 1.0 / (1.0 + np.exp(-lg.astype(np.float64))), atol=1e-6)
    assert np.array_equal(ox.score(ex["trajectories"], inputs, s_ox), sc_ox)  # score = the scores half


@pytest.mark.parametrize("sampler", ["ddim", "dpmpp_2m"])
def test_single_call_sampler_matches_the_step_by_step_loop(setup, sampler):
    """The fused generator graph (scene keys/values projected once, K steps in one call) computes what
    the NumPy sampler loop around the one-step denoiser computes, in PyTorch and in ONNX Runtime."""
    model, onnx_dir, _ = setup
    spec = SamplerSpec(3, sampler, 4.0)
    paths = ensure_onnx(model, onnx_dir, spec)
    params = load_params("planner")["runtime"]
    step_by_step = TorchBackend(model)
    fused = {
        "pytorch": TorchBackend(model, sampler_spec=spec),
        "onnxruntime": OrtBackend(paths, params, sampler_spec=spec),
        "openvino": OpenVinoBackend(paths, params, sampler_spec=spec),
    }
    ex = example_inputs(model.cfg, batch=2, m=5, seed=2)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    loop_timings: dict = {}
    ref = step_by_step.generate(ex["x_t"], step_by_step.encode(inputs), schedule, spec, loop_timings)
    assert sorted(loop_timings) == ["denoise_0", "denoise_1", "denoise_2"]
    for name, backend in fused.items():
        timings: dict = {}
        out = backend.generate(ex["x_t"], backend.encode(inputs), schedule, spec, timings)
        assert out.shape == ref.shape and np.abs(out - ref).max() < 1e-4, name
        assert list(timings) == ["generate"], name
        # another K or sampler than the graph was exported for: the step-by-step loop, same result
        other = spec._replace(num_steps=2)
        timings = {}
        out = backend.generate(ex["x_t"], backend.encode(inputs), schedule, other, timings)
        want = step_by_step.generate(ex["x_t"], step_by_step.encode(inputs), schedule, other)
        assert np.abs(out - want).max() < 1e-4 and sorted(timings) == ["denoise_0", "denoise_1"], name
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    assert SamplerSpec.from_dict(manifest["generators"][paths["generator"].name]) == spec


def test_candidate_shards_compute_what_one_call_computes(setup):
    """runtime.ort_candidate_shards splits the candidate-axis graphs into concurrent calls; the
    candidates are independent, so every M (odd, below the shard count) gives the one-call result."""
    model, onnx_dir, _ = setup
    spec = SamplerSpec(2, "ddim", 4.0)
    paths = ensure_onnx(model, onnx_dir, spec)
    base = dict(load_params("planner")["runtime"], ort_intra_op_threads=2)
    one = OrtBackend(paths, dict(base, ort_candidate_shards=1), sampler_spec=spec)
    two = OrtBackend(paths, dict(base, ort_candidate_shards=2), sampler_spec=spec)
    assert (one.shards, two.shards) == (1, 2)
    # capped at the intra-op threads: a one-thread Ray worker gets one call
    capped = OrtBackend(paths, dict(base, ort_intra_op_threads=1, ort_candidate_shards=4), sampler_spec=spec)
    assert capped.shards == 1
    for bad in (0, 2.5, True, "2"):
        with pytest.raises(ValueError, match="ort_candidate_shards"):
            OrtBackend(paths, dict(base, ort_candidate_shards=bad), sampler_spec=spec)
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    for m in (1, 2, 7):
        ex = example_inputs(model.cfg, batch=2, m=m, seed=m)
        inputs = {k: ex[k] for k in SCENE_INPUTS}
        scene = one.encode(inputs)
        for a, b in zip(
            (one.generate(ex["x_t"], scene, schedule, spec), one.denoise(ex["x_t"], ex["t"], scene),
             *one.score_logits(ex["trajectories"], inputs, scene)),
            (two.generate(ex["x_t"], scene, schedule, spec), two.denoise(ex["x_t"], ex["t"], scene),
             *two.score_logits(ex["trajectories"], inputs, scene)),
        ):
            assert a.shape == b.shape and a.shape[:2] == (2, m)
            assert np.abs(a - b).max() < 1e-5, m
        # the discriminator's context computed beside the encoder (prefetch) or at scoring time, and
        # the one-graph discriminator: the same logits
        prefetched = two.encode(inputs, prefetch_scores=True)
        assert two.split_discriminator and "_discriminator_context" in prefetched
        whole = one.sessions["discriminator"].run(["logits"], {
            **{k: inputs[k] for k in ("map_polylines", "map_mask", "agents", "agents_mask", "ego_state")},
            "trajectories": ex["trajectories"], "bev_tokens": scene["bev_tokens"]})[0]
        for logits in (two.score_logits(ex["trajectories"], inputs, prefetched)[0],
                       one.score_logits(ex["trajectories"], inputs, scene)[0]):
            assert np.abs(logits - whole).max() < 1e-5, m


def test_pinned_shape_sessions_compute_what_the_symbolic_session_computes(setup):
    """runtime.ort_fixed_shapes: a session per batch-1 call shape with the dimensions pinned (shape
    arithmetic folded at load) gives the symbolic session's results; the least recently used shape is
    closed beyond ort_fixed_shape_sessions; batched calls keep the symbolic session."""
    model, onnx_dir, _ = setup
    spec = SamplerSpec(2, "ddim", 4.0)
    paths = ensure_onnx(model, onnx_dir, spec)
    base = dict(load_params("planner")["runtime"], ort_intra_op_threads=1, ort_candidate_shards=1)
    symbolic = OrtBackend(paths, dict(base, ort_fixed_shapes=False), sampler_spec=spec)
    pinned = OrtBackend(paths, dict(base, ort_fixed_shapes=True, ort_fixed_shape_sessions=2),
                        sampler_spec=spec)
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    for batch, m in ((1, 3), (1, 5), (1, 3), (1, 2), (4, 3)):
        ex = example_inputs(model.cfg, batch=batch, m=m, seed=batch + m)
        inputs = {k: ex[k] for k in SCENE_INPUTS}
        outs = []
        for backend in (symbolic, pinned):
            scene = backend.encode(inputs)
            outs.append((backend.generate(ex["x_t"], scene, schedule, spec), *backend.score_logits(
                ex["trajectories"], inputs, scene)))
        for a, b in zip(*outs):
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-5, (batch, m)
    generator = pinned.sessions["generator"]
    # (1, 3) was used again after (1, 5), so (1, 5) was the least recent when (1, 2) came; batch 4 pins none
    assert generator.shapes == [(("batch", 1), ("candidates", 3)), (("batch", 1), ("candidates", 2))]
    assert symbolic.sessions["generator"].shapes == []  # one session over the symbolic dimensions
    for key in ("ort_fixed_shape_sessions", "ort_fixed_shapes_max_candidates"):
        for bad in (0, True, 1.5):
            with pytest.raises(ValueError, match=key):
                OrtBackend(paths, dict(base, ort_fixed_shapes=True, **{key: bad}))
    # more candidates per call than ort_fixed_shapes_max_candidates: the symbolic session serves it
    few = OrtBackend(paths, dict(base, ort_fixed_shapes=True, ort_fixed_shapes_max_candidates=4),
                     sampler_spec=spec)
    for m in (3, 5):
        ex = example_inputs(model.cfg, batch=1, m=m, seed=m)
        few.generate(ex["x_t"], few.encode({k: ex[k] for k in SCENE_INPUTS}), schedule, spec)
    assert few.sessions["generator"].shapes == [(("batch", 1), ("candidates", 3))]


def test_warm_up_opens_the_sessions_of_the_cycle(setup):
    """Rad2Policy.warm_up runs the cycle's calls at its shapes: the first real cycle opens no session
    (with pinned shapes, each new one costs a fraction of a second) and plans what it would have."""
    model, onnx_dir, _ = setup
    params = _argmax_params()
    params["runtime"] = dict(params["runtime"], ort_fixed_shapes=True)
    policy = _policy(model, "onnxruntime", onnx_dir, params=params)
    cold = _policy(model, "onnxruntime", onnx_dir, params=params).plan(_obs(model.cfg), seed=3)
    assert policy.warm_up() > 0
    opened = {g: s.shapes for g, s in policy.backend.sessions.items()}
    m = policy.num_candidates
    assert {c for (_, (_, c)) in opened["generator"]} == {len(r) for r in np.array_split(np.arange(m),
                                                                                        policy.backend.shards)}
    result = policy.plan(_obs(model.cfg), seed=3)
    assert {g: s.shapes for g, s in policy.backend.sessions.items()} == opened
    assert np.array_equal(result.candidates, cold.candidates) and result.selected == cold.selected


_FIRST_CYCLE_IMPORTS = """
import sys
sys.path.insert(0, sys.argv[2])
from rad2_core.config import load_merged
from rad2_planner.policy import Rad2Policy
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.onnx_export import example_inputs
from tiny_models import randomised_model, tiny_config

PARAMS = load_merged()
model = randomised_model(tiny_config())
model.discriminator_trained = True
policy = Rad2Policy(model, PARAMS, backend="onnxruntime", onnx_dir=sys.argv[1])  # the shipped selection rules
policy.warm_up()
ex = example_inputs(model.cfg, batch=1, seed=0)
before = set(sys.modules)
policy.plan({k: ex[k][0] for k in SCENE_INPUTS}, seed=0)
print(sorted(set(sys.modules) - before))
"""


def test_a_planning_cycle_after_warm_up_imports_nothing(setup, tmp_path):
    """A module imported inside the cycle is paid for by the first real cycle of every planner start:
    scipy.spatial, imported by the medoid's distance matrix, took 150-340 ms there (a deadline miss at
    each start of make demo). A fresh process, as a planner node is."""
    import subprocess
    import sys

    _, onnx_dir, _ = setup
    res = subprocess.run([sys.executable, "-c", _FIRST_CYCLE_IMPORTS, str(onnx_dir),
                          str(Path(__file__).parents[1])], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout[-2000:]


def test_exported_discriminator_outputs_logits_and_scores(setup):
    _, onnx_dir, paths = setup
    sess = OrtBackend(paths, load_params("planner")["runtime"]).sessions["discriminator"]
    assert tuple(o.name for o in sess.get_outputs()) == DISCRIMINATOR_OUTPUTS == ("logits", "scores")
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    assert manifest["export_format"] == onnx_export.EXPORT_FORMAT
    assert manifest["outputs"]["discriminator"] == ["logits", "scores"]


@pytest.mark.parametrize("sampler", ["ddim", "dpmpp_2m"])
def test_plan_parity_same_noise(setup, sampler):
    model, onnx_dir, _ = setup
    obs = _obs(model.cfg)
    r_pt = _policy(model, "pytorch", onnx_dir, sampler=sampler).plan(obs, seed=11)
    assert r_pt.candidates.shape == (load_params("planner")["planner"]["num_candidates"], 8, 2)
    for runtime in ("onnxruntime", "openvino"):
        r_ox = _policy(model, runtime, onnx_dir, sampler=sampler).plan(obs, seed=11)
        assert np.abs(r_pt.candidates - r_ox.candidates).max() < 1e-4, runtime
        assert np.abs(r_pt.scores - r_ox.scores).max() < 1e-4, runtime
        assert np.abs(r_pt.logits - r_ox.logits).max() < 1e-4, runtime
        assert r_pt.selected == r_ox.selected == int(np.argmax(r_pt.scores)) == int(np.argmax(r_pt.logits))
        assert math.isnan(r_ox.log_prob) and math.isnan(r_ox.entropy) and r_ox.probs is None  # deterministic
        assert r_ox.info["backend"] == runtime and r_pt.info["backend"] == "pytorch"
    # the shipped selection (safe set, consensus prior): the same candidate on every backend
    shipped = load_params("planner")
    picks = {_policy(model, b, onnx_dir, sampler=sampler, params=shipped).plan(obs, seed=11).selected
             for b in ("pytorch", "onnxruntime", "openvino")}
    assert len(picks) == 1


def test_backend_parameter_switches(setup):
    model, onnx_dir, _ = setup
    params = load_params("planner")
    params["planner"]["backend"] = "pytorch"
    assert isinstance(Rad2Policy(model, params={**PARAMS, **params}, onnx_dir=onnx_dir).backend, TorchBackend)
    params["planner"]["backend"] = "onnxruntime"
    assert isinstance(Rad2Policy(model, params={**PARAMS, **params}, onnx_dir=onnx_dir).backend, OrtBackend)
    params["planner"]["backend"] = "openvino"
    assert isinstance(Rad2Policy(model, params={**PARAMS, **params}, onnx_dir=onnx_dir).backend,
                      OpenVinoBackend)
    with pytest.raises(ValueError, match="planner.backend"):
        make_backend("tflite", model, params["runtime"])


def test_openvino_bfloat16_stays_close_to_float32(setup):
    """runtime.openvino.precision bf16: the matrix products in bfloat16 where the CPU has them (then the
    outputs differ from f32, by about 3 significant digits), plain f32 where it has not."""
    import openvino

    model, onnx_dir, _ = setup
    spec = SamplerSpec(3, "ddim", 4.0)
    paths = ensure_onnx(model, onnx_dir, spec)
    runtime = load_params("planner")["runtime"]
    f32 = OpenVinoBackend(paths, runtime, sampler_spec=spec)
    bf16 = OpenVinoBackend(paths, {**runtime, "openvino": {**runtime["openvino"], "precision": "bf16"}},
                           sampler_spec=spec)
    native = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert (f32.precision, bf16.requested_precision) == ("f32", "bf16")
    assert bf16.precision == ("bf16" if native else "f32")  # what was compiled, not what was asked
    ex = example_inputs(model.cfg, batch=2, m=16, seed=4)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    out = {}
    for name, backend in (("f32", f32), ("bf16", bf16)):
        scene = backend.encode(inputs)
        out[name] = (backend.generate(ex["x_t"], scene, schedule, spec),
                     backend.score_logits(ex["trajectories"], inputs, scene)[1])
    for a, b in zip(out["f32"], out["bf16"]):
        assert a.shape == b.shape and np.isfinite(b).all()
        assert np.abs(a - b).max() <= 0.05 * max(1.0, float(np.abs(a).max()))
    assert (np.abs(out["f32"][0] - out["bf16"][0]).max() > 1e-5) == native


def test_openvino_settings_are_checked(setup):
    _, _, paths = setup
    runtime = load_params("planner")["runtime"]
    # the precision is the schema's to check (the file, an override); the thread settings are also set
    # in code from a worker's thread count, so the backend checks them
    with pytest.raises(ParameterError, match="runtime.openvino.precision = 'fp8' is not one of"):
        merge_runtime_overrides(dict(runtime), {"openvino": {"precision": "fp8"}})
    for key, bad in (("threads", 0), ("threads", True), ("cpu_pinning", "yes")):
        with pytest.raises(ValueError, match=f"runtime.openvino.{key}"):
            OpenVinoBackend(paths, {**runtime, "openvino": {**runtime["openvino"], key: bad}})


def test_unavailable_ort_provider_is_a_clear_error(setup):
    _, _, paths = setup
    runtime = {**load_params("planner")["runtime"], "ort_providers": ["NoSuchExecutionProvider"]}
    with pytest.raises(BackendUnavailableError, match=r"runtime.ort_providers.*NoSuchExecutionProvider"):
        OrtBackend(paths, runtime)


def test_cuda_graphs_are_ignored_on_the_cpu(setup):
    model, _, _ = setup
    spec = SamplerSpec(2, "ddim", 4.0)
    plain = TorchBackend(model, sampler_spec=spec)
    graphed = TorchBackend(model, sampler_spec=spec, cuda_graphs=True)
    assert graphed.graphs == {}
    ex = example_inputs(model.cfg, batch=1, m=4, seed=1)
    inputs = {k: ex[k] for k in SCENE_INPUTS}
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    a = plain.generate(ex["x_t"], plain.encode(inputs), schedule, spec)
    b = graphed.generate(ex["x_t"], graphed.encode(inputs), schedule, spec)
    assert np.array_equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_cuda_graph_replay_matches_eager_cuda():
    """Replayed graphs compute what eager CUDA computes, one graph per M, and a returned output is
    not overwritten by the next replay; a capture that fails falls back to eager."""
    from rad2_planner.runtime.cuda_graphs import CudaGraphCache

    model = _tiny_model()  # no ONNX export: this test also runs on a GPU machine's own PyTorch
    spec = SamplerSpec(3, "ddim", 4.0)
    eager = TorchBackend(_tiny_model(), device="cuda", sampler_spec=spec)
    eager.model.load_state_dict(model.state_dict())
    graphed = TorchBackend(_tiny_model(), device="cuda", sampler_spec=spec, cuda_graphs=True)
    graphed.model.load_state_dict(model.state_dict())
    schedule = NoiseSchedule(model.cfg.num_train_steps)
    first = None
    for m, seed in ((5, 1), (9, 2), (5, 3)):
        ex = example_inputs(model.cfg, batch=1, m=m, seed=seed)
        inputs = {k: ex[k] for k in SCENE_INPUTS}
        s_e, s_g = eager.encode(inputs), graphed.encode(inputs)
        x_e = eager.generate(ex["x_t"], s_e, schedule, spec)
        x_g = graphed.generate(ex["x_t"], s_g, schedule, spec)
        assert np.abs(x_e - x_g).max() < 1e-4, m
        lg_e, _ = eager.score_logits(ex["trajectories"], inputs, s_e)
        lg_g, _ = graphed.score_logits(ex["trajectories"], inputs, s_g)
        assert np.abs(lg_e - lg_g).max() < 1e-4, m
        if first is None:
            first = (s_g["scene_tokens"], s_g["scene_tokens"].clone())
    assert torch.equal(*first)  # the first scene kept its values through later replays
    assert graphed.graphs["sampler"].captures == 2 and graphed.graphs["sampler"].replays == 3
    assert graphed.graphs["encoder"].captures == 1 and graphed.graphs["encoder"].disabled_reason is None

    def syncs_inside(x):  # a host sync cannot be captured
        return x * float(x.sum().item())

    cache = CudaGraphCache(syncs_inside, "sync test")
    x = torch.ones(3, device="cuda")
    with pytest.warns(RuntimeWarning, match="sync test"):
        out = cache(x)
    assert cache.disabled_reason is not None and torch.equal(out, syncs_inside(x))


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
    # runtime.fused_sampler: the K steps are one call, timed as a whole
    assert not [key for key in r.timings_ms if key.startswith("denoise_") and key != "denoise_total"]
    assert {"encode", "generate", "score", "select", "total"} <= set(r.timings_ms)


def test_impossible_m_and_k_are_refused_not_defaulted(setup):
    """0 used to fall back silently to the configured M / K; the schema's bounds apply per call too."""
    from rad2_core.config import ParameterError

    model, onnx_dir, _ = setup
    with pytest.raises(ParameterError, match=r"planner.num_denoise_steps = 0 is below"):
        _policy(model, "onnxruntime", onnx_dir, num_steps=0)
    pol = _policy(model, "onnxruntime", onnx_dir, num_candidates=4)
    obs = _obs(model.cfg)
    for kw, name in (({"num_candidates": 0}, "planner.num_candidates = 0"),
                     ({"num_candidates": 100000}, "planner.num_candidates = 100000 is above"),
                     ({"num_steps": 101}, "planner.num_denoise_steps = 101 is above"),
                     ({"num_candidates": 4.0}, "planner.num_candidates = 4.0 is not")):
        with pytest.raises(ParameterError, match=name):
            pol.plan(obs, seed=0, **kw)
    assert pol.plan(obs, seed=0, num_candidates=np.int64(3)).candidates.shape[0] == 3


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
    monkeypatch.setattr(onnx_export, "export_onnx", lambda m, d, spec=None: calls.append(d) or {})
    ensure_onnx(model, onnx_dir)
    assert calls == []  # same weights: the cached graphs are reused
    other = _tiny_model()
    with torch.no_grad():
        other.denoiser.head.bias.add_(1.0)
    ensure_onnx(other, onnx_dir)
    assert len(calls) == 1  # changed weights: re-exported


def test_onnx_cache_written_by_an_older_exporter_is_refreshed(setup, tmp_path, monkeypatch):
    model, onnx_dir, _ = setup
    stale = tmp_path / "onnx"
    stale.mkdir()
    for f in onnx_dir.iterdir():
        (stale / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((stale / "manifest.json").read_text())
    del manifest["export_format"]  # format 1 manifests had no such key (scores-only discriminator)
    (stale / "manifest.json").write_text(json.dumps(manifest))
    calls = []
    monkeypatch.setattr(onnx_export, "export_onnx", lambda m, d, spec=None: calls.append(d) or {})
    ensure_onnx(model, stale)
    assert calls == [stale]


def test_row_seeds_make_each_row_independent_of_the_batch(setup):
    model, onnx_dir, _ = setup
    obs = _batch(model.cfg, 3, seed=2)
    pol = _policy(model, "onnxruntime", onnx_dir, selection="sample")
    together = pol.plan_batch(obs, seeds=[5, 9, 13])
    alone = pol.plan_batch(_row(obs, 1), seeds=[9])[0]
    reordered = pol.plan_batch({k: v[[1, 0]] for k, v in obs.items()}, seeds=[9, 5])[0]
    for r in (alone, reordered):
        assert np.abs(r.candidates - together[1].candidates).max() < 1e-5
        assert np.abs(r.logits - together[1].logits).max() < 1e-5
        assert r.selected == together[1].selected and r.info["seed"] == 9
    # one row seeded s is exactly a plan with seed s (same noise, same sampling stream)
    single = pol.plan(_row(obs, 1), seed=9)
    assert np.array_equal(single.candidates, alone.candidates) and single.selected == alone.selected
    assert not np.allclose(together[0].candidates, pol.plan_batch(_row(obs, 0), seeds=[6])[0].candidates)
    with pytest.raises(ValueError, match="seeds: 2 given for a batch of 3"):
        pol.plan_batch(obs, seeds=[1, 2])
    with pytest.raises(ValueError, match="seeds: -1 is not a non-negative integer"):
        pol.plan_batch(obs, seeds=[1, -1, 2])
    with pytest.raises(ValueError, match="give seed .* or seeds, not both"):
        pol.plan_batch(obs, seed=3, seeds=[1, 2, 3])


def test_per_episode_noise_keeps_consecutive_plans_consistent(setup):
    """planner.initial_noise: per_episode reuses one noise draw, so the same scene gives the same plan
    cycle after cycle (per_cycle draws anew); per row the episode's noise seed decides, not the cycle's."""
    import copy

    model, onnx_dir, _ = setup
    obs = _row(_batch(model.cfg, 1, seed=3), 0)
    params = load_params("planner")
    per_cycle = _policy(model, "onnxruntime", onnx_dir, params=params)
    a, b = per_cycle.plan(obs), per_cycle.plan(obs)
    assert not np.allclose(a.candidates, b.candidates)
    episode_params = copy.deepcopy(params)
    episode_params["planner"]["initial_noise"] = "per_episode"
    per_episode = _policy(model, "onnxruntime", onnx_dir, params=episode_params)
    first, second = per_episode.plan(obs), per_episode.plan(obs)
    assert np.array_equal(first.candidates, second.candidates) and first.selected == second.selected
    per_episode.reset(seed=7)
    assert not np.allclose(per_episode.plan(obs).candidates, first.candidates)
    batch = _batch(model.cfg, 2, seed=3)
    r1 = per_episode.plan_batch(batch, seeds=[1, 2], noise_seeds=[40, 41])
    r2 = per_episode.plan_batch(batch, seeds=[8, 9], noise_seeds=[40, 41])
    assert all(np.array_equal(x.candidates, y.candidates) for x, y in zip(r1, r2))
    r3 = per_cycle.plan_batch(batch, seeds=[1, 2], noise_seeds=[40, 41])  # ignored per cycle
    r4 = per_cycle.plan_batch(batch, seeds=[8, 9], noise_seeds=[40, 41])
    assert not np.allclose(r3[0].candidates, r4[0].candidates)
    with pytest.raises(ValueError, match="noise_seeds: 1 given for a batch of 2"):
        per_episode.plan_batch(batch, seeds=[1, 2], noise_seeds=[40])
    bad = copy.deepcopy(params)
    bad["planner"]["initial_noise"] = "sometimes"
    with pytest.raises(ValueError, match="planner.initial_noise = 'sometimes' is not one of"):
        _policy(model, "onnxruntime", onnx_dir, params=bad)


def test_sampled_selection_draws_from_the_configured_distribution(setup):
    model, onnx_dir, _ = setup
    obs = _batch(model.cfg, 2, seed=4)
    dist = CandidateDistribution("softmax", temperature=0.5)
    pol = _policy(model, "onnxruntime", onnx_dir, selection="sample", candidate_distribution=dist)
    results = pol.plan_batch(obs, seeds=[21, 22])
    for r, s in zip(results, (21, 22)):
        want = sample_candidate(r.logits, np.random.default_rng([s, 1]), dist)
        assert r.selected == int(want.index) and r.info["selection"] == "sample:softmax"
        assert r.log_prob == pytest.approx(math.log(r.probs[r.selected]))
        assert r.entropy == pytest.approx(float(want.entropy)) and np.allclose(r.probs.sum(), 1.0)
    again = pol.plan_batch(obs, seeds=[21, 22])
    assert [r.selected for r in again] == [r.selected for r in results]
    # the same policy stays deterministic when asked, per call
    det = pol.plan_batch(obs, seeds=[21, 22], selection="deterministic")
    assert [r.selected for r in det] == [int(np.argmax(r.logits)) for r in results]
    assert det[0].info["selection"] == "discriminator" and math.isnan(det[0].log_prob)
    with pytest.raises(ValueError, match="planner.selection_mode: unknown value 'greedy'"):
        pol.plan(_obs(model.cfg), selection="greedy")


def test_sampling_without_a_trained_discriminator(setup):
    model, onnx_dir, _ = setup
    obs = _obs(model.cfg)
    m = load_params("planner")["planner"]["num_candidates"]
    model.discriminator_trained = False
    try:
        pol = _policy(model, "pytorch", onnx_dir, selection="sample")
        with pytest.raises(ValueError, match="distribution 'softmax' needs a trained discriminator"):
            pol.plan(obs, seed=0)
        uni = pol.plan(obs, seed=0, candidate_distribution=CandidateDistribution("uniform"))
        assert np.isnan(uni.logits).all() and np.isnan(uni.scores).all()  # no discriminator call
        assert uni.info["selection"] == "sample:uniform" and 0 <= uni.selected < m
        assert uni.log_prob == pytest.approx(-math.log(m)) and uni.entropy == pytest.approx(math.log(m))
        forced = _policy(model, "pytorch", onnx_dir, selection="sample", always_score=True).plan(obs, seed=0)
        assert np.isfinite(forced.logits).all() and np.isfinite(forced.log_prob)
    finally:
        model.discriminator_trained = True


def test_recorded_discriminator_inputs_reproduce_the_logits_in_pytorch(setup):
    model, onnx_dir, _ = setup
    pol = _policy(model, "onnxruntime", onnx_dir, selection="sample")
    results = pol.plan_batch(_batch(model.cfg, 2, seed=8), seeds=[1, 2], return_discriminator_inputs=True)
    rec = results[0].discriminator_inputs
    assert set(rec) == {"map_polylines", "map_mask", "agents", "agents_mask", "ego_state", "bev_tokens"}
    assert rec["bev_tokens"].shape == (model.cfg.bev_tokens, model.cfg.d_model)
    assert rec["map_mask"].dtype == bool and rec["bev_tokens"].dtype == np.float32
    candidates, inputs = stack_discriminator_inputs(results)
    logits = model.discriminator_logits(candidates, inputs)
    assert logits.requires_grad  # the RL update differentiates through it
    want = np.stack([r.logits for r in results])
    assert np.abs(logits.detach().numpy() - want).max() < 1e-4
    assert pol.plan(_obs(model.cfg), seed=0).discriminator_inputs is None  # only when asked
    with pytest.raises(ValueError, match="return_discriminator_inputs=True"):
        stack_discriminator_inputs([pol.plan(_obs(model.cfg), seed=0)])


class _ReadsOnlyTheFirstInput(torch.nn.Module):
    def forward(self, trajectories, agents, ego_state):
        return trajectories * 2.0


def test_an_exported_graph_keeps_every_input_even_one_the_weights_ignore(tmp_path):
    """Tracing prunes an input the module never reads; the export puts it back in its place with its
    dynamic axes, so callers feed one interface whatever the weights do."""
    import onnx
    import onnxruntime as ort

    names = ("trajectories", "agents", "ego_state")
    args = (torch.ones(2, 3, 8, 2), torch.ones(2, 5, 10), torch.ones(2, 4))
    dynamic = {"trajectories": {0: "batch", 1: "candidates"}, "agents": {0: "batch", 1: "agents"},
               "ego_state": {0: "batch"}}
    path = tmp_path / "g.onnx"
    onnx_export._export(_ReadsOnlyTheFirstInput(), args, names, ("out",), dynamic, path)
    graph = onnx.load(str(path)).graph
    assert [v.name for v in graph.input] == list(names)
    agents_dims = [d.dim_param or d.dim_value for d in graph.input[1].type.tensor_type.shape.dim]
    assert agents_dims == ["batch", "agents", 10]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {"trajectories": np.ones((1, 7, 8, 2), np.float32), "agents": np.zeros((1, 2, 10), np.float32),
            "ego_state": np.zeros((1, 4), np.float32)}
    np.testing.assert_array_equal(sess.run(None, feed)[0], 2.0 * feed["trajectories"])


def test_onnx_cache_lives_beside_the_checkpoint_it_was_exported_from(tmp_path):
    """A checkpoint named by planner.checkpoint_dir exports into its own folder; another checkpoint (a
    separate discriminator checkpoint) never writes into it. (Two exports: each takes about a minute.)"""
    params = load_params("planner")
    dirs = {name: randomised_model(tiny_config(), seed=seed).save(tmp_path / name)
            for name, seed in (("a", 0), ("b", 1))}
    p = {**params, "planner": {**params["planner"], "checkpoint_dir": str(dirs["a"])}}
    policy = Rad2Policy.from_params({**PARAMS, **p}, backend="onnxruntime")
    assert Path(policy.backend.paths["scene_encoder"]).parent == dirs["a"] / "onnx"
    manifest_a = json.loads((dirs["a"] / "onnx" / "manifest.json").read_text())
    assert manifest_a["weights_hash"] == PlannerModel.load(dirs["a"]).weights_hash()
    assert not (dirs["b"] / "onnx").exists()
    # generator a with b's discriminator: its own graphs, cached beside the discriminator checkpoint
    p = {**params, "planner": {**params["planner"], "checkpoint_dir": str(dirs["a"]),
                               "discriminator_checkpoint": str(dirs["b"])}}
    mixed = Rad2Policy.from_params({**PARAMS, **p}, backend="onnxruntime")
    assert Path(mixed.backend.paths["scene_encoder"]).parent == dirs["b"] / "onnx"
    assert (dirs["b"] / "onnx" / "manifest.json").is_file()
    assert json.loads((dirs["a"] / "onnx" / "manifest.json").read_text()) == manifest_a


def test_operator_profile_counts_the_cycle_flops_and_plans_unchanged(setup, tmp_path):
    """runtime.ort_profile_prefix: every session writes ONNX Runtime's operator trace; the profile's
    matrix-product FLOPs, counted from the recorded shapes, agree with PyTorch's FLOP counter of the
    same networks, and profiling changes no plan."""
    from rad2_evaluation.benchmarking import MATRIX_OPS, operator_profile, planning_cycle_flops

    model, onnx_dir, _ = setup
    params = _argmax_params()
    params["runtime"] = dict(params["runtime"], ort_profile_prefix=f"{tmp_path}/trace/")
    profiled = _policy(model, "onnxruntime", onnx_dir, params=params, always_score=True)
    plain = _policy(model, "onnxruntime", onnx_dir, always_score=True)
    m = profiled.num_candidates
    profiled.warm_up(m)
    cycles = 3
    for i in range(cycles):
        a, b = profiled.plan(_obs(model.cfg, i), seed=i), plain.plan(_obs(model.cfg, i), seed=i)
        assert np.array_equal(a.candidates, b.candidates) and a.selected == b.selected
    traces = profiled.backend.end_profiling()
    assert traces and all(Path(t).parent == tmp_path / "trace" for t in traces)
    profile = operator_profile(traces, cycles)
    assert {"generator", "scene_encoder"} <= set(profile["graphs"])
    assert any(op in profile["graphs"]["generator"]["ops"] for op in MATRIX_OPS)
    torch_flops = planning_cycle_flops(model, m, profiled.num_steps)
    # the counter also counts the few non-matrix FLOPs (convolutions, softmax): within 25 %
    assert profile["matrix"]["gflop_per_cycle"] == pytest.approx(torch_flops["total"] / 1e9, rel=0.25)
    assert profile["kernel_ms_per_cycle"] == pytest.approx(
        profile["matrix"]["ms_per_cycle"] + profile["other_ms_per_cycle"])
    # off by default: no trace is written
    assert plain.backend.end_profiling() == []
    # a prefix whose folder cannot be made is named
    (tmp_path / "file").write_text("")
    params["runtime"]["ort_profile_prefix"] = f"{tmp_path}/file/sub/"
    with pytest.raises(ValueError, match="runtime.ort_profile_prefix: cannot create the folder"):
        _policy(model, "onnxruntime", onnx_dir, params=params)


def test_operator_profile_keeps_the_traces_of_closed_sessions(setup, tmp_path):
    """A pinned-shape session closed to make room for another (ort_fixed_shape_sessions) still hands its
    trace to end_profiling."""
    model, onnx_dir, _ = setup
    params = _argmax_params()
    params["runtime"] = dict(params["runtime"], ort_profile_prefix=f"{tmp_path}/", ort_fixed_shapes=True,
                             ort_fixed_shape_sessions=1, ort_candidate_shards=1)
    policy = _policy(model, "onnxruntime", onnx_dir, params=params)
    for m in (4, 6):  # two call shapes: the first shape's pinned sessions are closed
        policy.plan(_obs(model.cfg), num_candidates=m, seed=0)
    assert all(len(s.shapes) <= 1 for s in policy.backend.sessions.values())
    traces = policy.backend.end_profiling()
    generator = [t for t in traces if Path(t).name.startswith("generator_")]
    assert len(generator) == 3 and all(Path(t).is_file() for t in generator)  # symbolic + 2 pinned


def test_the_evaluated_rad2_policy_runs_on_the_backend_asked_for():
    """rad2 eval policy --backend reaches the shipped rad2 policy (it used to be dropped silently)."""
    from bev_warp_sim.reference_policies import make_policy

    assert make_policy("rad2", PARAMS).backend.name == load_params("planner")["planner"]["backend"]
    assert make_policy("rad2", PARAMS, backend="openvino").backend.name == "openvino"


def test_runtime_overrides_update_one_key_of_a_block_and_are_checked():
    from rad2_core.config import ParameterError, merge_runtime_overrides

    runtime = copy.deepcopy(load_params("planner")["runtime"])
    merge_runtime_overrides(runtime, {"openvino": {"precision": "bf16"}, "ort_intra_op_threads": 1})
    assert runtime["openvino"] == {**load_params("planner")["runtime"]["openvino"], "precision": "bf16"}
    assert runtime["ort_intra_op_threads"] == 1
    for bad in ({"openvino": {"precision": "fp8"}}, {"openvino": {"pinning": True}}, {"no_such_key": 1}):
        with pytest.raises(ParameterError, match="runtime"):
            merge_runtime_overrides(copy.deepcopy(runtime), bad)
