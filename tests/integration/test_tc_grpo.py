"""TC-GRPO (RAD-2 Eq. 15-18): advantages on hand-computed groups, the clipped objective's gradient sign
and clipping, the entropy temperature moving only under deficit, clip filtering and credit to decision
points only, and a short training run that raises the discriminator's ranking of the better candidate."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bev_warp_sim.trace import DecisionPoint
from rad2_planner.runtime.onnx_export import example_inputs
from rad2_training.tc_grpo import (
    AdaptiveEntropy,
    TCGRPOConfig,
    Trainer,
    clipped_objective,
    decision_batch,
    group_advantages,
    keeps_signal,
    selection_logits,
    tc_grpo_loss,
)
from tiny_models import randomised_model, tiny_config


def _cfg(**kw) -> TCGRPOConfig:
    """A TC-GRPO config for these tests: one gradient step on the whole buffer unless they say otherwise."""
    return TCGRPOConfig(**{"minibatch_decisions": 0, "minibatches_per_update": 1, **kw})


def test_advantages_on_a_hand_computed_group():
    r = [1.0, 2.0, 3.0, 6.0]  # mean 3, population std sqrt(14/4)
    std = np.sqrt(14 / 4)
    np.testing.assert_allclose(group_advantages(r, _cfg()), [-2 / std, -1 / std, 0.0, 3 / std])
    np.testing.assert_allclose(group_advantages(r, _cfg(advantage="vd_grpo", vd_scale=2.0)),
                               [-1.0, -0.5, 0.0, 1.5])
    np.testing.assert_allclose(group_advantages(r, _cfg(advantage="mean_only")), [-2, -1, 0, 3])
    assert keeps_signal(r, _cfg()) and not keeps_signal([0.5] * 4, _cfg())
    with pytest.raises(ValueError, match="advantage"):
        _cfg(advantage="ppo")


def _grad(ratio: float, advantage: float, eps: float = 0.2) -> tuple[float, float]:
    new = torch.tensor([np.log(ratio)], requires_grad=True)
    val = clipped_objective(new, torch.zeros(1), torch.tensor([advantage]), eps)
    val.sum().backward()
    return float(val.detach()), float(new.grad)


def test_clipped_objective_gradient_sign_and_clipping():
    v, g = _grad(1.0, 2.0)
    assert v == pytest.approx(2.0) and g > 0  # a good action's probability is pushed up
    v, g = _grad(1.0, -2.0)
    assert v == pytest.approx(-2.0) and g < 0  # a bad one's down
    v, g = _grad(1.5, 2.0)
    assert v == pytest.approx(1.2 * 2.0) and g == 0.0  # already 20 % more likely: no further push
    v, g = _grad(0.5, -2.0)
    assert v == pytest.approx(0.8 * -2.0) and g == 0.0  # already 20 % less likely
    v, g = _grad(0.5, 2.0)
    assert v == pytest.approx(1.0) and g > 0  # the pessimistic bound keeps correcting a mistake


def test_entropy_temperature_moves_only_under_deficit():
    ctl = AdaptiveEntropy(_cfg(entropy_target=1.0, entropy_lr=0.5, init_log_beta=-2.0))
    assert ctl.beta(1.5) == 0.0
    ctl.step(1.5)
    assert ctl.log_beta == -2.0  # no deficit: λ untouched, no regularisation
    assert ctl.beta(0.4) == pytest.approx(np.exp(-2.0))
    ctl.step(0.4)
    assert ctl.log_beta == pytest.approx(-2.0 + 0.5 * 0.6)  # deficit: λ rises


def _toy_scene(m: int):
    cfg = tiny_config()
    ex = example_inputs(cfg, batch=1, m=m, seed=3)
    inputs = {k: ex[k][0] for k in ("map_polylines", "map_mask", "agents", "agents_mask", "ego_state")}
    inputs["bev_tokens"] = np.random.default_rng(0).standard_normal((16, cfg.d_model)).astype(np.float32)
    t = (np.arange(cfg.plan_points) + 1.0)[:, None]
    # clearly different plans (slow, fast, left, right), so the network can tell them apart
    shapes = ((4.0, 0.0), (12.0, 0.0), (6.0, 1.5), (6.0, -1.5))[:m]
    cands = np.stack([np.hstack([t * v, t * lat]) for v, lat in shapes]).astype(np.float32)
    return cands, inputs


def _group(model, cands, inputs, rewards, group=0, decisions_per_rollout=1):
    """G rollouts of one initial state; member i executed candidate i at each of its decisions."""
    with torch.no_grad():
        logits = model.discriminator_logits(cands[None], {k: v[None] for k, v in inputs.items()})[0].numpy()
    logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    out = []
    for i, r in enumerate(rewards):
        dps = tuple(DecisionPoint(step=8 * k, ego_state=np.zeros(5), accel=0.0, reason="start", selected=i,
                                  candidates=cands, logits=logits, probs=np.exp(logp),
                                  log_prob=float(logp[i]), entropy=0.0, discriminator_inputs=inputs)
                    for k in range(decisions_per_rollout))
        out.append(SimpleNamespace(group=group, member=i, rewards={"r": r},
                                   trace=SimpleNamespace(decisions=dps)))
    return out


def test_decision_batch_credits_decision_points_and_filters_flat_groups():
    model = randomised_model(tiny_config())
    cands, inputs = _toy_scene(4)
    rollouts = _group(model, cands, inputs, [1.0, 0.0, 0.0, 1.0], group=0, decisions_per_rollout=3)
    rollouts += _group(model, cands, inputs, [0.7] * 4, group=1)  # no preference: filtered
    batch = decision_batch(rollouts, "r", _cfg())
    assert len(batch) == 12 and batch.groups_total == 2 and batch.groups_kept == 1
    np.testing.assert_allclose(batch.advantage, np.repeat([1.0, -1.0, -1.0, 1.0], 3))
    assert decision_batch(_group(model, cands, inputs, [0.7] * 4), "r", _cfg()) is None


def test_training_raises_the_ranking_of_the_better_candidate():
    torch.manual_seed(0)
    model = randomised_model(tiny_config(), seed=1)
    cands, inputs = _toy_scene(4)
    batched = (cands[None], {k: v[None] for k, v in inputs.items()})

    def margin() -> float:
        with torch.no_grad():
            z = model.discriminator_logits(*batched)[0]
        return float(z[0] - z[1:].max())

    before = margin()
    trainer = Trainer(model, _cfg(buffer_batches=2, entropy_target=0.0), lr=1e-3)
    for _ in range(25):  # fresh on-policy groups: candidate 0 is the one that pays off
        batch = decision_batch(_group(model, cands, inputs, [1.0, 0.0, 0.0, 0.0]), "r", trainer.cfg)
        stats = trainer.add_and_update(batch)
    assert margin() > before + 2.0 and margin() > 0  # candidate 0 is now ranked first, by a margin
    assert stats["beta"] == 0.0 and np.isfinite(stats["objective"])


def test_minibatch_updates_take_the_configured_steps_and_replay_with_the_same_generator():
    """minibatch_decisions > 0: minibatches_per_update gradient steps on minibatches drawn from the
    buffer; a resumed run passing the same generator state draws the same minibatches (same weights)."""
    cands, inputs = _toy_scene(4)
    cfg = _cfg(buffer_batches=2, entropy_target=0.0, minibatch_decisions=5, minibatches_per_update=3)
    finals = []
    for _ in range(2):
        model = randomised_model(tiny_config(), seed=1)
        trainer = Trainer(model, cfg, lr=1e-3)
        rng = np.random.default_rng(7)
        batch = decision_batch(_group(model, cands, inputs, [1.0, 0.0, 0.0, 0.0], decisions_per_rollout=3),
                               "r", cfg)
        stats = trainer.add_and_update(batch, rng=rng)
        assert stats["gradient_steps"] == 3.0 and stats["decisions"] == 12.0
        finals.append(torch.cat([p.detach().flatten() for p in model.discriminator.parameters()]))
    assert torch.equal(finals[0], finals[1])
    model = randomised_model(tiny_config(), seed=1)
    before = torch.cat([p.detach().flatten() for p in model.discriminator.parameters()])
    assert not torch.equal(before, finals[0])  # the steps moved the weights
    whole = Trainer(model, _cfg(buffer_batches=2, entropy_target=0.0), lr=1e-3)
    assert whole.add_and_update(batch)["gradient_steps"] == 1.0  # 0: the whole buffer, one step
    with pytest.raises(ValueError, match="minibatch_decisions"):
        _cfg(minibatch_decisions=-1)
    with pytest.raises(ValueError, match="minibatches_per_update"):
        _cfg(minibatches_per_update=0)


def test_the_update_recomputes_the_behaviour_policy_with_its_recorded_prior():
    """With planner.discriminator_prior_weight > 0 the rollouts draw from softmax(l + κ·prior) and record
    κ·prior beside the discriminator inputs: the update adds it back, so before any step the importance
    ratio is 1 (without it, the ratios would be off by the prior)."""
    from rad2_planner.policy import SELECTION_PRIOR

    model = randomised_model(tiny_config(), seed=2)
    cands, inputs = _toy_scene(4)
    prior = np.array([0.0, -2.0, -4.0, -1.0], np.float32)
    with torch.no_grad():
        raw = model.discriminator_logits(cands[None], {k: v[None] for k, v in inputs.items()})[0].numpy()
    z = raw + prior
    logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    recorded = {**inputs, SELECTION_PRIOR: prior}
    rollouts = [SimpleNamespace(group=0, member=i, rewards={"r": r}, trace=SimpleNamespace(decisions=(
        DecisionPoint(step=0, ego_state=np.zeros(5), accel=0.0, reason="start", selected=i, candidates=cands,
                      logits=z, probs=np.exp(logp), log_prob=float(logp[i]), entropy=0.0,
                      discriminator_inputs=recorded),)))
        for i, r in enumerate([1.0, 0.0, 0.5, 0.0])]
    batch = decision_batch(rollouts, "r", _cfg())
    with torch.no_grad():
        np.testing.assert_allclose(selection_logits(model, batch).numpy(), np.tile(z, (4, 1)), atol=1e-5)
        _, stats = tc_grpo_loss(model, batch, _cfg(), AdaptiveEntropy(_cfg()))
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_fraction"] == 0.0
    batch.inputs.pop(SELECTION_PRIOR)  # the same decisions judged without the prior: not the behaviour policy
    with torch.no_grad():
        _, stats = tc_grpo_loss(model, batch, _cfg(), AdaptiveEntropy(_cfg()))
    assert stats["clip_fraction"] > 0.0
