#!/usr/bin/env python3
"""Train the collision critic of the safety layer on labels from the simulator, and report its warnings.

1. Data (cached under --data-dir, rebuilt with --rebuild): the shipped planner (params/planner.yaml,
   safety layer off) drives --train-clips clips of --train-split and --test-clips clips of --test-split
   closed loop (one rollout each, log-replayed agents, a decision every --h-reuse steps); every
   candidate of every decision is labelled by executing it open loop against the clip's logged agent
   boxes for --horizon-s seconds (rad2_rl.critic_data.label_candidates).
2. Training: class-balanced BCE on the training clips, --val-fraction of them held out (split by clip)
   for the validation curve.
3. Report on the held-out test split: precision, recall and lead time of the warnings per threshold
   (printed, and written with the training curve as JSON + PNG beside the checkpoint).

Writes --out (default checkpoints/collision_critic): critic.safetensors, config.json (with the command,
seed, data sizes, wall times, hardware and the test statistics), training_curve.png, warnings.json,
warnings.md and warnings.png.

Example (about 20 minutes on 2 shared cores, two thirds of it driving the planner for the data):
    python tools/train_critic.py --train-clips 150 --test-clips 0 --epochs 8 \
        --candidates-per-decision 8 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def hardware() -> dict:
    """What the figures were measured on (CPU model, cores, load)."""
    from rad2_planner.benchmarking import machine_info

    info = machine_info()
    return {
        "cpu": info.cpu_model,
        "logical_cpus": info.logical_cpus,
        "load_average": list(os.getloadavg()),
        "python": info.python,
        "platform": platform.platform(),
    }


def pick_clips(split: str, n: int, seed: int) -> list:
    """``n`` clips of ``split`` (0: all) in a seeded random order (the index lists clips kind by kind,
    so its head would hold only one or two scenario kinds)."""
    import numpy as np
    from rad2_planner.clip import load_dataset

    clips = load_dataset(split)
    order = np.random.default_rng(seed).permutation(len(clips))
    return [clips[i] for i in order[: (n or len(clips))]]


def build(split: str, n: int, path: Path, args, policy, cached=None) -> object:
    """Drive and label ``n`` clips of ``split``; clips already in ``cached`` (a dataset built with the
    same settings from a prefix of the same clip order) are reused, only the rest are driven."""
    from rad2_rl.critic_data import CriticDataset, collect_critic_dataset
    from tqdm import tqdm

    clips = pick_clips(split, n, args.seed)
    reuse = 0
    if cached is not None and [c.clip_id for c in clips[: len(cached.clip_ids)]] == cached.clip_ids:
        reuse = len(cached.clip_ids)
    t0 = time.perf_counter()
    with tqdm(total=len(clips) - reuse, desc=f"labelling {Path(split).name}", unit="clip") as bar:
        new = collect_critic_dataset(
            policy,
            clips[reuse:],
            args.horizon_s,
            h_reuse=args.h_reuse,
            chunk_clips=args.chunk_clips,
            seed=args.seed,
            progress=bar.update,
        )
    data = CriticDataset.concatenate([cached, new]) if reuse else new
    wall = time.perf_counter() - t0 + (float(cached.meta.get("build_wall_s", 0.0)) if reuse else 0.0)
    data.meta.update(
        {
            **new.meta,
            "clips": len(clips),
            "split": split,
            "requested_clips": n,
            "build_wall_s": wall,
            "dropped_incomplete_horizon": new.meta["dropped_incomplete_horizon"]
            + (int(cached.meta.get("dropped_incomplete_horizon", 0)) if reuse else 0),
        }
    )
    if reuse:
        print(f"{Path(split).name}: reused the {reuse} clips of the cache, drove {len(clips) - reuse}")
    data.save(path)
    return data


def plot_training(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    ax[0].plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    if "val_loss" in history[0]:
        ax[0].plot(ep, [h["val_loss"] for h in history], "s-", label="validation clips")
        ax[1].plot(ep, [h["val_ap"] for h in history], "s-", color="tab:green")
        kept = max(history, key=lambda h: h["val_ap"])["epoch"]
        for a in ax:
            a.axvline(kept, color="0.5", ls=":", lw=1)
        ax[1].annotate(
            "kept",
            (kept, max(h["val_ap"] for h in history)),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=8,
        )
    ax[0].set(xlabel="epoch", ylabel="class-balanced BCE", title="loss")
    ax[0].legend()
    ax[1].set(xlabel="epoch", ylabel="average precision", title="validation AP (all candidates)")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_warnings(curve: list[dict], stats: dict, path: Path) -> None:
    """Precision / recall and lead time against the threshold, the reported thresholds marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thr = [c["threshold"] for c in curve]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for key, style in (("precision", "-"), ("recall", "--")):
        ax[0].plot(thr, [c["candidates"][key] for c in curve], style, color="tab:blue", label=f"{key}, all")
        ax[0].plot(
            thr, [c["executed"][key] for c in curve], style, color="tab:orange", label=f"{key}, executed"
        )
    ax[1].plot(thr, [c["candidates"]["mean_lead_s"] for c in curve], "-", label="true warnings, all")
    ax[1].plot(thr, [c["executed"]["mean_lead_s"] for c in curve], "-", label="true warnings, executed")
    ax[1].plot(
        thr,
        [c["events"]["mean_first_warning_lead_s"] for c in curve],
        ":",
        label="first warning before a closed-loop collision",
    )
    for a in ax:
        for t in stats["thresholds"]:
            a.axvline(float(t), color="0.8", lw=0.8)
        a.set_xlabel("threshold")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[0].set(
        ylabel="precision / recall",
        ylim=(0, 1.02),
        title=f"test AP {stats['average_precision']:.2f} (all), {stats['average_precision_executed']:.2f} "
        "(executed)",
    )
    ax[1].set(ylabel="s", title="mean lead time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-split", default="data/train", help="dataset the critic is trained on")
    ap.add_argument("--train-clips", type=int, default=150, help="clips of --train-split to drive (0: all)")
    ap.add_argument("--test-split", default="data/eval_safety", help="held-out dataset for the report")
    ap.add_argument("--test-clips", type=int, default=0, help="clips of --test-split to drive (0: all)")
    ap.add_argument(
        "--data-dir", default="out/collision_critic", help="where the labelled .npz files are cached"
    )
    ap.add_argument(
        "--rebuild",
        action="store_true",
        help="drive and label again even if the cache exists (without it, a cache of fewer clips of "
        "the same order and settings is extended)",
    )
    ap.add_argument("--build-only", action="store_true", help="stop after building the datasets")
    ap.add_argument(
        "--horizon-s",
        type=float,
        default=None,
        help="k: label = collision within this many seconds (default: the plan horizon)",
    )
    ap.add_argument(
        "--h-reuse",
        type=int,
        default=None,
        help="steps between decisions while collecting (default: evaluation.h_reuse of sim.yaml)",
    )
    ap.add_argument(
        "--chunk-clips", type=int, default=8, help="clips driven together (memory: kept observations)"
    )
    ap.add_argument("--val-fraction", type=float, default=0.1, help="training clips held out for validation")
    ap.add_argument("--epochs", type=int, default=8, help="the epoch with the best validation AP is kept")
    ap.add_argument("--batch-size", type=int, default=32, help="decisions per batch")
    ap.add_argument("--candidates-per-decision", type=int, default=8, help="candidates drawn per decision")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (one-cycle schedule)")
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--d-model", type=int, default=48)
    ap.add_argument("--blocks", type=int, default=2, help="agent-attention + temporal blocks")
    ap.add_argument("--max-agents", type=int, default=16, help="nearest agent tokens the critic reads")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for training")
    ap.add_argument("--seed", type=int, default=0, help="clip order, initialisation, batches, rollouts")
    ap.add_argument("--out", default="checkpoints/collision_critic", help="checkpoint + report directory")
    args = ap.parse_args(argv)
    for name in ("train_clips", "test_clips"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    for name in ("epochs", "batch_size", "candidates_per_decision", "chunk_clips", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if not 0.0 <= args.val_fraction < 1.0:
        ap.error(f"--val-fraction: must be in [0, 1), got {args.val_fraction}")
    for split in (args.train_split, args.test_split):
        if not (Path(split) / "index.json").is_file():
            ap.error(f"{split} is not a dataset directory (no index.json)")

    import numpy as np
    import torch
    from rad2_planner.config import load_params
    from rad2_planner.networks.critic import CriticConfig
    from rad2_planner.policy import Rad2Policy, SafetyLayerParams
    from rad2_rl.critic_data import (
        THRESHOLDS,
        CriticDataset,
        predict,
        train_critic,
        warning_statistics,
        warning_table,
    )
    from tqdm import tqdm

    t_start = time.perf_counter()
    planner = load_params("planner")["planner"]
    plan_points, plan_dt = int(planner["plan_points"]), float(planner["plan_dt"])
    if args.horizon_s is None:
        args.horizon_s = plan_points * plan_dt
    if args.h_reuse is None:
        args.h_reuse = int(load_params("sim")["evaluation"]["h_reuse"])
    torch.set_num_threads(args.threads)
    data_dir = Path(args.data_dir)
    paths = {"train": data_dir / "train.npz", "test": data_dir / "test.npz"}
    policy = None
    datasets = {}
    for name, split, n in (
        ("train", args.train_split, args.train_clips),
        ("test", args.test_split, args.test_clips),
    ):
        want = {
            "split": split,
            "requested_clips": n,
            "horizon_s": args.horizon_s,
            "h_reuse": args.h_reuse,
            "seed": args.seed,
        }
        cached = None
        if paths[name].is_file() and not args.rebuild:
            data = CriticDataset.load(paths[name])
            have = {k: data.meta.get(k) for k in want}
            if have == want:
                print(f"{name}: cached {paths[name]} ({data.summary()})")
                datasets[name] = data
                continue
            print(f"{name}: cache {paths[name]} was built with {have}, want {want}")
            same = all(have[k] == want[k] for k in want if k != "requested_clips")
            cached = data if same and (n == 0 or len(data.clip_ids) < n) else None
        if policy is None:
            policy = Rad2Policy.from_params(safety_layer=SafetyLayerParams(mode="off"))
        datasets[name] = build(split, n, paths[name], args, policy, cached)
        d = datasets[name]
        print(
            f"{name}: built {paths[name]} in {d.meta['build_wall_s']:.0f} s, "
            f"{paths[name].stat().st_size / 1e6:.1f} MB: {d.summary()}"
        )
    if args.build_only:
        return 0

    train_all, test = datasets["train"], datasets["test"]
    n_clips = len(train_all.clip_ids)
    n_val = int(round(args.val_fraction * n_clips))
    val_rollouts = np.arange(n_clips - n_val, n_clips)  # clip order is already seeded-random
    is_val = np.isin(train_all.rollout, val_rollouts)
    train, val = train_all.subset(np.flatnonzero(~is_val)), train_all.subset(np.flatnonzero(is_val))
    cfg = CriticConfig(
        plan_points=plan_points,
        plan_dt=plan_dt,
        horizon_s=args.horizon_s,
        d_model=args.d_model,
        num_blocks=args.blocks,
        max_agents=args.max_agents,
    )
    print(
        f"training on {len(train)} decisions ({train.collides.size} candidates, positive share "
        f"{train.collides.mean():.3f}) of {n_clips - n_val} clips; validation {len(val)} decisions of "
        f"{n_val} clips"
    )
    t0 = time.perf_counter()
    with tqdm(total=args.epochs, desc="training", unit="epoch") as bar:

        def report(row):
            bar.update(1)
            bar.set_postfix(
                {k: f"{v:.3f}" for k, v in row.items() if k in ("train_loss", "val_loss", "val_ap")}
            )

        critic, history = train_critic(
            train,
            val if len(val) else None,
            cfg,
            epochs=args.epochs,
            batch_size=args.batch_size,
            candidates_per_decision=args.candidates_per_decision,
            lr=args.lr,
            weight_decay=args.weight_decay,
            seed=args.seed,
            progress=report,
        )
    train_wall = time.perf_counter() - t0

    probs = predict(critic, test)
    stats = warning_statistics(probs, test, THRESHOLDS)
    curve = []
    for thr in np.round(np.arange(0.05, 0.96, 0.05), 2):
        row = warning_statistics(probs, test, (float(thr),))["thresholds"][f"{thr:g}"]
        curve.append({"threshold": float(thr), **row})
    table = warning_table(stats)
    print(
        f"\nCollision-critic warnings on {args.test_split} ({len(test.clip_ids)} clips, held out), "
        f"horizon k = {args.horizon_s:g} s:\n{table}"
    )

    out = Path(args.out)
    info = {
        "command": " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv))),
        "seed": args.seed,
        "hyper_parameters": {
            k: getattr(args, k)
            for k in (
                "epochs",
                "batch_size",
                "candidates_per_decision",
                "lr",
                "weight_decay",
                "val_fraction",
                "h_reuse",
            )
        },
        "data": {
            name: {
                **d.summary(),
                "file": str(paths[name]),
                "bytes": paths[name].stat().st_size,
                "build_wall_s": d.meta.get("build_wall_s"),
                "split": d.meta.get("split"),
            }
            for name, d in datasets.items()
        },
        "train_decisions": len(train),
        "val_decisions": len(val),
        "parameters": critic.num_parameters,
        "training_wall_s": train_wall,
        "total_wall_s": time.perf_counter() - t_start,
        "hardware": hardware(),
        "history": history,
        "test": {k: v for k, v in stats.items()},
    }
    critic.save(out, info)
    (out / "warnings.json").write_text(
        json.dumps(
            {"test_split": args.test_split, "horizon_s": args.horizon_s, "statistics": stats, "curve": curve},
            indent=1,
        )
    )
    (out / "warnings.md").write_text(
        f"Collision-critic warnings on {args.test_split} (held out), k = "
        f"{args.horizon_s:g} s, seed {args.seed}\n\n{table}\n"
    )
    plot_training(history, out / "training_curve.png")
    plot_warnings(curve, stats, out / "warnings.png")
    print(
        f"\n{critic.num_parameters} parameters; training {train_wall:.0f} s, "
        f"total {info['total_wall_s']:.0f} s "
        f"on {info['hardware']['cpu']} ({info['hardware']['logical_cpus']} logical CPUs, load "
        f"{info['hardware']['load_average'][0]:.2f}); wrote {out}/"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
