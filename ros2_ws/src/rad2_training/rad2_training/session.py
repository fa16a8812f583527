"""A closed-loop RL session as rad2 train rl runs it (rad2_training.train does the learning): the ``rl:``
settings with overrides, the training / validation clip split, the optional Ray rollout pool, the loop
with TensorBoard and a progress bar, then the exported planner checkpoint and the curves. No ROS.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def rl_overrides(items: list[str]) -> dict:
    """``--set rl.KEY=VALUE`` items as a flat dict (YAML values), checked against the schema."""
    from rad2_core.config import ParameterError, key_values, validate_overrides

    what = "rl.KEY (e.g. rl.tc_grpo.advantage=vd_grpo)"
    flat = key_values(items, "--set", what)
    for key in flat:
        if not key.startswith("rl."):
            raise ParameterError(f"--set {key}: expected KEY=VALUE with KEY {what}")
    validate_overrides("training", flat)
    return flat


def plot_history(history: list[dict], path: Path, start: dict[str, float] | None = None) -> None:
    """The run's curves: a panel for each logged quantity that has values (a run with the discriminator
    frozen logs no entropy, one without OGO no generator loss). ``start``: the starting planner's
    validation (round 0), drawn as a dashed line in the validation panels, so a reader sees whether
    training beat the checkpoint it started from."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        return
    it = [h["iteration"] for h in history]
    panels = [("reward_mean", "rollout reward"), ("collision_rate", "rollout collision rate"),
              ("entropy", "policy entropy (nats)"), ("clip_filter_rate", "clip-filter rate"),
              ("ogo_loss", "OGO generator loss (Eq. 19)"),
              ("ogo_decelerate_share", "OGO: deceleration targets"),
              ("val_collision_rate", "validation CR"),
              ("val_at_fault_collisions", "validation at-fault collisions"),
              ("val_score", "validation nuPlan-style score"), ("val_progress_ratio", "validation progress")]
    panels = [(k, t) for k, t in panels if any(k in h for h in history)]
    cols = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, cols, figsize=(4.4 * cols, 6), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    for ax, (key, title) in zip(axes.ravel(), panels):
        pts = [(i, h[key]) for i, h in zip(it, history) if key in h]
        ax.plot(*zip(*pts), "-o", ms=3)
        if start and key in start:
            ax.axhline(start[key], ls="--", color="grey", label="start (round 0)")
            ax.legend(fontsize=8)
        ax.set(title=title, xlabel="round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rl_config(params: dict[str, Any], set_items: list[str], seed: int | None = None,
              iterations: int | None = None):
    """(``params`` with the ``--set`` overrides applied to a copy of its ``rl`` block, RLConfig, TC-GRPO
    config, OGO config); ``params``: every file of params/ as loaded, merged. ParameterError /
    ValueError / TypeError on a bad setting."""
    import copy

    from rad2_core.config import apply_overrides

    from rad2_training.train import config_from_params

    params = {**params, "rl": copy.deepcopy(params["rl"])}
    apply_overrides(params["rl"], {k[3:]: v for k, v in rl_overrides(set_items).items()})
    extra = {k: v for k, v in (("seed", seed), ("iterations", iterations)) if v is not None}
    return (params, *config_from_params(params, **extra))


def split_clips(clips: list, cfg, groups: Sequence[int] | None = None) -> tuple[list, list]:
    """(training clips, validation clips): a seeded permutation, ``validation_clips`` held out while at
    least ``clips_per_iteration`` remain for training.

    ``groups`` (one label per clip, e.g. which ``--train-data`` set it came from) stratifies the held-out
    clips: each group gets its share of them in proportion to its size (largest remainders), taken in
    the permutation's order. A plain permutation of a pool of several sets can leave one set nearly
    out of validation, and then ``best/`` cannot see the policy forget it (a four-set run once drew 2 of
    16 validation clips from the old safety set). One group gives the unstratified split."""
    order = np.random.default_rng(cfg.seed).permutation(len(clips))
    n_val = min(cfg.validation_clips, max(len(clips) - cfg.clips_per_iteration, 0))
    held = _stratified_pick(order, groups, n_val, "split_clips")
    held_set = set(held)
    return [clips[i] for i in order if int(i) not in held_set], [clips[i] for i in held]


def _stratified_pick(order: np.ndarray, groups: Sequence | None, n: int, what: str) -> list[int]:
    """``n`` indices of ``order`` (a permutation), each group's share in proportion to its size
    (largest remainders), taken in the permutation's order."""
    if groups is None:
        groups = [0] * len(order)
    if len(groups) != len(order):
        raise ValueError(f"{what}: {len(groups)} group labels for {len(order)} clips")
    labels, sizes = np.unique(np.asarray(groups), return_counts=True)
    exact = n * sizes / max(len(order), 1)
    quota = np.floor(exact).astype(int)
    for j in np.argsort(-(exact - quota), kind="stable")[: n - int(quota.sum())]:
        quota[j] += 1
    left = dict(zip(labels.tolist(), quota.tolist()))
    held = []
    for i in order:
        if left[groups[i]] > 0:
            left[groups[i]] -= 1
            held.append(int(i))
    return held


def validation_from(pool: list, cfg, groups: Sequence | None = None, train_clips: Sequence = ()) -> list:
    """The validation clips drawn from a separate pool (``rl.validation_data``: e.g. clips of
    locations no training set covers): ``validation_clips`` of them, a seeded draw stratified by
    ``groups`` (which directory each came from) as :func:`split_clips` does, in the pool's order. A
    clip that is also a training clip (same id) is refused: it would be validated on what it was
    trained on."""
    shared = sorted({c.clip_id for c in pool} & {c.clip_id for c in train_clips})
    if shared:
        raise ValueError(f"rl.validation_data: {len(shared)} clip(s) are also training clips "
                         f"(e.g. {shared[:3]}); validate on clips the run does not train on")
    order = np.random.default_rng(cfg.seed).permutation(len(pool))
    picked = _stratified_pick(order, groups, min(cfg.validation_clips, len(pool)), "validation_from")
    return [pool[i] for i in sorted(picked)]


def rollout_pool(ckpt: Path, cfg, params: dict, workers: int):
    """Ray workers sampling with the checkpoint's planner (discriminator inputs recorded; ``params``:
    every file of params/ as loaded, merged)."""
    from rad2_training.workers import PolicySpec, RolloutPool

    spec = PolicySpec(checkpoint_dir=str(ckpt), backend="pytorch", selection="sample",
                      record_discriminator_inputs=True, threads=1, always_score=True,
                      planner_overrides={"num_candidates": cfg.num_candidates,
                                         "discriminator_candidates": cfg.discriminator_candidates,
                                         "discriminator_prior_weight": cfg.discriminator_prior_weight})
    return RolloutPool(spec, params, num_workers=workers)


def train_with_logging(run, out: Path, budget_s: float, progress: bool = True):
    """rad2_training.train.train with TensorBoard scalars (``out/tb``) and a progress bar; returns its
    state."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from rad2_training.train import train

    writer = SummaryWriter(str(out / "tb"))
    bar = tqdm(total=run.cfg.iterations, initial=run.state.iteration, desc="RL rounds", disable=not progress)

    def log(it: int, values: dict) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                writer.add_scalar(f"rl/{k}", v, it)
        bar.update(1)
        bar.set_postfix(reward=f"{values['reward_mean']:.3f}", cr=f"{values['collision_rate']:.2f}",
                        H=f"{values.get('entropy', float('nan')):.2f}")

    try:
        return train(run, out, budget_s=budget_s, log=log)
    finally:
        bar.close()
        writer.close()


# The RL run's entries of a checkpoint's training record (config.json "training"); previous_rl nests
# the record of the RL run it started from, and so on down the chain.
RL_RECORD_KEYS = ("rl", "rl_command", "rl_seed", "rl_wall_s", "rl_best", "previous_rl")


def stamp_rl_run(model, seed: int) -> None:
    """Record this run's command and seed in the model's training record (so that ``best/``,
    ``last/`` and ``final/`` all carry them). A starting checkpoint that is itself an RL run keeps its
    record under ``previous_rl`` instead of having it overwritten."""
    info = dict(model.training_info)
    earlier = {k: info.pop(k) for k in RL_RECORD_KEYS if k in info}
    if earlier:
        info["previous_rl"] = earlier
    model.training_info = {**info, "rl_command": " ".join(sys.argv), "rl_seed": seed}


def export_final(model, state, cfg, out: Path, fp16: bool = False) -> None:
    """history.json, the planner checkpoint ``final/`` (with the run in training_info), curves.png."""
    import torch

    (out / "history.json").write_text(json.dumps(state.history, indent=1))
    model.training_info = {**model.training_info, "rl_wall_s": state.seconds}
    # a run that froze a trained discriminator (rl.train_discriminator: false) keeps it trained
    updated = cfg.train_discriminator and state.updates > 0
    model.discriminator_trained = bool(model.discriminator_trained or updated)
    model.save(out / "final", dtype=torch.float16 if fp16 else torch.float32)
    plot_history(state.history, out / "curves.png", getattr(state, "start_validation", None))


def run_session(model, ckpt: Path, params: dict, cfg, tc_cfg, ogo_cfg, train_clips: list, val_clips: list,
                out: Path, *, workers: int = 0, resume: bool = False, budget_s: float = math.inf,
                export_fp16: bool = False, progress: bool = True) -> Any:
    """The whole session (``resume``: from ``out/last``, which must exist); returns the final RunState.
    ``params``: every file of params/ as loaded (with the run's overrides), merged: the simulator's
    and planner's settings here and in the Ray workers."""
    from bev_warp_sim.simulator import Simulator

    from rad2_training.train import RLRun

    pool = rollout_pool(ckpt, cfg, params, workers) if workers > 0 else None
    run = RLRun(model, cfg, tc_cfg, ogo_cfg, Simulator(params), train_clips, val_clips, params=params,
                pool=pool)
    if resume:
        run.restore(out / "last")
        print(f"resumed {out / 'last'} at round {run.state.iteration}")
    elif pool is not None:
        pool.set_weights(model.state_dict(), model.discriminator_trained)
    print(f"RL: {len(train_clips)} training clips, {len(val_clips)} validation clips, G={cfg.group_size}, "
          f"M={cfg.num_candidates}, H_reuse={cfg.h_reuse}, reward {cfg.reward}, "
          f"advantage {tc_cfg.advantage}, seed {cfg.seed}, start {ckpt}")
    stamp_rl_run(model, cfg.seed)
    t0 = time.time()
    try:
        state = train_with_logging(run, out, budget_s, progress)
    finally:
        if pool is not None:
            pool.close()
    export_final(model, state, cfg, out, export_fp16)
    if state.start_validation:
        v = state.start_validation
        print(f"start (round 0) validation: at-fault collisions "
              f"{v.get('val_at_fault_collisions', math.nan):g}, score {v.get('val_score', math.nan):.3f}, "
              f"reward {v['val_reward']:.3f}, "
              f"CR {v['val_collision_rate']:.3f}, progress {v['val_progress_ratio']:.3f}")
    kept = state.best_validation is not None or state.best_val_reward is not None
    best = (f", kept round (rl.keep_round_by {cfg.keep_round_by}) {out / 'best'} "
            f"(round {state.best_iteration})" if kept else "")
    print(f"{state.iteration} rounds ({state.updates} discriminator updates, "
          f"{state.generator_updates} generator updates, {state.env_steps} env steps) in "
          f"{time.time() - t0:.0f} s this session; "
          f"planner checkpoint {out / 'final'}{best}, curves {out / 'curves.png'}")
    return state
