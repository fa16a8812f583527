"""Closed-loop fine-tuning of the self-correcting generator with the rollout engine (CorrectionPlanner's
RL stage on RAD-2's diffusion generator; see ros2_ws/src/rad2_training/rad2_training/correction_rl.py).

Starts from the imitation corrector (safety_layer.correction_checkpoint of params/planner.yaml, or
--start), drives training clips with the self-correction planner (--checkpoint, whose scene encoder the
corrector shares: the shipped corrector belongs to checkpoints/rad2_rl), and fine-tunes the corrector on the
decisions it took part in. Writes <out>/iter_<k>/, <out>/final/, history.json and history.png.

Hyper-parameters come from params/training.yaml (self_correction_rl.*); --set key=value overrides one.
Evaluate the result against the other safety layers with
`rad2 eval safety-layer --correction out/self_correction_rl/final ...`.

example (the shipped checkpoint's command is recorded in its config.json under training.command):
  rad2 train self-correction-rl --data data/train --out out/self_correction_rl \\
      --checkpoint checkpoints/rad2_rl --export-to checkpoints/self_correction
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in

    ap = verb_parser("train self-correction-rl", __doc__)
    ap.add_argument("--data", default="data/train", help="dataset directory of the training clips")
    ap.add_argument("--out", default="out/self_correction_rl", help="run directory")
    ap.add_argument("--checkpoint", default=None,
                    help="planner checkpoint that drives the clips (default: planner.checkpoint_dir)")
    ap.add_argument("--start", default=None,
                    help="corrector to start from (default: safety_layer.correction_checkpoint)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a self_correction_rl.* hyper-parameter (JSON), e.g. --set iterations=2")
    ap.add_argument("--time-budget-min", type=float_in(0.0, exclusive_min=True), default=None,
                    help="stop after the iteration that passes N minutes")
    ap.add_argument("--export-to", default=None, help="also write the result here, float16 (shipped form)")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if not (Path(args.data) / "index.json").is_file():
        ap.error(f"--data: {args.data} is not a dataset directory (no index.json)")
    import torch
    from rad2_core.config import (
        ParameterError,
        ResourceNotFoundError,
        budget_seconds,
        load_merged,
        parse_block_overrides,
    )
    from rad2_planner.networks import PlannerModel
    from rad2_planner.networks.model import CheckpointError
    from rad2_training.correction_rl import CorrectionRLConfig, finetune

    try:
        overrides = parse_block_overrides("training", "self_correction_rl", args.set)
        params = load_merged()
        if args.checkpoint:
            params["planner"]["checkpoint_dir"] = str(args.checkpoint)
        cfg = CorrectionRLConfig.from_params(params["self_correction_rl"], **overrides)
        model, history = finetune(
            args.data, args.out, cfg, params, command=shlex.join(["rad2", "train", "self-correction-rl",
                                                                 *argv]),
            correction_checkpoint=args.start, progress=not args.no_progress,
            time_budget_s=budget_seconds(args.time_budget_min, "--time-budget-min"))
    except (ParameterError, ResourceNotFoundError, CheckpointError, ValueError) as exc:
        ap.error(str(exc))
    if args.export_to:
        model.save(args.export_to, dtype=torch.float16)
        PlannerModel.load(args.export_to)  # the shipped form must load
        print(f"exported to {args.export_to}")
    last = history[-1]
    print(f"{len(history)} iterations: collision rate {history[0]['collision_rate']:.3f} -> "
          f"{last['collision_rate']:.3f}, reward {history[0]['reward']:.3f} -> {last['reward']:.3f}; "
          f"wrote {Path(args.out) / 'final'}, history.json, history.png")
    return 0

