"""Which RL round a run keeps (rad2_training.train.better_round, used by train for best/): the fewest
at-fault collisions on the validation clips, then the highest nuPlan-style score, then the lowest
collision rate; validation clips drawn from their own datasets (rl.validation_data); the KL trust
region of TC-GRPO to the consensus prior's ranking."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rad2_core.config import load_params
from rad2_training.session import validation_from
from rad2_training.tc_grpo import AdaptiveEntropy, DecisionBatch, TCGRPOConfig, tc_grpo_loss
from rad2_training.train import RunState, better_round, config_from_params, round_key, train


def _val(at_fault, score, cr, reward=0.0, n=16):
    return {"val_clips": float(n), "val_at_fault_collisions": float(at_fault), "val_score": score,
            "val_collision_rate": cr, "val_at_fault_collision_rate": at_fault / n, "val_progress_ratio": 0.9,
            "val_reward": reward}


def test_fewer_at_fault_collisions_win_whatever_the_score_and_the_reward():
    safer = _val(at_fault=1, score=0.40, cr=0.50, reward=-5.0)
    faster = _val(at_fault=2, score=0.95, cr=0.13, reward=+5.0)
    assert better_round(safer, faster) and not better_round(faster, safer)
    assert round_key(safer) < round_key(faster)
    # the old rule kept the other one
    assert better_round(faster, safer, "reward") and not better_round(safer, faster, "reward")


def test_then_the_higher_score_then_the_lower_collision_rate():
    assert better_round(_val(1, 0.8, 0.3), _val(1, 0.7, 0.1))
    assert not better_round(_val(1, 0.7, 0.1), _val(1, 0.8, 0.3))
    assert better_round(_val(1, 0.8, 0.1), _val(1, 0.8, 0.2))
    assert not better_round(_val(1, 0.8, 0.2), _val(1, 0.8, 0.1))


def test_a_tie_keeps_the_earlier_round_and_an_incomplete_validation_is_never_kept():
    assert not better_round(_val(0, 0.8, 0.1), _val(0, 0.8, 0.1))
    assert better_round(_val(3, 0.1, 0.9), None)  # the first validated round is kept
    for bad in ({**_val(0, 0.9, 0.0), "val_score": math.nan}, {"val_reward": 1.0}, {}):
        assert round_key(bad) is None
        assert not better_round(bad, None) and not better_round(bad, _val(5, 0.0, 1.0))
    assert better_round(_val(5, 0.0, 1.0), {"val_reward": 1.0})  # an old record without the counts
    assert not better_round({"val_reward": math.nan}, None, "reward")
    with pytest.raises(ValueError, match="rl.keep_round_by"):
        round_key(_val(0, 1.0, 0.0), "score")


class _FakeRun:
    """What train() uses of an RLRun, with a synthetic validation per round (index 0: the start)."""

    def __init__(self, validations, keep_round_by="safety", validate_every=1):
        self.cfg = SimpleNamespace(iterations=len(validations) - 1, validate_every=validate_every,
                                   checkpoint_every=1000, keep_round_by=keep_round_by)
        self.validations = list(validations)
        self.val_clips = ["clip"]
        self.state = RunState(history=[])
        self.saved_best: list[int] = []

    def validate(self):
        return dict(self.validations[self.state.iteration])

    def iteration(self, progress=None):
        self.state.history.append({"iteration": self.state.iteration})
        self.state.iteration += 1
        return {"reward_mean": 0.0, "collision_rate": 0.0}

    def save_best(self, directory, validation):
        self.saved_best.append(self.state.iteration)

    def save(self, directory):
        pass


def test_train_keeps_the_round_the_rule_picks_among_synthetic_validations(tmp_path):
    rounds = [
        _val(2, 0.70, 0.25, reward=0.1),  # the start
        _val(3, 0.90, 0.20, reward=0.9),  # more progress, more at-fault: the old rule's pick
        _val(1, 0.60, 0.30, reward=0.2),  # fewer at-fault collisions: kept
        _val(1, 0.65, 0.35, reward=0.3),  # as many, higher score: kept
        _val(1, 0.65, 0.30, reward=0.0),  # as many, same score, lower CR: kept
        _val(1, 0.65, 0.30, reward=0.5),  # a tie: the earlier round stays
        _val(4, 0.99, 0.05, reward=1.0),
    ]
    run = _FakeRun(rounds)
    state = train(run, tmp_path)
    assert run.saved_best == [0, 2, 3, 4]
    assert state.best_iteration == 4 and state.best_validation == rounds[4]
    assert state.best_val_reward == rounds[4]["val_reward"]
    assert [h.get("val_score") for h in state.history] == [r["val_score"] for r in rounds[1:]]
    by_reward = _FakeRun(rounds, keep_round_by="reward")
    assert train(by_reward, tmp_path / "r").best_iteration == 6 and by_reward.saved_best == [0, 1, 6]


def test_the_start_stays_kept_when_no_round_validates_safer(tmp_path):
    run = _FakeRun([_val(0, 0.5, 0.0), _val(1, 0.99, 0.1, reward=9.0), _val(0, 0.5, 0.0)])
    assert train(run, tmp_path).best_iteration == 0 and run.saved_best == [0]


def test_rl_settings_of_the_file():
    training = load_params("training")
    rl = training["rl"]
    assert rl["keep_round_by"] == "safety" and rl["validation_data"] == []
    cfg, tc, _ = config_from_params(training)
    assert cfg.keep_round_by == "safety" and tc.prior_kl_weight == 0.0
    with pytest.raises(ValueError, match="rl.keep_round_by"):
        config_from_params(training, keep_round_by="luck")
    kl = {**training, "rl": {**rl, "tc_grpo": {**rl["tc_grpo"], "prior_kl_weight": 0.1}}}
    with pytest.raises(ValueError, match="discriminator_prior_weight"):
        config_from_params(kl, discriminator_prior_weight=0.0)
    assert config_from_params(kl, discriminator_prior_weight=4.0)[1].prior_kl_weight == 0.1


def test_validation_clips_from_their_own_datasets_are_stratified_and_never_training_clips():
    clip = SimpleNamespace
    pool = [clip(clip_id=f"a{i}") for i in range(30)] + [clip(clip_id=f"b{i}") for i in range(10)]
    groups = [0] * 30 + [1] * 10
    cfg = SimpleNamespace(seed=0, validation_clips=8)
    train_clips = [clip(clip_id="t0"), clip(clip_id="t1")]
    val = validation_from(pool, cfg, groups, train_clips)
    assert len(val) == 8 and sum(c.clip_id.startswith("b") for c in val) == 2  # 8 x 10/40
    assert val == validation_from(pool, cfg, groups, train_clips)  # a function of the seed
    assert [c.clip_id for c in val] == [c.clip_id for c in pool if c in val]  # the pool's order
    assert len(validation_from(pool, SimpleNamespace(seed=0, validation_clips=100), groups)) == 40
    with pytest.raises(ValueError, match="also training clips"):
        validation_from(pool, cfg, groups, [clip(clip_id="a3")])


class _Logits(torch.nn.Module):
    def __init__(self, init):
        super().__init__()
        self.value = torch.nn.Parameter(torch.as_tensor(init, dtype=torch.float32))

    def discriminator_logits(self, candidates, inputs):
        return self.value


def _batch(n=6, m=5, prior=True):
    from rad2_planner.policy import SELECTION_PRIOR

    rng = np.random.default_rng(0)
    allowed = np.ones((n, m), bool)
    allowed[:, -1] = False  # a candidate the behaviour policy could not draw
    inputs = {SELECTION_PRIOR: (4.0 * rng.standard_normal((n, m))).astype(np.float32)} if prior else {}
    return DecisionBatch(candidates=np.zeros((n, m, 2, 2), np.float32), inputs=inputs,
                         selected=np.zeros(n, np.int64), old_log_prob=np.full(n, -1.0, np.float32),
                         allowed=allowed, advantage=np.zeros(n, np.float32), groups_total=1, groups_kept=1)


def test_the_prior_kl_pulls_the_ranking_towards_the_consensus_prior():
    cfg = TCGRPOConfig(minibatch_decisions=0, minibatches_per_update=1, prior_kl_weight=1.0,
                       entropy_target=0.0)  # no entropy term
    batch = _batch()
    flat = _Logits(np.full((6, 5), 0.7))  # the discriminator adds a constant: the prior's ranking itself
    _, stats = tc_grpo_loss(flat, batch, cfg, AdaptiveEntropy(cfg))
    assert stats["prior_kl"] == pytest.approx(0.0, abs=1e-6)
    model = _Logits(np.random.default_rng(1).standard_normal((6, 5)) * 3.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.2)
    kls = []
    for _ in range(100):
        loss, stats = tc_grpo_loss(model, batch, cfg, AdaptiveEntropy(cfg))
        kls.append(stats["prior_kl"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert kls[0] > 0.1 and kls[-1] < 0.05 * kls[0] and math.isfinite(kls[-1])
    off = TCGRPOConfig(minibatch_decisions=0, minibatches_per_update=1)
    assert "prior_kl" not in tc_grpo_loss(model, batch, off, AdaptiveEntropy(off))[1]
    with pytest.raises(ValueError, match="discriminator_prior_weight"):
        tc_grpo_loss(model, _batch(prior=False), cfg, AdaptiveEntropy(cfg))
