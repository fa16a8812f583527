"""TC-GRPO: the discriminator's reinforcement learning (RAD-2 §3.3.2, Eq. 15–18), top to bottom.

The policy is the discriminator's categorical distribution over one cycle's candidate set,
``π(m | o, C) = softmax(logit_m / T)`` (``rad2_planner.selection``; over the top-K_t candidates the
behaviour policy kept when R1Sim's entropy-guided truncation was on). One update:

1. **Groups → advantages.** G rollouts start from one initial state (``bev_warp_sim.rollout``); each
   gets its sequence-level reward ``r_i`` (``bev_warp_sim.rewards.REWARDS``). Advantages within the
   group (``advantage``):
   - ``grpo`` (RAD-2 Eq. 15): ``A_i = (r_i − mean r) / std r``;
   - ``vd_grpo`` (Plan-R1): ``A_i = (r_i − mean r) / scale`` with a fixed scale (no division by a
     tiny group spread);
   - ``mean_only`` (R1Sim): ``A_i = r_i − mean r``.
   **Clip filtering**: a group whose reward spread is below ``min_reward_std`` carries no preference
   and is dropped.
2. **Temporally consistent credit.** The advantage of rollout i goes to its decision points K_i only
   — the steps where a new trajectory started a latched interval — never to the steps that merely
   replayed it (Eq. 16).
3. **Clipped objective** per decision: ``L = min(ρ A, clip(ρ, 1 − ε, 1 + ε) A)`` with
   ``ρ = π(τ*) / π_old(τ*)``, ``π_old`` the behaviour policy's probability recorded at collection.
4. **Adaptive entropy** (Eq. 17): ``β = exp(λ) · 1[H̄ < H_target]``; ``λ`` moves only under a deficit
   (up while the mean entropy stays below target), so a healthy policy is not pushed flat.
5. **Objective** (Eq. 18): ``J = (1 / Σ|K_i|) Σ_i Σ_{t∈K_i} (L_{i,t} + β H_{i,t} − η KL_{i,t})``,
   maximised. ``KL_{i,t} = KL(π ‖ π_prior)`` is a trust region to the imitation ranking (not in RAD-2;
   ``prior_kl_weight`` η, 0 by default): ``π_prior = softmax(κ·prior / T)`` over the same candidates,
   the consensus prior the rollouts recorded with ``planner.discriminator_prior_weight`` κ > 0, whose
   argmax is the medoid rule's choice. The clipped ratio bounds one update's step from the behaviour
   policy; the KL bounds how far the whole run drifts from the ranking it started near.

Batches enter a FIFO buffer of ``buffer_batches``; every new batch triggers an update over the buffer:
one gradient step on the whole buffer (``minibatch_decisions: 0``), or ``minibatches_per_update`` steps on
random minibatches of ``minibatch_decisions`` decision points drawn from it. Minibatches are what make
the update affordable on a CPU: one step costs a forward and backward pass of the discriminator over
every candidate of every decision in it (about 20 ms per decision at M = 32 on two cores), and several
steps per batch are what the clipped ratio exists for (PPO's epochs; the ratio's reference stays the
behaviour policy's probability recorded at collection).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ADVANTAGES = ("grpo", "vd_grpo", "mean_only")


@dataclass(frozen=True)
class TCGRPOConfig:
    advantage: str = "grpo"
    # VD-GRPO's fixed divisor c (Plan-R1: 0.1). Adam makes the update nearly invariant to a constant
    # factor on the advantages, so c matters only against the entropy term; c = 1 is mean_only exactly.
    vd_scale: float = 0.1
    clip_eps: float = 0.2  # ε of Eq. 16
    min_reward_std: float = 1e-3  # clip filtering: groups with less reward spread are dropped
    temperature: float = 1.0  # T of the softmax policy (the behaviour policy's)
    entropy_target: float = 1.0  # H̄_target in nats
    entropy_lr: float = 0.01  # step of λ under deficit
    init_log_beta: float = -3.0  # λ at start
    buffer_batches: int = 8
    # rl.tc_grpo.minibatch_* of params/training.yaml, with no default here: the file is where they are set
    minibatch_decisions: int = field(kw_only=True)  # 0: every decision of the buffer in one step
    minibatches_per_update: int = field(kw_only=True)  # gradient steps per new batch (drawn from the buffer)
    prior_kl_weight: float = 0.0  # η of the KL to the consensus prior's distribution (needs κ > 0)

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage: unknown value {self.advantage!r} (choose from {ADVANTAGES})")
        for name in ("vd_scale", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps: must lie in (0, 1), got {self.clip_eps!r}")
        if self.buffer_batches < 1:
            raise ValueError(f"buffer_batches: must be >= 1, got {self.buffer_batches!r}")
        if self.minibatch_decisions < 0:
            raise ValueError(f"minibatch_decisions: must be >= 0 (0: the whole buffer), "
                             f"got {self.minibatch_decisions!r}")
        if self.minibatches_per_update < 1:
            raise ValueError(f"minibatches_per_update: must be >= 1, got {self.minibatches_per_update!r}")
        if not self.prior_kl_weight >= 0:
            raise ValueError(f"prior_kl_weight: must be >= 0, got {self.prior_kl_weight!r}")


# ----------------------------------------------------------------------------------------------------
# 1. advantages


def group_advantages(rewards: Sequence[float], cfg: TCGRPOConfig) -> np.ndarray:
    """Advantages of one group's rollouts (population std for Eq. 15)."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean()
    if cfg.advantage == "grpo":
        return centred / max(float(r.std()), 1e-12)
    if cfg.advantage == "vd_grpo":
        return centred / cfg.vd_scale
    return centred


def keeps_signal(rewards: Sequence[float], cfg: TCGRPOConfig) -> bool:
    """Clip filtering: a group whose rollouts all scored (almost) alike has nothing to teach."""
    return float(np.std(np.asarray(rewards, dtype=np.float64))) >= cfg.min_reward_std


# ----------------------------------------------------------------------------------------------------
# 2. decision points of a batch of rollouts


@dataclass
class DecisionBatch:
    """Every decision point of the kept groups, stacked: what one update needs."""

    candidates: np.ndarray  # [N, M, T, 2]
    inputs: dict[str, np.ndarray]  # batched discriminator inputs
    selected: np.ndarray  # [N]
    old_log_prob: np.ndarray  # [N] behaviour policy log π_old(selected)
    allowed: np.ndarray  # [N, M] candidates the behaviour policy could draw (top-K_t)
    advantage: np.ndarray  # [N] the decision's rollout advantage
    groups_total: int = 0
    groups_kept: int = 0

    def __len__(self) -> int:
        return int(len(self.selected))


def decision_batch(rollouts: Sequence[Any], reward: str, cfg: TCGRPOConfig) -> DecisionBatch | None:
    """Advantages per group, clip filtering, and the decision points of the kept rollouts
    (``rollouts`` from ``bev_warp_sim.rollout.run_rollouts`` in sample mode with recorded inputs)."""
    groups: dict[int, list[Any]] = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r)
    rows: list[tuple[Any, float]] = []
    kept = 0
    for members in groups.values():
        rewards = [m.rewards[reward] for m in members]
        if len(members) < 2 or not keeps_signal(rewards, cfg):
            continue
        kept += 1
        for m, a in zip(members, group_advantages(rewards, cfg)):
            rows += [(d, float(a)) for d in m.trace.decisions]
    if not rows:
        return None
    for d, _ in rows:
        if d.discriminator_inputs is None or not np.isfinite(d.log_prob):
            raise ValueError("decision points need recorded discriminator inputs and a behaviour log-prob: "
                             "collect with selection='sample' and record_discriminator_inputs=True")
    keys = rows[0][0].discriminator_inputs.keys()
    return DecisionBatch(
        candidates=np.stack([d.candidates for d, _ in rows]).astype(np.float32),
        inputs={k: np.stack([d.discriminator_inputs[k] for d, _ in rows]) for k in keys},
        selected=np.array([d.selected for d, _ in rows], dtype=np.int64),
        old_log_prob=np.array([d.log_prob for d, _ in rows], dtype=np.float32),
        allowed=np.stack([d.probs > 0 if d.probs is not None else np.ones(len(d.candidates), bool)
                          for d, _ in rows]),
        advantage=np.array([a for _, a in rows], dtype=np.float32),
        groups_total=len(groups), groups_kept=kept,
    )


def concat(batches: Sequence[DecisionBatch]) -> DecisionBatch:
    return DecisionBatch(
        candidates=np.concatenate([b.candidates for b in batches]),
        inputs={k: np.concatenate([b.inputs[k] for b in batches]) for k in batches[0].inputs},
        selected=np.concatenate([b.selected for b in batches]),
        old_log_prob=np.concatenate([b.old_log_prob for b in batches]),
        allowed=np.concatenate([b.allowed for b in batches]),
        advantage=np.concatenate([b.advantage for b in batches]),
        groups_total=sum(b.groups_total for b in batches), groups_kept=sum(b.groups_kept for b in batches),
    )


def take(batch: DecisionBatch, rows: np.ndarray) -> DecisionBatch:
    """The decision points ``rows`` of a batch (a minibatch; group counts are the batch's)."""
    return DecisionBatch(
        candidates=batch.candidates[rows], inputs={k: v[rows] for k, v in batch.inputs.items()},
        selected=batch.selected[rows], old_log_prob=batch.old_log_prob[rows], allowed=batch.allowed[rows],
        advantage=batch.advantage[rows], groups_total=batch.groups_total, groups_kept=batch.groups_kept)


# ----------------------------------------------------------------------------------------------------
# 3.–5. objective


def policy_log_probs(logits: torch.Tensor, allowed: torch.Tensor, temperature: float) -> torch.Tensor:
    """log π over the candidates the behaviour policy could draw (−inf elsewhere)."""
    z = (logits / temperature).masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def selection_logits(model, batch: DecisionBatch) -> torch.Tensor:
    """The logits the behaviour policy drew from: the discriminator's, plus the recorded κ·prior when the
    rollouts ran with ``planner.discriminator_prior_weight`` > 0 (a constant: no gradient flows to it)."""
    from rad2_planner.policy import SELECTION_PRIOR

    inputs = {k: v for k, v in batch.inputs.items() if k != SELECTION_PRIOR}
    logits = model.discriminator_logits(batch.candidates, inputs)
    if SELECTION_PRIOR in batch.inputs:
        logits = logits + torch.as_tensor(batch.inputs[SELECTION_PRIOR], device=logits.device)
    return logits


def clipped_objective(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """Eq. 16 per decision: ``min(ρA, clip(ρ, 1−ε, 1+ε)A)``."""
    ratio = torch.exp(new_log_prob - old_log_prob)
    return torch.minimum(ratio * advantage, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * advantage)


class AdaptiveEntropy:
    """Eq. 17: ``β = exp(λ)·1[H̄ < H_target]``; λ rises only while the entropy is in deficit."""

    def __init__(self, cfg: TCGRPOConfig):
        self.cfg = cfg
        self.log_beta = float(cfg.init_log_beta)

    def beta(self, mean_entropy: float) -> float:
        return float(np.exp(self.log_beta)) if mean_entropy < self.cfg.entropy_target else 0.0

    def step(self, mean_entropy: float) -> None:
        """Gradient step on ``J(λ) = −λ (H̄ − H_target)`` taken only under deficit."""
        if mean_entropy < self.cfg.entropy_target:
            self.log_beta += self.cfg.entropy_lr * (self.cfg.entropy_target - mean_entropy)


def tc_grpo_loss(model, batch: DecisionBatch, cfg: TCGRPOConfig, entropy: AdaptiveEntropy,
                 device: str | torch.device = "cpu") -> tuple[torch.Tensor, dict[str, float]]:
    """``−J`` of Eq. 18 on a batch (to minimise) and the quantities worth logging."""
    logits = selection_logits(model, batch)
    allowed = torch.as_tensor(batch.allowed, device=device)
    logp = policy_log_probs(logits, allowed, cfg.temperature)
    idx = torch.as_tensor(batch.selected, device=device)
    new = logp.gather(1, idx[:, None])[:, 0]
    old = torch.as_tensor(batch.old_log_prob, device=device)
    adv = torch.as_tensor(batch.advantage, device=device)
    surrogate = clipped_objective(new, old, adv, cfg.clip_eps)
    p = logp.exp()
    ent = -(p * logp.masked_fill(~allowed, 0.0)).sum(-1)
    beta = entropy.beta(float(ent.mean().detach()))
    per_decision = surrogate + beta * ent
    kl = None
    if cfg.prior_kl_weight > 0:
        from rad2_planner.policy import SELECTION_PRIOR

        if SELECTION_PRIOR not in batch.inputs:
            raise ValueError("rl.tc_grpo.prior_kl_weight > 0 needs the consensus prior the rollouts record "
                             "with rl.discriminator_prior_weight > 0")
        prior = torch.as_tensor(batch.inputs[SELECTION_PRIOR], device=logits.device)
        prior_logp = policy_log_probs(prior, allowed, cfg.temperature)
        kl = (p * (logp - prior_logp).masked_fill(~allowed, 0.0)).sum(-1)
        per_decision = per_decision - cfg.prior_kl_weight * kl
    objective = per_decision.mean()  # the mean is 1/Σ|K_i| Σ over every decision point
    ratio = torch.exp(new - old).detach()
    stats = {
        "objective": float(objective.detach()), "entropy": float(ent.mean().detach()), "beta": beta,
        "log_beta": entropy.log_beta, "ratio_mean": float(ratio.mean()),
        "clip_fraction": float(((ratio - 1.0).abs() > cfg.clip_eps).float().mean()),
        "advantage_mean": float(adv.mean()), "advantage_std": float(adv.std()) if len(adv) > 1 else 0.0,
        "decisions": float(len(batch)),
        "clip_filter_rate": 1.0 - batch.groups_kept / max(batch.groups_total, 1),
    }
    if kl is not None:
        stats["prior_kl"] = float(kl.mean().detach())
    return -objective, stats


class Trainer:
    """FIFO buffer of decision batches and one discriminator update per new batch."""

    def __init__(self, model, cfg: TCGRPOConfig, lr: float = 1e-4, device: str | torch.device = "cpu"):
        self.model, self.cfg, self.device = model, cfg, device
        self.optimizer = torch.optim.AdamW(model.discriminator.parameters(), lr=lr)
        self.entropy = AdaptiveEntropy(cfg)
        self.buffer: deque[DecisionBatch] = deque(maxlen=cfg.buffer_batches)

    def add_and_update(self, batch: DecisionBatch | None,
                       rng: np.random.Generator | None = None) -> dict[str, float] | None:
        """Push a batch (None: all groups were filtered) and update on the buffer: one step on all of
        it, or ``minibatches_per_update`` steps on minibatches drawn with ``rng`` (a resumable run
        passes its own generator so that a resumed run draws the same minibatches)."""
        if batch is not None:
            self.buffer.append(batch)
        if not self.buffer:
            return None
        cfg = self.cfg
        data = concat(list(self.buffer))
        if cfg.minibatch_decisions == 0 or cfg.minibatch_decisions >= len(data):
            minibatches = [data]
        else:
            rng = rng if rng is not None else np.random.default_rng(0)
            minibatches = [take(data, np.sort(rng.choice(len(data), size=cfg.minibatch_decisions,
                                                         replace=False)))
                           for _ in range(cfg.minibatches_per_update)]
        self.model.discriminator.train()
        steps = []
        for mb in minibatches:
            loss, stats = tc_grpo_loss(self.model, mb, cfg, self.entropy, self.device)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            steps.append(stats)
        self.model.discriminator.eval()
        stats = {k: float(np.mean([s[k] for s in steps])) for k in steps[0]}
        stats.update(decisions=float(len(data)), gradient_steps=float(len(steps)),
                     beta=steps[-1]["beta"], log_beta=self.entropy.log_beta)
        self.entropy.step(stats["entropy"])
        return stats
