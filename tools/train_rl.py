#!/usr/bin/env python3
"""Closed-loop RL of RAD-2 (TC-GRPO for the discriminator, On-policy Generator Optimization for the
generator) on the BEV-Warp simulator: rad2_rl/train.py, driven from the command line.

Settings come from ``rl:`` in params/training.yaml (``--set rl.KEY=VALUE`` overrides one, checked against
params/training.schema.yaml). The run directory gets TensorBoard curves (``tb/``: rewards, advantages,
entropy, β, clip-filter rate, collision rate and progress of the validation clips), a resumable
checkpoint ``last/`` every ``rl.checkpoint_every`` rounds, ``history.json`` and ``curves.png``; the trained
planner checkpoint (generator + discriminator, safetensors, fp16 with --export-fp16) is ``final/``.
Kill it at any time and rerun with ``--resume``: it continues from the last checkpoint with the same
weights, optimisers, buffer, entropy temperature and random generators.

Examples:
    .venv/bin/python tools/train_rl.py --train-data out/rl_train/safety out/rl_train/efficiency \\
        --out runs/rl_seed0 --seed 0 --budget-min 120
    .venv/bin/python tools/train_rl.py --out runs/rl_seed0 --resume
    .venv/bin/python tools/train_rl.py --train-data data/train --set rl.tc_grpo.advantage=vd_grpo
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def _overrides(items: list[str]) -> dict:
    import yaml
    from rad2_planner.config import ParameterError, validate_overrides

    flat = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("rl."):
            raise ParameterError(f"--set {item!r}: expected rl.KEY=VALUE (e.g. rl.tc_grpo.advantage=vd_grpo)")
        flat[key.strip()] = yaml.safe_load(value) if value != "" else ""
    validate_overrides("training", flat)
    return flat


def _apply(training: dict, flat: dict) -> None:
    for key, value in flat.items():
        node = training
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-data", nargs="+", default=["data/train"],
                    help="dataset directories to train on (default data/train; the curated sets of "
                         "tools/curate_scenarios.py are the intended input)")
    ap.add_argument("--checkpoint", default=None,
                    help="starting planner checkpoint (default: planner.checkpoint_dir)")
    ap.add_argument("--out", default="runs/rl", help="run directory")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/last")
    ap.add_argument("--seed", type=int, default=None, help="overrides rl.seed")
    ap.add_argument("--iterations", type=int, default=None, help="overrides rl.iterations")
    ap.add_argument("--budget-min", type=float, default=math.inf, help="wall-clock budget (minutes)")
    ap.add_argument("--workers", type=int, default=0,
                    help="Ray rollout workers (0: collect in this process; "
                         "cluster address: rollout.ray_address)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of this process")
    ap.add_argument("--set", action="append", default=[], metavar="rl.KEY=VALUE",
                    help="override an rl: setting")
    ap.add_argument("--export-fp16", action="store_true", help="write final/ with float16 weights")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.workers < 0:
        ap.error(f"--workers: must be >= 0, got {args.workers}")
    if not args.budget_min > 0:
        ap.error(f"--budget-min: must be > 0 minutes, got {args.budget_min}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads: must be >= 1, got {args.threads}")

    import torch
    from bev_warp_sim.simulator import Simulator
    from rad2_planner.clip import load_dataset
    from rad2_planner.config import ParameterError, load_params
    from rad2_planner.networks.model import CheckpointError, PlannerModel
    from rad2_planner.policy import resolve_path
    from rad2_rl.train import RLRun, config_from_params, train
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    try:
        training = load_params("training")
        _apply(training["rl"], {k[3:]: v for k, v in _overrides(args.set).items()})
        extra = {k: v for k, v in (("seed", args.seed), ("iterations", args.iterations)) if v is not None}
        cfg, tc_cfg, ogo_cfg = config_from_params(training, **extra)
    except (ParameterError, ValueError, TypeError) as exc:
        ap.error(str(exc))
    clips = []
    for d in args.train_data:
        if not (resolve_path(d) / "index.json").is_file():
            ap.error(f"--train-data: {d} is not a dataset directory (no index.json)")
        clips += load_dataset(resolve_path(d))
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(clips))
    n_val = min(cfg.validation_clips, max(len(clips) - cfg.clips_per_iteration, 0))
    val_clips = [clips[i] for i in order[:n_val]]
    train_clips = [clips[i] for i in order[n_val:]]
    ckpt = resolve_path(args.checkpoint or load_params("planner")["planner"]["checkpoint_dir"])
    try:
        model = PlannerModel.load(ckpt)
    except CheckpointError as exc:
        ap.error(f"--checkpoint: {exc}")

    pool = None
    if args.workers > 0:
        from rad2_rl.workers import PolicySpec, RolloutPool

        spec = PolicySpec(checkpoint_dir=str(ckpt), backend="pytorch", selection="sample",
                          record_discriminator_inputs=True, threads=1, always_score=True,
                          planner_overrides={"num_candidates": cfg.num_candidates})
        pool = RolloutPool(spec, num_workers=args.workers, training_params=training)
    run = RLRun(model, cfg, tc_cfg, ogo_cfg, Simulator(), train_clips, val_clips, pool=pool)
    if args.resume:
        if not (out / "last" / "run.json").is_file():
            ap.error(f"--resume: no checkpoint in {out / 'last'}")
        run.restore(out / "last")
        print(f"resumed {out / 'last'} at round {run.state.iteration}")
    elif pool is not None:
        pool.set_weights(model.state_dict(), model.discriminator_trained)
    print(f"RL: {len(train_clips)} training clips, {len(val_clips)} validation clips, G={cfg.group_size}, "
          f"M={cfg.num_candidates}, H_reuse={cfg.h_reuse}, reward {cfg.reward}, "
          f"advantage {tc_cfg.advantage}, seed {cfg.seed}, start {ckpt}")

    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out / "tb"))
    bar = tqdm(total=cfg.iterations, initial=run.state.iteration, desc="RL rounds", disable=args.no_progress)

    def log(it: int, values: dict) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                writer.add_scalar(f"rl/{k}", v, it)
        bar.update(1)
        bar.set_postfix(reward=f"{values['reward_mean']:.3f}", cr=f"{values['collision_rate']:.2f}",
                        H=f"{values.get('entropy', float('nan')):.2f}")

    t0 = time.time()
    try:
        state = train(run, out, budget_s=args.budget_min * 60.0, log=log)
    finally:
        bar.close()
        writer.close()
        if pool is not None:
            pool.close()
    (out / "history.json").write_text(json.dumps(state.history, indent=1))
    model.training_info = {**model.training_info, "rl_command": " ".join(sys.argv), "rl_seed": cfg.seed,
                           "rl_wall_s": state.seconds}
    model.discriminator_trained = bool(cfg.train_discriminator and state.updates > 0)
    model.save(out / "final", dtype=torch.float16 if args.export_fp16 else torch.float32)
    _plot(state.history, out / "curves.png")
    print(f"{state.iteration} rounds ({state.updates} discriminator updates, "
          f"{state.generator_updates} generator updates, {state.env_steps} env steps) in "
          f"{time.time() - t0:.0f} s this session; "
          f"planner checkpoint {out / 'final'}, curves {out / 'curves.png'}")
    return 0


def _plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        return
    it = [h["iteration"] for h in history]
    panels = [("reward_mean", "rollout reward"), ("collision_rate", "rollout collision rate"),
              ("entropy", "policy entropy (nats)"), ("clip_filter_rate", "clip-filter rate"),
              ("val_collision_rate", "validation CR"), ("val_progress_ratio", "validation progress")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6))
    for ax, (key, title) in zip(axes.ravel(), panels):
        pts = [(i, h[key]) for i, h in zip(it, history) if key in h]
        if pts:
            ax.plot(*zip(*pts), "-o", ms=3)
        ax.set(title=title, xlabel="round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
