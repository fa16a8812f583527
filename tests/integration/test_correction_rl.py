"""Closed-loop fine-tuning of the self-correcting generator (rad2_training.correction_rl): which decisions
become samples with which target and weight, the weighted / KL-regularised loss, and one real
iteration from the shipped checkpoints."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bev_warp_sim.trace import DecisionPoint
from rad2_core.config import load_merged
from rad2_training.correction_rl import CorrectionRLConfig, correction_samples, normalised_advantages
from rad2_training.ogo import OGOConfig, raw_segment, retime

PARAMS = load_merged()
# the planner the shipped self-correcting generator was fine-tuned from (it shares its scene encoder)
PARAMS["planner"]["checkpoint_dir"] = "checkpoints/rad2_rl"

T, PLAN_DT = 8, 0.5
OGO = OGOConfig(gamma_safe_s=2.0, decel_ratio=0.8, accel_ratio=1.15, lag_m=2.0, segment="executed")


def _plan(v: float) -> np.ndarray:
    return np.stack([v * PLAN_DT * (np.arange(T) + 1), np.zeros(T)], -1)


def _decision(step: int, corrections: int, accepted: bool, trace_len: int, v: float = 10.0
              ) -> DecisionPoint:
    trace = np.stack([_plan(v + 3.0)] * trace_len) if trace_len else np.zeros((0, T, 2))
    return DecisionPoint(step, np.array([step * 1.0, 0.0, 0.0, v, 0.0]), 0.0, "latch_done",
                         trajectory=_plan(v),
                         info={"corrections": corrections, "critic_accepted": accepted,
                               "correction_trace": trace.astype(np.float32), "plan_dt": PLAN_DT})


def _rollout(clip_id: str, reward: float, collided: bool, ttc: float, lag_m: float, decisions,
             at_fault: bool = False) -> SimpleNamespace:
    n = 80  # 8 s at 10 Hz, driving 10 m/s straight along x
    ego = np.zeros((n, 6))
    ego[:, 0] = np.arange(n) * 1.0
    ego[:, 3] = 10.0
    route_s = ego[:, 0].copy()
    trace = SimpleNamespace(clip_id=clip_id, start_step=0, dt=0.1, ego=ego, ttc=np.full(n, ttc),
                            route_s=route_s, expert_s=route_s + lag_m, collided=collided, at_fault=at_fault,
                            decisions=tuple(decisions))
    return SimpleNamespace(trace=trace, rewards={"correction_planner": reward})


def test_advantages_are_standardised_over_the_batch():
    np.testing.assert_allclose(normalised_advantages([1.0, -1.0, 0.0]), [1.2247449, -1.2247449, 0.0],
                               atol=1e-6)
    assert np.all(normalised_advantages([0.5, 0.5]) == 0)  # nothing to prefer


def test_samples_follow_the_outcome_of_each_corrected_decision():
    good = _rollout("good", 1.0, False, ttc=8.0, lag_m=0.0, decisions=[
        _decision(5, 1, True, 1),    # corrected and accepted in a good rollout: reinforced
        _decision(10, 0, True, 0),   # no correction: the corrector played no part
        _decision(15, 3, False, 4),  # corrected but never accepted: what ran is one of the rejected
    ])
    crashed = _rollout("crashed", -1.0, True, ttc=1.0, lag_m=5.0, decisions=[_decision(20, 2, True, 2)])
    ran_into = _rollout("ran_into", -1.0, True, ttc=8.0, lag_m=5.0, decisions=[_decision(7, 1, True, 1)],
                        at_fault=True)
    rear_ended = _rollout("rear_ended", -1.0, True, ttc=8.0, lag_m=5.0, decisions=[_decision(9, 1, True, 1)])
    slow = _rollout("slow", 0.4, False, ttc=8.0, lag_m=5.0, decisions=[_decision(30, 1, True, 1)])
    rollouts = [good, crashed, ran_into, slow, rear_ended]
    samples = correction_samples(rollouts, "correction_planner", OGO, T, PLAN_DT, advantage_clip=1.0)
    by_clip = {s.clip_id: s for s in samples}
    # lagging in a rollout that collided (at fault or not) gives no acceleration target, and a negative
    # advantage no reinforcement
    assert sorted(by_clip) == ["crashed", "good", "slow"]
    adv = normalised_advantages([1.0, -1.0, -1.0, 0.4, -1.0])

    s = by_clip["good"]
    assert (s.kind, s.step) == ("reinforce", 5)
    np.testing.assert_allclose(s.target, _plan(10.0))  # the executed (corrected) proposal
    assert s.weight == pytest.approx(min(adv[0], 1.0)) and s.trace.shape == (1, T, 2)

    s = by_clip["crashed"]  # TTC under γ_safe: the driven path, slower
    assert (s.kind, s.weight) == ("decelerate", 1.0) and s.trace.shape == (2, T, 2)
    np.testing.assert_allclose(s.target, retime(raw_segment(crashed.trace, 20, T, PLAN_DT), OGO.decel_ratio))
    assert s.target[-1, 0] == pytest.approx(0.8 * 40.0, rel=1e-6)  # 40 m driven in 4 s, compressed

    s = by_clip["slow"]  # safe, 5 m behind the log, no collision: the driven path, faster
    assert s.kind == "accelerate"
    assert s.target[-1, 0] == pytest.approx(1.15 * 40.0, rel=1e-6)


def test_weighted_loss_and_kl_term():
    from rad2_planner.diffusion import NoiseSchedule
    from rad2_training.correction import self_correcting_copy
    from rad2_training.imitation import diffusion_loss
    from tiny_models import randomised_model, tiny_config

    torch.manual_seed(0)
    model = self_correcting_copy(randomised_model(tiny_config()), 2).eval()
    from rad2_planner.runtime.onnx_export import example_inputs

    ex = example_inputs(model.cfg, batch=3, seed=2)
    batch = {k: torch.from_numpy(v) for k, v in ex.items()}
    batch["target"] = torch.randn(3, model.cfg.plan_points, 2) * 5
    trace = (torch.randn(3, 2, model.cfg.plan_points, 2), torch.tensor([[True, False]] * 3))
    schedule = NoiseSchedule(model.cfg.num_train_steps, "cosine")

    def loss(**kw):
        with torch.no_grad():
            return float(diffusion_loss(model, batch, schedule, 2, torch.Generator().manual_seed(1),
                                        correction=trace, **kw))

    plain = loss()
    assert loss(sample_weight=torch.ones(3)) == pytest.approx(plain, rel=1e-6)
    assert loss(sample_weight=torch.full((3,), 2.0)) == pytest.approx(2 * plain, rel=1e-6)
    assert loss(sample_weight=torch.zeros(3)) == 0.0
    # against itself the KL term vanishes; against another model it adds a positive amount
    assert loss(reference=model, kl_weight=1.0) == pytest.approx(plain, rel=1e-6)
    other = self_correcting_copy(randomised_model(tiny_config(), seed=1), 2).eval()
    assert loss(reference=other, kl_weight=1.0) > plain


def test_config_comes_from_params_and_refuses_unknown_keys():
    from rad2_core.config import load_params

    block = load_params("training")["self_correction_rl"]
    cfg = CorrectionRLConfig.from_params(block, iterations=2)
    assert cfg.iterations == 2 and cfg.reward == "correction_planner"
    assert isinstance(cfg.scenario_kinds, tuple)
    with pytest.raises(ValueError, match="unknown key"):
        CorrectionRLConfig.from_params(block, learning_rte=1.0)


def test_one_closed_loop_iteration_from_the_shipped_checkpoints(tmp_path):
    """One iteration on one training clip: the corrector's denoiser / correction encoder change, its
    scene encoder does not (the planner still accepts it), and the run writes its history and figure."""
    from rad2_core.config import load_params
    from rad2_planner.networks import PlannerModel
    from rad2_planner.networks.model import same_scene_encoder
    from rad2_planner.policy import Rad2Policy
    from rad2_planner.safety_layer import SafetyLayerParams
    from rad2_training.correction_rl import finetune

    block = load_params("training")["self_correction_rl"]
    cfg = CorrectionRLConfig.from_params(block, iterations=1, clips_per_iteration=1, group_size=1,
                                         updates_per_iteration=2, batch_size=4, learning_rate=1e-3,
                                         scenario_kinds=["hard_brake"])
    model, history = finetune("data/train", tmp_path, cfg, PARAMS, command="test", progress=False)
    start = PlannerModel.load("checkpoints/self_correction")
    assert len(history) == 1 and history[0]["rollouts"] == 1 and history[0]["decisions"] > 10
    assert history[0]["samples"] > 0, history  # the shipped critic rejects some proposal of a hard brake
    final = PlannerModel.load(tmp_path / "final")
    assert same_scene_encoder(final, start)
    changed = [k for k, v in final.state_dict().items() if not torch.equal(v, start.state_dict()[k])]
    assert changed and all(k.startswith(("denoiser.", "correction.")) for k in changed)
    assert json.loads((tmp_path / "history.json").read_text())[0]["iteration"] == 1
    assert (tmp_path / "history.png").stat().st_size > 0
    # the fine-tuned corrector plugs into the shipped planner
    sl = load_params("planner")["safety_layer"]
    Rad2Policy.from_params(PARAMS, backend="pytorch", safety_layer=SafetyLayerParams(
        "self_correction", 0.5, 3, sl["critic_checkpoint"], str(tmp_path / "final"), None))
