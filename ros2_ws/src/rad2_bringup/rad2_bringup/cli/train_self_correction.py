"""Imitation with correction: fine-tune the generator to propose again given the proposals the collision
critic rejected (CorrectionPlanner's self-correction; see rad2_training/correction.py).

Hyper-parameters come from params/training.yaml (self_correction.*; the feature cache from imitation.*);
--set key=value overrides one. Prints the held-out check: the critic's acceptance of one corrected
round against one round of rejection sampling.

example (the shipped checkpoint's command is recorded in its config.json under training.command):
  rad2 train self-correction --data data/train --out out/self_correction \\
      --export-to checkpoints/self_correction
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("train self-correction", __doc__)
    ap.add_argument("--data", required=True, help="dataset directory (index.json, clips/, maps/)")
    ap.add_argument("--out", required=True, help="run directory (final/, tb/)")
    ap.add_argument("--base", default=None,
                    help="pretrained generator checkpoint (default: planner.checkpoint_dir of "
                         "params/planner.yaml, the planner the corrector must share its scene encoder with)")
    ap.add_argument("--critic", default="checkpoints/collision_critic", help="collision critic checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a self_correction.* hyper-parameter (JSON), e.g. --set max_steps=200")
    ap.add_argument("--time-budget-min", type=float_in(0.0, exclusive_min=True), default=None,
                    help="stop training after N minutes")
    ap.add_argument("--workers", type=int_at_least(0, 256), default=2,
                    help="processes building the feature cache")
    ap.add_argument("--export-to", default=None, help="also write it here, float16 (shipped form)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if not (Path(args.data) / "index.json").is_file():
        ap.error(f"--data: {args.data} is not a dataset directory (no index.json)")
    from rad2_core.config import (
        ParameterError,
        ResourceNotFoundError,
        budget_seconds,
        load_merged,
        parse_block_overrides,
        require,
    )
    from rad2_planner.networks.critic import CriticCheckpointError
    from rad2_planner.networks.model import CheckpointError
    from rad2_planner.policy import resolve_path
    from rad2_training.correction import train_self_correction

    try:
        overrides = parse_block_overrides("training", "self_correction", args.set)
        params = load_merged()
        if args.base is None:
            args.base = str(require(params, "planner.checkpoint_dir"))
        model, check = train_self_correction(
            args.data, args.out, resolve_path(args.base), resolve_path(args.critic), params, overrides,
            args.workers,
            not args.no_progress, shlex.join(["rad2", "train", "self-correction", *argv]),
            budget_seconds(args.time_budget_min, "--time-budget-min"))
    except (ParameterError, ResourceNotFoundError, CheckpointError, CriticCheckpointError) as exc:
        ap.error(str(exc))
    if args.export_to:
        import torch
        from rad2_planner.networks import PlannerModel

        model.save(args.export_to, dtype=torch.float16)
        PlannerModel.load(args.export_to)  # the shipped form must load
        print(f"exported to {args.export_to}")
    print(json.dumps(check, indent=1))
    return 0

