"""Self-correction (CorrectionPlanner's correction trace on the diffusion generator): the correction
encoder, its exported graph, the policy's ``self_correction`` mode and the training traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from rad2_core.config import load_merged, load_schema
from rad2_planner.candidates import correction_inputs
from rad2_planner.networks import PlannerModel
from rad2_planner.networks.critic import CollisionCritic, CriticConfig
from rad2_planner.networks.model import same_scene_encoder
from rad2_planner.policy import Rad2Policy
from rad2_planner.runtime.base import SCENE_INPUTS
from rad2_planner.runtime.onnx_export import example_inputs
from rad2_planner.safety_layer import SafetyLayerParams
from rad2_training.correction import draw_traces, self_correcting_copy
from tiny_models import randomised_model, tiny_config

PARAMS = load_merged()
LAYER = replace(SafetyLayerParams.from_params(PARAMS), round_budget_ms=None)

TRACE_LEN = 3
MODES = load_schema("planner")["safety_layer.mode"].choices


class ScriptedCritic(CollisionCritic):
    """Risk = how far a candidate ends forward, minus ``offset``: a test knows what it rejects."""

    def __init__(self, offset: float = 0.0):
        super().__init__(CriticConfig(d_model=8, num_heads=2, num_blocks=1))
        self.offset = offset

    def logits(self, trajectories, agents, agents_mask, ego_state):
        return trajectories[..., -1, 0] - self.offset


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    base = randomised_model(tiny_config())
    base.discriminator_trained = True
    corrector = self_correcting_copy(base, TRACE_LEN)
    with torch.no_grad():  # a correction encoder that visibly matters (a fresh one starts almost muted)
        for prm in corrector.correction.parameters():
            prm.add_(torch.randn_like(prm) * 0.5)
        corrector.correction.key_bias.fill_(2.0)
    directory = tmp_path_factory.mktemp("self_correction")
    corrector.save(directory)
    ex = example_inputs(base.cfg, batch=3, seed=4)
    return base, directory, {k: ex[k] for k in SCENE_INPUTS}


def _policy(base, tmp_path, critic, **safety):
    return Rad2Policy(base, PARAMS, backend="pytorch", onnx_dir=tmp_path, critic=critic, num_candidates=8,
                      safety_layer=replace(LAYER, **safety))


def test_empty_trace_leaves_the_denoiser_exact_and_a_trace_changes_it(models):
    base, directory, obs = models
    corrector = PlannerModel.load(directory)
    assert corrector.cfg.correction_trace_len == TRACE_LEN and same_scene_encoder(base, corrector)
    ex = {k: torch.from_numpy(v) for k, v in example_inputs(base.cfg, batch=2, m=4, seed=1).items()}
    with torch.no_grad():
        tokens, bias, cond, _ = base.encoder(*(ex[k] for k in SCENE_INPUTS))
        plain = base.denoiser(ex["x_t"], ex["t"], tokens, bias, cond)
        trace = torch.randn(2, TRACE_LEN, base.cfg.plan_points, 2)
        empty = corrector.correction(tokens, bias, trace, torch.zeros(2, TRACE_LEN, dtype=torch.bool))
        full = corrector.correction(tokens, bias, trace, torch.ones(2, TRACE_LEN, dtype=torch.bool))
        # the fixture perturbed the correction encoder only: the denoisers are the same weights
        assert torch.equal(corrector.denoiser(ex["x_t"], ex["t"], *empty, cond), plain)
        assert not torch.allclose(corrector.denoiser(ex["x_t"], ex["t"], *full, cond), plain, atol=1e-4)


@pytest.mark.parametrize("runtime_name", ["onnxruntime", "openvino"])
def test_exported_correction_graph_matches_pytorch(models, tmp_path, runtime_name):
    from rad2_planner.runtime.openvino_backend import OpenVinoBackend
    from rad2_planner.runtime.ort_backend import OrtBackend
    from rad2_planner.runtime.torch_backend import TorchBackend

    base, directory, obs = models
    corrector = PlannerModel.load(directory)
    # one thread, one shard, symbolic shapes, f32: the graphs compared one to one
    runtime = {**PARAMS["runtime"], "ort_intra_op_threads": 1, "ort_inter_op_threads": 1,
               "ort_allow_spinning": False, "ort_candidate_shards": 1, "ort_fixed_shapes": False,
               "fused_sampler": False, "onnx_dir": str(tmp_path),
               "openvino": {"precision": "f32", "threads": 1, "cpu_pinning": False}}
    backend_class = OrtBackend if runtime_name == "onnxruntime" else OpenVinoBackend
    ort_backend, torch_backend = backend_class.from_model(corrector, runtime), TorchBackend(corrector)
    scene_t, scene_o = torch_backend.encode(obs), ort_backend.encode(obs)
    shape = (3, TRACE_LEN, base.cfg.plan_points, 2)
    trace = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    mask = np.array([[True, False, False], [True, True, True], [False, False, False]])
    ext_t = torch_backend.extend_scene(scene_t, trace, mask)
    ext_o = ort_backend.extend_scene(scene_o, trace, mask)
    assert ext_o["scene_tokens"].shape[1] == scene_o["scene_tokens"].shape[1] + TRACE_LEN
    np.testing.assert_allclose(ext_o["scene_tokens"], ext_t["scene_tokens"].numpy(), atol=1e-4)
    x = np.random.default_rng(1).standard_normal((3, 5, base.cfg.plan_points, 2)).astype(np.float32)
    t = np.full(3, 10.0, np.float32)
    np.testing.assert_allclose(ort_backend.denoise(x, t, ext_o), torch_backend.denoise(x, t, ext_t),
                               atol=1e-3)


def test_self_correction_conditions_each_round_on_every_rejected_proposal(models, tmp_path):
    base, directory, obs = models
    lenient = ScriptedCritic(offset=1e6)
    reference = _policy(base, tmp_path, lenient, mode="off").plan_batch(obs, seeds=[1, 2, 3])
    # reject whatever ends beyond the least forward reference candidate, so every row corrects
    offset = float(min(r.candidates[:, -1, 0].min() for r in reference)) - 1.0
    critic = ScriptedCritic(offset=offset)
    policy = _policy(base, tmp_path, critic, mode="self_correction", threshold=0.5, max_rounds=4,
                     correction_checkpoint=str(directory))
    seen = []
    extend = policy.critic_stage.corrector.extend_scene

    def spy(scene, trace, mask):
        seen.append((trace.copy(), mask.copy()))
        return extend(scene, trace, mask)

    policy.critic_stage.corrector.extend_scene = spy
    results = policy.plan_batch(obs, seeds=[1, 2, 3])
    assert len(seen) == 4  # max_rounds, every row rejected every time
    for r, (_, mask) in enumerate(seen, start=1):
        # round r sees the r rejected proposals so far, the newest L of them
        assert mask.sum(1).tolist() == [min(r, TRACE_LEN)] * 3
    for j, res in enumerate(reference):  # round 1's trace: the plain planner's selection
        z = base.normalizer.normalize(res.candidates[res.selected], obs["ego_state"][j, 0])
        np.testing.assert_allclose(seen[0][0][j, 0], z, atol=1e-5)
    for j, res in enumerate(results):
        assert res.info["safety_layer"] == "self_correction" and res.info["corrections"] == 4
        assert not res.info["critic_accepted"]  # nothing could be accepted; the least risky is executed
        # the cycle records every rejected proposal (the plain one and the four corrected ones); all but
        # the last are exactly what the corrector attended to in the last round
        recorded = res.info["correction_trace"]
        assert recorded.shape == (5, base.cfg.plan_points, 2)
        trace, mask = correction_inputs([list(recorded[:-1])], obs["ego_state"][j:j + 1, 0], base.normalizer,
                                        TRACE_LEN, base.cfg.plan_points)
        np.testing.assert_allclose(trace[0], seen[-1][0][j], atol=1e-5)
        assert mask[0].all()
    # the same noise without the trace (rejection sampling) proposes something else
    plain = _policy(base, tmp_path, critic, mode="rejection_sampling", threshold=0.5, max_rounds=4)
    other = plain.plan_batch(obs, seeds=[1, 2, 3])
    assert any(not np.allclose(a.candidates, b.candidates) for a, b in zip(results, other))


def test_accepted_first_proposal_needs_no_correction(models, tmp_path):
    base, directory, obs = models
    lenient = _policy(base, tmp_path, ScriptedCritic(offset=1e6), mode="self_correction",
                      correction_checkpoint=str(directory))
    off = _policy(base, tmp_path, ScriptedCritic(offset=1e6), mode="off")
    for a, b in zip(lenient.plan_batch(obs, seeds=[1, 2, 3]), off.plan_batch(obs, seeds=[1, 2, 3])):
        assert np.array_equal(a.candidates, b.candidates) and a.info["corrections"] == 0
        assert a.info["correction_trace"].shape == (0, base.cfg.plan_points, 2)


def test_correction_checkpoint_must_fit_the_planner(models, tmp_path):
    base, directory, obs = models
    with pytest.raises(ValueError, match="correction_checkpoint.*plain generator"):
        plain_dir = tmp_path / "plain"
        base.save(plain_dir)
        _policy(base, tmp_path, ScriptedCritic(), mode="self_correction",
                correction_checkpoint=str(plain_dir))
    other = self_correcting_copy(randomised_model(tiny_config(), seed=7), TRACE_LEN)
    other.save(tmp_path / "other")
    with pytest.raises(ValueError, match="correction_checkpoint.*scene encoder"):
        _policy(base, tmp_path, ScriptedCritic(), mode="self_correction",
                correction_checkpoint=str(tmp_path / "other"))


def test_training_traces_are_prefixes_of_mined_unsafe_proposals():
    rng = np.random.default_rng(0)
    unsafe = rng.standard_normal((4, TRACE_LEN, 5, 2)).astype(np.float32)
    count = np.array([0, 1, 3, 2])
    lengths = {i: set() for i in range(4)}
    for _ in range(200):
        trace, mask = draw_traces(rng, unsafe, count, np.arange(4), TRACE_LEN)
        for i in range(4):
            n = int(mask[i].sum())
            lengths[i].add(n)
            assert mask[i, :n].all() and not mask[i, n:].any()  # filled slots first
            for slot in range(n):  # every traced proposal is one of the row's mined unsafe ones
                assert any(np.array_equal(trace[i, slot], unsafe[i, k]) for k in range(count[i]))
            assert not trace[i, n:].any()
    assert lengths == {0: {0}, 1: {1}, 2: {1, 2, 3}, 3: {1, 2}}


def _synthetic_runs(modes, seeds=(0, 1, 2)):

    runs = [{"mode": m, "split": f"data/eval_{kind}", "kind": kind, "seed": s, "CR": 0.1 * MODES.index(m),
             "AF-CR": 0.05, "Safety@1": 0.9, "EP-Mean": 0.8, "corrections_per_cycle": 0.5 * MODES.index(m),
             "cycles_corrected": 0.2, "clip_ids": [f"{kind}_a", f"{kind}_b"]}
            for m in modes for kind in ("safety", "efficiency") for s in seeds]
    latencies = {m: {"p99_ms": 100.0 + MODES.index(m), "budget": {"p99_ms": 50.0 + MODES.index(m)}}
                 for m in modes}
    return runs, latencies


def test_safety_layer_table_reports_self_correction_and_both_latencies():
    from rad2_evaluation.safety_layer import summary_rows, table_lines

    runs, latencies = _synthetic_runs(MODES)
    rows = summary_rows(runs, MODES, 3, latencies)
    lines = table_lines(rows, runs, MODES, ["data/eval_safety", "data/eval_efficiency"], 3)
    row = next(line for line in lines if line.startswith("| + self-correction |"))
    assert row.rstrip().endswith("| 103.0 | 53.0 |")  # p99 without and with the round budget
    assert "0.300" in row  # the mode's own CR from its runs


def test_shipped_self_correcting_generator_fits_the_shipped_planner(tmp_path):
    """The shipped self-correcting generator shares its scene encoder with the planner it was fine-tuned
    from (checkpoints/rad2_rl), which can use the mode as is; the default planner, whose encoder learned
    from recorded traffic, refuses it by name."""
    import copy

    params = copy.deepcopy(PARAMS)
    params["planner"]["checkpoint_dir"] = "checkpoints/rad2_rl"
    policy = Rad2Policy.from_params(params, backend="pytorch", onnx_dir=tmp_path,
                                    safety_layer=replace(LAYER, mode="self_correction"))
    assert policy.critic_stage.corrector_trace_len >= 1
    info = policy.critic_stage.corrector.model.training_info
    # imitation with correction, then (optionally) the closed-loop fine-tuning on top of it
    imitation = info.get("previous_training", {}) if "held_out_check" not in info else info
    assert imitation["held_out_check"]["samples"] > 0
    with pytest.raises(ValueError, match="correction_checkpoint.*not fine-tuned from this planner"):
        Rad2Policy.from_params(PARAMS, backend="pytorch", onnx_dir=tmp_path,
                               safety_layer=replace(LAYER, mode="self_correction"))


def test_safety_layer_runs_split_by_mode_merge_into_one_table(tmp_path):
    import json

    from rad2_evaluation.safety_layer import merge_results

    dirs = []
    for name, modes, seeds in (("a", ("off", "self_correction"), (0, 1, 2)),
                               ("b", ("rejection_sampling", "candidate_selection"), (0, 1, 2)),
                               ("c", ("candidate_selection",), (0, 1))):
        runs, latencies = _synthetic_runs(modes, seeds)
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({
            "runs": runs, "latency": latencies, "num_candidates": 32, "command": f"run {name}",
            "wall_s": 1.0, "safety_layers": {m: {} for m in modes}, "hardware": {}, "load_before": [0.0]}))
        dirs.append(tmp_path / name)
    merged = merge_results(dirs[:2], tmp_path / "merged", MODES)
    assert [r["mode"] for r in merged["rows"]] == ["off", "rejection_sampling", "candidate_selection",
                                                   "self_correction"]
    table = (tmp_path / "merged" / "table.md").read_text()
    assert "| + self-correction |" in table and (tmp_path / "merged" / "safety_layer.png").is_file()
    # a later directory's runs of a mode replace the earlier ones (one mode re-evaluated after retraining)
    runs, latencies = _synthetic_runs(("self_correction",))
    for r in runs:
        r["CR"] = 0.05
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "results.json").write_text(json.dumps({
        "runs": runs, "latency": {"self_correction": {"p99_ms": 7.0, "budget": {"p99_ms": 6.0}}},
        "num_candidates": 32, "command": "run e", "wall_s": 1.0, "safety_layers": {"self_correction": {}},
        "hardware": {}, "load_before": [0.0]}))
    again = merge_results([*dirs[:2], tmp_path / "e"], tmp_path / "again", MODES)
    row = again["rows"][-1]
    assert row["mode"] == "self_correction" and row["CR"][0] == pytest.approx(0.05)
    assert row["p99_budget_ms"][0] == 6.0 and len(again["runs"]) == len(merged["runs"])
    assert again["rows"][0]["CR"] == merged["rows"][0]["CR"]  # the other modes are untouched
    with pytest.raises(ValueError, match="other seeds"):
        merge_results([dirs[0], dirs[2]], tmp_path / "bad", MODES)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="results.json: not the results.*no runs"):
        merge_results([dirs[0], tmp_path / "d"], tmp_path / "bad", MODES)
    (tmp_path / "d" / "results.json").write_text("{trunc")
    with pytest.raises(ValueError, match="results.json: unreadable"):
        merge_results([tmp_path / "d"], tmp_path / "bad", MODES)


def test_extra_rounds_on_onnxruntime_with_a_prefetched_discriminator_context(models, tmp_path):
    """ONNX Runtime with candidate shards starts the discriminator's scene context beside the encoder
    (a Future in the scene); the rows a safety layer plans again get their own scene, and their
    candidates are ranked by the discriminator as in the first pass."""
    base, directory, obs = models
    critic = ScriptedCritic(offset=-1e6)  # rejects everything: every row runs every extra round
    for mode, extra in (("rejection_sampling", {}), ("self_correction",
                                                     {"correction_checkpoint": str(directory)})):
        policy = Rad2Policy(base, PARAMS, backend="onnxruntime", onnx_dir=tmp_path, critic=critic,
                             # one export
                            num_candidates=8, safety_layer=replace(LAYER, mode=mode, threshold=0.5,
                                                                   max_rounds=2,
                                                                   **extra))
        assert policy.backend.split_discriminator  # the prefetching path is the one under test
        results = policy.plan_batch(obs, seeds=[1, 2, 3])
        for res in results:
            assert res.info["corrections"] == 2 and not res.info["critic_accepted"]
            assert np.isfinite(res.logits).all()
