"""Closed-loop RL of RAD-2, top to bottom: collect grouped rollouts, update the discriminator by
TC-GRPO on every new batch, fine-tune the generator by On-policy Generator Optimization once per
buffer circulation, validate, checkpoint. The algorithms are in :mod:`rad2_training.tc_grpo` and
:mod:`rad2_training.ogo`; this module is the loop and its state.

One iteration:
1. draw ``clips_per_iteration`` training clips (the run's NumPy generator) and roll each out G times
   from its start with the current policy: M candidates from the generator, the executed one sampled
   from the discriminator's distribution (softmax of logits / T, optionally R1Sim's entropy-guided
   top-K_t), latched for H_reuse steps (``bev_warp_sim.rollout``; in this process or Ray workers);
2. rewards (``rl.reward`` of params/training.yaml, any of ``bev_warp_sim.rewards.REWARDS``) →
   group advantages → clip filtering → the decision points of the kept groups (one batch);
3. TC-GRPO: the batch enters the FIFO buffer and the discriminator is updated on the buffer (one step
   on all of it, or ``minibatches_per_update`` steps on minibatches drawn with the run's generator);
4. OGO: every ``ogo_every`` iterations (one circulation of the buffer: the 8:1 schedule) the
   re-timed segments collected since the last generator update fine-tune the generator;
5. every ``validate_every`` iterations: deterministic (argmax) closed-loop evaluation on held-out
   clips (at-fault collisions, nuPlan-style score, collision rate, progress); the round kept in
   ``best/`` is chosen on them by :func:`better_round` (``rl.keep_round_by``); every
   ``checkpoint_every`` iterations and at the end: a checkpoint from which :func:`train` resumes
   exactly (weights, both optimisers, the buffer, λ of the entropy term, every random generator, the
   pending OGO targets and the iteration).

Which round is kept (``rl.keep_round_by: safety``): the fewest at-fault collisions on the validation
clips, then the highest mean nuPlan-style score, then the lowest collision rate; a later round replaces
the kept one only when it is strictly better, so ties keep the earlier round (the starting planner
first). ``reward`` keeps the highest mean validation reward, as the shipped runs did: a reward that
trades safety for progress then picks the round that made the trade. Point ``rl.validation_data`` at
clips from locations the training sets do not cover, so that the kept round is the one that
generalises, not the one that fits the training roads.

Rollouts run the PyTorch backend on the very model being trained, so an update is live at the next
collection with no re-export; Ray workers receive the weights after every update.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file as load_arrays
from safetensors.numpy import save_file as save_arrays

from rad2_training.ogo import (
    OGOConfig,
    OGOTarget,
    generator_batch,
    generator_step,
    imitation_batch,
    imitation_samples,
    ogo_targets,
    reject_new_collisions,
)
from rad2_training.ogo import minibatch as ogo_minibatch
from rad2_training.tc_grpo import DecisionBatch, TCGRPOConfig, Trainer, decision_batch

DISCRIMINATOR_INITS = ("generator", "random")
KEEP_ROUND_BY = ("safety", "reward")


@dataclass(frozen=True)
class RLConfig:
    """``rl:`` of params/training.yaml (see its schema for units and ranges)."""

    seed: int = 0
    iterations: int = 64
    clips_per_iteration: int = 8
    group_size: int = 4
    batch_size: int = 16
    h_reuse: int = 8
    window_steps: int = 0
    num_candidates: int = 32
    reward: str = "safe_score"
    train_discriminator: bool = True
    train_generator: bool = True
    discriminator_init: str = "generator"
    discriminator_candidates: str = "all"  # planner.discriminator_candidates of the rollouts: all | safe
    discriminator_prior_weight: float = 0.0  # planner.discriminator_prior_weight of the rollouts (κ)
    discriminator_lr: float = 1e-4
    generator_lr: float = 2e-5
    ogo_every: int = 8
    ogo_steps: int = 20
    ogo_batch: int = 32
    ogo_noise_draws: int = 4
    ogo_imitation_weight: float = 0.0  # logged-sample imitation loss mixed into each OGO step (Table 4 row 3)
    validate_every: int = 8
    validation_clips: int = 16
    # dataset directories the validation clips are drawn from (empty: held out of the training sets)
    validation_data: Sequence[str] = ()
    keep_round_by: str = "safety"  # which validated round best/ keeps: safety | reward (better_round)
    checkpoint_every: int = 4

    def __post_init__(self) -> None:
        if self.keep_round_by not in KEEP_ROUND_BY:
            raise ValueError(f"rl.keep_round_by: unknown value {self.keep_round_by!r} "
                             f"(choose from {KEEP_ROUND_BY})")
        if self.discriminator_init not in DISCRIMINATOR_INITS:
            raise ValueError(f"rl.discriminator_init: unknown value {self.discriminator_init!r} "
                             f"(choose from {DISCRIMINATOR_INITS})")
        from rad2_planner.policy import DISCRIMINATOR_CANDIDATES

        if self.discriminator_candidates not in DISCRIMINATOR_CANDIDATES:
            raise ValueError(f"rl.discriminator_candidates: unknown value {self.discriminator_candidates!r} "
                             f"(choose from {DISCRIMINATOR_CANDIDATES})")
        from rad2_planner.candidates import MAX_PRIOR_WEIGHT

        if not 0.0 <= self.discriminator_prior_weight <= MAX_PRIOR_WEIGHT:
            raise ValueError(f"rl.discriminator_prior_weight: must be in [0, {MAX_PRIOR_WEIGHT:g}] "
                             f"(0: the logits alone), got {self.discriminator_prior_weight}")
        if self.group_size < 2:
            raise ValueError(f"rl.group_size: GRPO needs groups of >= 2 rollouts, got {self.group_size}")
        if not self.ogo_imitation_weight >= 0.0:
            raise ValueError(
                f"rl.ogo_imitation_weight: must be >= 0 (0: OGO alone), got {self.ogo_imitation_weight}")
        if self.window_steps < 0:
            raise ValueError(f"rl.window_steps: must be >= 0 (0: every rollout runs to its clip's end), "
                             f"got {self.window_steps}")
        for name in ("iterations", "clips_per_iteration", "batch_size", "h_reuse", "num_candidates",
                     "ogo_every", "ogo_steps", "ogo_batch", "ogo_noise_draws", "validate_every",
                     "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name}: must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_params(cls, rl: dict[str, Any], **overrides: Any) -> RLConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(rl) - names - {"tc_grpo", "ogo"}
        if unknown:
            raise ValueError(f"rl: unknown keys {sorted(unknown)}")
        return cls(**{**{k: v for k, v in rl.items() if k in names}, **overrides})


@dataclass
class RunState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    iteration: int = 0
    updates: int = 0
    generator_updates: int = 0
    env_steps: int = 0
    seconds: float = 0.0
    log_beta: float = 0.0
    rng: dict[str, Any] | None = None  # numpy bit generator state
    history: list[dict[str, float]] | None = None
    # the kept round's validation (better_round), its reward and its round: ``best/`` holds that
    # round's planner
    best_val_reward: float | None = None
    best_iteration: int = 0
    best_validation: dict[str, float] | None = None
    # the starting planner's validation (round 0), taken before the first round of a fresh run
    start_validation: dict[str, float] | None = None


# ----------------------------------------------------------------------------------------------------
# the run


def check_simulator(cfg: RLConfig, reactive_agents: bool) -> None:
    """Raise a ValueError for a run the simulator cannot serve: On-policy Generator Optimization renders
    each target's observation again from the log (``Simulator.observation_at``), and a decision point does
    not hold the poses of reactive agents, so the generator trains with log-replayed agents only."""
    if cfg.train_generator and reactive_agents:
        raise ValueError("rl.train_generator=true with sim.reactive_agents=true: OGO renders each target's "
                         "observation again from the log, which does not hold reactive agents' poses; train "
                         "the discriminator alone (rl.train_generator=false) or use log-replayed agents")


class RLRun:
    """The model, the optimisers, the buffer, the collector and the run state of one training run."""

    def __init__(self, model, cfg: RLConfig, tc_cfg: TCGRPOConfig, ogo_cfg: OGOConfig,
                 sim, train_clips: Sequence[Any], val_clips: Sequence[Any] = (), *,
                 params: dict[str, Any], pool=None):
        """``params``: every file of params/ as loaded, merged (the planner's settings of the run)."""
        from bev_warp_sim.rollout import BatchedPolicy
        from rad2_planner.diffusion import NoiseSchedule
        from rad2_planner.policy import Rad2Policy
        from rad2_planner.selection import CandidateDistribution

        if not train_clips:
            raise ValueError("train_clips: no clips to train on")
        check_simulator(cfg, bool(getattr(sim, "reactive", False)))
        self.model, self.cfg, self.tc_cfg, self.ogo_cfg, self.sim = model, cfg, tc_cfg, ogo_cfg, sim
        self.train_clips, self.val_clips = list(train_clips), list(val_clips)
        self.clips_by_id = {c.clip_id: c for c in self.train_clips}
        params = {**params, "runtime": {**params["runtime"], "fused_sampler": True},
                  "planner": {**params["planner"], "discriminator_candidates": cfg.discriminator_candidates,
                              "discriminator_prior_weight": cfg.discriminator_prior_weight}}
        torch.manual_seed(cfg.seed)
        if cfg.discriminator_init == "random":
            from rad2_planner.networks.discriminator import Discriminator

            model.discriminator = Discriminator(model.cfg)
        self.policy = Rad2Policy(model, params, backend="pytorch", num_candidates=cfg.num_candidates,
                                 always_score=True)
        dist = CandidateDistribution.from_params(
            {**params["planner"], "selection_temperature": tc_cfg.temperature})
        self.explore = BatchedPolicy(self.policy, selection="sample", record_discriminator_inputs=True,
                                     candidate_distribution=dist)
        self.deploy = BatchedPolicy(self.policy, selection="deterministic")
        self.pool = pool
        self.trainer = Trainer(model, tc_cfg, lr=cfg.discriminator_lr)
        generator_params = list(model.denoiser.parameters())
        if ogo_cfg.update_scene_encoder:
            generator_params = list(model.encoder.parameters()) + generator_params
        self.gen_optimizer = torch.optim.AdamW(generator_params, lr=cfg.generator_lr)
        self.schedule = NoiseSchedule(model.cfg.num_train_steps, params["diffusion"]["schedule"])
        self.torch_gen = torch.Generator().manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.pending_targets: list[OGOTarget] = []
        self.state = RunState(log_beta=self.trainer.entropy.log_beta, history=[])

    # -- 1. collection -------------------------------------------------------------------------------
    def collect(self, clips: Sequence[Any], seed: int, progress: Callable[[int], None] | None = None,
                start_steps: int | Sequence[int] = 0):
        from bev_warp_sim.rollout import run_rollouts

        kwargs = dict(group_size=self.cfg.group_size, start_steps=start_steps, batch_size=self.cfg.batch_size,
                      seed=seed, h_reuse=self.cfg.h_reuse, max_steps=self.cfg.window_steps or None,
                      rewards=[self.cfg.reward], progress=progress)
        if self.pool is not None:
            return self.pool.run(clips, **kwargs)
        self.model.eval()
        return run_rollouts(self.sim, self.explore, clips, **kwargs)

    # -- one iteration -------------------------------------------------------------------------------
    def iteration(self, progress: Callable[[int], None] | None = None) -> dict[str, float]:
        cfg, it = self.cfg, self.state.iteration
        t0 = time.perf_counter()
        n = min(cfg.clips_per_iteration, len(self.train_clips))
        pick = self.rng.choice(len(self.train_clips), size=n, replace=False)
        clips = [self.train_clips[i] for i in sorted(pick)]
        rollouts, stats = self.collect(clips, seed=cfg.seed * 1_000_003 + it, progress=progress,
                                       start_steps=self.window_starts(clips))
        rewards = np.array([r.rewards[cfg.reward] for r in rollouts])
        log: dict[str, float] = {
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "collision_rate": float(np.mean([r.result.collided for r in rollouts])),
            "env_steps": float(stats.env_steps), "decisions": float(stats.decisions),
        }
        # 2.-3. TC-GRPO on the discriminator
        if cfg.train_discriminator:
            batch = decision_batch(rollouts, cfg.reward, self.tc_cfg)
            upd = self.trainer.add_and_update(batch, rng=self.rng)
            if batch is None:
                log["clip_filter_rate"] = 1.0
            if upd is not None:
                self.state.updates += 1
                log.update(upd)
                self.model.discriminator_trained = True
        # 4. OGO targets now, generator update once per buffer circulation
        if cfg.train_generator:
            targets = ogo_targets(rollouts, self.ogo_cfg, self.model.cfg.plan_points, self.model.cfg.plan_dt)
            if self.ogo_cfg.reject_new_collisions:
                targets, rejected = reject_new_collisions(targets, self.clips_by_id, self.model.cfg.plan_dt)
                log["ogo_rejected"] = float(rejected)
            self.pending_targets += targets
            if (it + 1) % cfg.ogo_every == 0 and self.pending_targets:
                log.update(self.generator_update())
        if self.pool is not None and (cfg.train_discriminator or cfg.train_generator):
            self.pool.set_weights(self.model.state_dict(), self.model.discriminator_trained)
        self.state.iteration += 1
        self.state.env_steps += stats.env_steps
        self.state.log_beta = self.trainer.entropy.log_beta
        log["iteration_s"] = time.perf_counter() - t0
        self.state.seconds += log["iteration_s"]
        self.state.history.append({"iteration": it, **log})
        return log

    def window_starts(self, clips: Sequence[Any]) -> list[int]:
        """Where each group starts: the clip's first step, or with ``window_steps`` a step drawn
        uniformly among those that leave a whole window (the logged state there is the group's common
        initial state). A window holds few decisions, so each shares its rollout's advantage with fewer
        others: the credit of a decision is less diluted than over a whole clip."""
        if self.cfg.window_steps == 0:
            return [0] * len(clips)
        return [int(self.rng.integers(0, max(c.num_steps - 1 - self.cfg.window_steps, 0) + 1)) for c in clips]

    def generator_update(self) -> dict[str, float]:
        """Eq. 19 on the pending targets: ``ogo_steps`` minibatches, then the targets are consumed; with
        ``ogo_imitation_weight`` > 0 each minibatch also imitates as many logged training samples."""
        cfg, mcfg = self.cfg, self.model.cfg
        targets, self.pending_targets = self.pending_targets, []
        losses = []
        for _ in range(cfg.ogo_steps):
            idx = ogo_minibatch(targets, cfg.ogo_batch, self.rng, self.ogo_cfg.balance_kinds)
            batch = generator_batch(self.sim, self.clips_by_id, [targets[i] for i in idx], mcfg)
            logged = None
            if cfg.ogo_imitation_weight > 0:
                samples = imitation_samples(self.train_clips, self.rng, len(idx), mcfg.plan_dt,
                                            mcfg.plan_points)
                logged = imitation_batch(self.sim, self.train_clips, samples, mcfg)
            losses.append(generator_step(self.model, self.gen_optimizer, batch, self.schedule,
                                         cfg.ogo_noise_draws, self.torch_gen, imitation_batch=logged,
                                         imitation_weight=cfg.ogo_imitation_weight,
                                         update_scene_encoder=self.ogo_cfg.update_scene_encoder))
        self.state.generator_updates += 1
        kinds = [t.kind for t in targets]
        return {"ogo_loss": float(np.mean(losses)), "ogo_targets": float(len(targets)),
                "ogo_decelerate_share": kinds.count("decelerate") / len(kinds)}

    # -- 5. validation -------------------------------------------------------------------------------
    def validate(self, seed: int = 0) -> dict[str, float]:
        """Deterministic deployment selection (argmax of the discriminator) on the held-out clips."""
        from bev_warp_sim.rollout import run_rollouts

        if not self.val_clips:
            return {}
        self.model.eval()
        rollouts, _ = run_rollouts(self.sim, self.deploy, self.val_clips, group_size=1,
                                   batch_size=self.cfg.batch_size, seed=seed, rewards=[self.cfg.reward])
        results = [r.result for r in rollouts]
        scores = np.array([r.score for r in results], dtype=float)
        return {
            "val_clips": float(len(results)),
            "val_at_fault_collisions": float(sum(r.at_fault for r in results)),
            "val_collision_rate": float(np.mean([r.collided for r in results])),
            "val_at_fault_collision_rate": float(np.mean([r.at_fault for r in results])),
            "val_score": float(np.mean(scores)) if np.isfinite(scores).all() else math.nan,
            "val_progress_ratio": float(np.mean([r.rho for r in results])),
            "val_reward": float(np.mean([r.rewards[self.cfg.reward] for r in rollouts])),
        }

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write the run to ``directory`` atomically (a new folder renamed over the old one)."""
        final = Path(directory)
        tmp = _fresh_tmp(final)
        self.model.training_info = {**self.model.training_info, "rl": {
            "config": asdict(self.cfg), "tc_grpo": asdict(self.tc_cfg), "ogo": asdict(self.ogo_cfg),
            "iteration": self.state.iteration, "updates": self.state.updates,
            "generator_updates": self.state.generator_updates, "env_steps": self.state.env_steps}}
        self.model.save(tmp / "model")
        state = {
            **_optimizer_arrays("disc_opt", self.trainer.optimizer),
            **_optimizer_arrays("gen_opt", self.gen_optimizer),
            **_buffer_arrays(self.trainer.buffer),
            **_target_arrays(self.pending_targets),
            "torch_rng": torch.get_rng_state().numpy(),
            "torch_gen": self.torch_gen.get_state().numpy(),
        }
        save_arrays(state, str(tmp / "state.safetensors"))
        self.state.rng = self.rng.bit_generator.state
        meta = {"run": asdict(self.state),
                "buffer": [[b.groups_total, b.groups_kept] for b in self.trainer.buffer],
                "targets": [[t.clip_id, t.step, t.kind] for t in self.pending_targets],
                "optimizers": {"disc_opt": _optimizer_meta(self.trainer.optimizer),
                               "gen_opt": _optimizer_meta(self.gen_optimizer)}}
        (tmp / "run.json").write_text(json.dumps(meta, indent=1, default=_json_default))
        return _replace_dir(tmp, final)

    def save_best(self, directory: str | Path, validation: dict[str, float]) -> Path:
        """Write the current model as a planner checkpoint (atomically) recording the round and its
        ``validation`` under ``training.rl_best``: the round a user deploys when later rounds validate
        worse (a run's ``final/`` is only its last round)."""
        final = Path(directory)
        tmp = _fresh_tmp(final)
        info = self.model.training_info
        self.model.training_info = {**info, "rl_best": {"iteration": self.state.iteration, **validation}}
        try:
            self.model.save(tmp)
        finally:
            self.model.training_info = info
        return _replace_dir(tmp, final)

    def restore(self, directory: str | Path) -> None:
        """Continue a run saved by :meth:`save` (same configuration)."""
        d = Path(directory)
        meta = json.loads((d / "run.json").read_text())
        from rad2_planner.networks.model import PlannerModel

        saved = PlannerModel.load(d / "model")
        self.model.load_state_dict(saved.state_dict())
        self.model.discriminator_trained = saved.discriminator_trained
        arrays = load_arrays(str(d / "state.safetensors"))
        _restore_optimizer(self.trainer.optimizer, "disc_opt", arrays, meta["optimizers"]["disc_opt"])
        _restore_optimizer(self.gen_optimizer, "gen_opt", arrays, meta["optimizers"]["gen_opt"])
        self.trainer.buffer.clear()
        for i, (total, kept) in enumerate(meta["buffer"]):
            self.trainer.buffer.append(_buffer_from_arrays(arrays, i, total, kept))
        self.pending_targets = [
            OGOTarget(cid, int(step), arrays[f"target.{i}.ego_state"], float(arrays[f"target.{i}.accel"][0]),
                      arrays[f"target.{i}.raw"], arrays[f"target.{i}.target"], kind)
            for i, (cid, step, kind) in enumerate(meta["targets"])]
        torch.set_rng_state(torch.from_numpy(arrays["torch_rng"]))
        self.torch_gen.set_state(torch.from_numpy(arrays["torch_gen"]))
        self.state = RunState(**meta["run"])
        self.rng.bit_generator.state = self.state.rng
        self.trainer.entropy.log_beta = float(self.state.log_beta)
        if self.pool is not None:
            self.pool.set_weights(self.model.state_dict(), self.model.discriminator_trained)


def round_key(validation: dict[str, float], keep_round_by: str = "safety") -> tuple[float, ...] | None:
    """A validated round's rank, smaller is better: ``safety`` (at-fault collisions, −score, collision
    rate), ``reward`` (−reward); None when a value it needs is missing or not finite (such a round is
    never kept, and NaN would block every later comparison)."""
    if keep_round_by not in KEEP_ROUND_BY:
        raise ValueError(f"rl.keep_round_by: unknown value {keep_round_by!r} (choose from {KEEP_ROUND_BY})")
    if keep_round_by == "reward":
        values = [validation.get("val_reward", math.nan)]
        signs = (-1.0,)
    else:
        values = [validation.get(k, math.nan)
                  for k in ("val_at_fault_collisions", "val_score", "val_collision_rate")]
        signs = (1.0, -1.0, 1.0)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return None
    return tuple(s * float(v) for s, v in zip(signs, values))


def better_round(validation: dict[str, float], kept: dict[str, float] | None,
                 keep_round_by: str = "safety") -> bool:
    """Whether a round validated as ``validation`` replaces the kept round (``kept``; None: none yet):
    strictly better by :func:`round_key`, so a tie keeps the earlier round."""
    key = round_key(validation, keep_round_by)
    if key is None:
        return False
    kept_key = None if kept is None else round_key(kept, keep_round_by)
    return kept_key is None or key < kept_key


def train(run: RLRun, out_dir: str | Path, budget_s: float = math.inf,
          log: Callable[[int, dict[str, float]], None] | None = None,
          progress: Callable[[int], None] | None = None,
          on_iteration: Callable[[int], None] | None = None) -> RunState:
    """Iterate until ``run.cfg.iterations`` or the wall-clock ``budget_s``; checkpoints in ``out_dir``
    (``last/``; resume with :meth:`RLRun.restore`), and ``best/``: the planner of the round kept so far
    (:func:`better_round` by ``rl.keep_round_by``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    cfg = run.cfg

    def keep_if_better(val: dict[str, float], it: int) -> None:
        kept = run.state.best_validation
        if kept is None and run.state.best_val_reward is not None:  # a run saved before best_validation
            kept = {"val_reward": run.state.best_val_reward}
        if better_round(val, kept, cfg.keep_round_by):
            run.state.best_validation, run.state.best_iteration = dict(val), it
            run.state.best_val_reward = val.get("val_reward")
            run.save_best(out / "best", val)

    if run.state.iteration == 0 and run.state.start_validation is None and run.val_clips:
        # The starting planner competes for best/ too. A run that fine-tunes a good checkpoint and
        # whose rounds all validate worse (OGO on the shipped planner, docs/results.md) must leave
        # best/ = the start, not its least bad round.
        val = run.validate()
        run.state.start_validation = val
        keep_if_better(val, 0)
    while run.state.iteration < cfg.iterations:
        logs = run.iteration(progress=progress)
        it = run.state.iteration
        if it % cfg.validate_every == 0 or it == cfg.iterations:
            val = run.validate()
            logs.update(val)
            run.state.history[-1].update(val)  # the history keeps them too (curves.png, history.json)
            keep_if_better(val, it)
        if log is not None:
            log(it, logs)
        over_budget = time.monotonic() - start > budget_s
        if it % cfg.checkpoint_every == 0 or it == cfg.iterations or over_budget:
            run.save(out / "last")
        if on_iteration is not None:
            on_iteration(it)
        if over_budget:
            break
    return run.state


def config_from_params(training: dict[str, Any],
                       **overrides: Any) -> tuple[RLConfig, TCGRPOConfig, OGOConfig]:
    """The three configurations of ``training.yaml``'s ``rl:`` block (``overrides``: RLConfig fields)."""
    rl = training["rl"]
    cfg = RLConfig.from_params(rl, **overrides)
    tc = TCGRPOConfig(**rl["tc_grpo"])
    if tc.prior_kl_weight > 0 and cfg.discriminator_prior_weight == 0:
        raise ValueError("rl.tc_grpo.prior_kl_weight > 0: the KL is to the consensus prior's distribution, "
                         "which the rollouts record only with rl.discriminator_prior_weight > 0")
    return cfg, tc, OGOConfig(**rl["ogo"])


# ----------------------------------------------------------------------------------------------------
# checkpoint helpers: everything as flat named arrays (safetensors) plus JSON for the structure


def _fresh_tmp(final: Path) -> Path:
    """An empty sibling folder name of ``final`` to write into before :func:`_replace_dir`."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def _replace_dir(tmp: Path, final: Path) -> Path:
    """Move the written folder ``tmp`` to ``final``, replacing what was there: a kill at any point
    leaves one complete copy (``final``, or the previous one as ``.<name>.old`` between the two
    renames)."""
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _optimizer_meta(opt: torch.optim.Optimizer) -> dict[str, Any]:
    sd = opt.state_dict()
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    scalars = {str(pid): {k: (float(v) if torch.is_tensor(v) and v.ndim == 0 else None)
                          for k, v in st.items()} for pid, st in sd["state"].items()}
    return {"param_groups": groups, "scalars": scalars}


def _optimizer_arrays(prefix: str, opt: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    return {f"{prefix}.{pid}.{k}": v.detach().cpu().numpy()
            for pid, st in opt.state_dict()["state"].items()
            for k, v in st.items() if torch.is_tensor(v) and v.ndim > 0}


def _restore_optimizer(opt: torch.optim.Optimizer, prefix: str, arrays: dict[str, np.ndarray],
                       meta: dict[str, Any]) -> None:
    saved = [len(g["params"]) for g in meta["param_groups"]]
    now = [len(g["params"]) for g in opt.param_groups]
    if saved != now:
        hint = (" (OGO's optimiser: rl.ogo.update_scene_encoder as the run was started)"
                if prefix == "gen_opt" else "")
        raise ValueError(f"resume: the saved {prefix} optimises {sum(saved)} parameter tensors, this "
                         f"configuration {sum(now)}: resume with the settings the run was started with{hint}")
    state = {}
    for pid, scalars in meta["scalars"].items():
        st = {k: torch.tensor(v) for k, v in scalars.items() if v is not None}
        for key, arr in arrays.items():
            head = f"{prefix}.{pid}."
            if key.startswith(head):
                st[key[len(head):]] = torch.from_numpy(arr.copy())
        state[int(pid)] = st
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


_BATCH_FIELDS = ("candidates", "selected", "old_log_prob", "allowed", "advantage")


def _buffer_arrays(buffer: Sequence[DecisionBatch]) -> dict[str, np.ndarray]:
    out = {}
    for i, b in enumerate(buffer):
        for f in _BATCH_FIELDS:
            out[f"buffer.{i}.{f}"] = np.ascontiguousarray(getattr(b, f))
        for k, v in b.inputs.items():
            out[f"buffer.{i}.inputs.{k}"] = np.ascontiguousarray(v)
    return out


def _buffer_from_arrays(arrays: dict[str, np.ndarray], i: int, total: int, kept: int) -> DecisionBatch:
    head = f"buffer.{i}.inputs."
    return DecisionBatch(
        **{f: arrays[f"buffer.{i}.{f}"] for f in _BATCH_FIELDS},
        inputs={k[len(head):]: v for k, v in arrays.items() if k.startswith(head)},
        groups_total=int(total), groups_kept=int(kept))


def _target_arrays(targets: Sequence[OGOTarget]) -> dict[str, np.ndarray]:
    out = {}
    for i, t in enumerate(targets):
        out[f"target.{i}.ego_state"] = np.asarray(t.ego_state, dtype=np.float64)
        out[f"target.{i}.accel"] = np.array([t.accel], dtype=np.float64)
        out[f"target.{i}.raw"] = np.asarray(t.raw, dtype=np.float64)
        out[f"target.{i}.target"] = np.asarray(t.target, dtype=np.float64)
    return out


