"""Train the collision critic of the safety layer on labels from the simulator, and report its warnings.

1. Data (cached under --data-dir, rebuilt with --rebuild): the shipped planner (params/planner.yaml,
   safety layer off) drives --train-clips clips of --train-split and --test-clips clips of --test-split
   closed loop (one rollout each, log-replayed agents, a decision every --h-reuse steps); every
   candidate of every decision is labelled by executing it open loop against the clip's logged agent
   boxes for --horizon-s seconds (rad2_training.critic_data.label_candidates).
2. Training: class-balanced BCE on the training clips, --val-fraction of them held out (split by clip)
   for the validation curve.
3. Report on the held-out test split: precision, recall and lead time of the warnings per threshold
   (printed, and written with the training curve as JSON + PNG beside the checkpoint).

Writes --out (default checkpoints/collision_critic): critic.safetensors, config.json (with the command,
seed, data sizes, wall times, hardware and the test statistics), training_curve.png, warnings.json,
warnings.md and warnings.png.

The work is done by rad2_training.critic_run (data, training, report) and rad2_training.critic_data.

example (about 20 minutes on 2 shared cores, two thirds of it driving the planner for the data):
  rad2 train critic --train-clips 150 --test-clips 0 --epochs 8 --candidates-per-decision 8 --seed 0
"""

from __future__ import annotations

import argparse
import shlex

from rad2_bringup.cli.common import find_dataset, verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least, schema_value

    ap = verb_parser("train critic", __doc__)
    ap.add_argument("--train-split", default="data/train", help="dataset the critic is trained on")
    ap.add_argument("--train-clips", type=int_at_least(0), default=150,
                    help="clips of --train-split to drive (0: all)")
    ap.add_argument("--test-split", default="data/eval_safety", help="held-out dataset for the report")
    ap.add_argument("--test-clips", type=int_at_least(0), default=0,
                    help="clips of --test-split to drive (0: all)")
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
        type=float_in(0.0, 60.0, exclusive_min=True),
        default=None,
        help="k: label = collision within this many seconds (default: the plan horizon)",
    )
    ap.add_argument(
        "--h-reuse",
        type=schema_value("sim", "evaluation.h_reuse"),
        default=None,
        help="steps between decisions while collecting (default: evaluation.h_reuse of sim.yaml)",
    )
    ap.add_argument(
        "--chunk-clips", type=int_at_least(1, 4096), default=8,
        help="clips driven together (memory: kept observations)"
    )
    ap.add_argument("--val-fraction", type=float_in(0.0, 1.0), default=0.1,
                    help="training clips held out for validation")
    ap.add_argument("--epochs", type=int_at_least(1, 100000), default=8,
                    help="the epoch with the best validation AP is kept")
    ap.add_argument("--batch-size", type=int_at_least(1, 65536), default=32, help="decisions per batch")
    ap.add_argument("--candidates-per-decision", type=int_at_least(1, 1024), default=8,
                    help="candidates drawn per decision")
    ap.add_argument("--lr", type=float_in(0.0, 10.0, exclusive_min=True), default=2e-3,
                    help="peak learning rate (one-cycle schedule)")
    ap.add_argument("--weight-decay", type=float_in(0.0, 10.0), default=1e-4)
    ap.add_argument("--d-model", type=int_at_least(1, 4096), default=48)
    ap.add_argument("--blocks", type=int_at_least(1, 64), default=2, help="agent-attention + temporal blocks")
    ap.add_argument("--max-agents", type=int_at_least(1, 1024), default=16,
                    help="nearest agent tokens the critic reads")
    ap.add_argument("--threads", type=int_at_least(1, 256), default=2, help="torch threads for training")
    ap.add_argument("--seed", type=int_at_least(0, 2**32 - 1), default=0,
                    help="clip order, initialisation, batches, rollouts")
    ap.add_argument("--out", default="checkpoints/collision_critic", help="checkpoint + report directory")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.val_fraction >= 1.0:
        ap.error(f"--val-fraction: must be in [0, 1), got {args.val_fraction}")
    for option in ("train_split", "test_split"):
        found = find_dataset(getattr(args, option))
        if found is None:
            ap.error(f"--{option.replace('_', '-')}: {getattr(args, option)} is not a dataset directory "
                     "(no index.json)")
        setattr(args, option, str(found))

    from rad2_core.config import load_merged
    from rad2_training.critic_run import train_and_report

    command = shlex.join(["rad2", "train", "critic", *argv])
    train_and_report(command=command, params=load_merged(), **vars(args))
    return 0

