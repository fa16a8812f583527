"""Imitation pretraining of the RAD-2 generator on a clip dataset (see rad2_training/imitation.py).

Resume an interrupted run with --resume (same --out). TensorBoard logs: <out>/tb.
Hyper-parameters come from params/training.yaml (imitation.*); --set key=value overrides one.
With --eval-only CHECKPOINT it trains nothing and prints the open-loop metrics of CHECKPOINT on --data.
Every clip is checked first as the simulator would check it (a log of the impossible or a route that
doubles back teaches the generator wrong targets): refused clips are listed with their reasons and the
run stops, unless --skip-bad trains without them (on <out>/accepted_data/<name>, an index of the
accepted clips linked to the dataset's files).

examples (the shipped checkpoint's command is recorded in its config.json under training.command):
  nice -n 10 rad2 train il --data out/train_large --out out/il_run --seed 0
  rad2 train il --data data/eval_safety --eval-only checkpoints/rad2_il
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least, schema_value

    ap = verb_parser("train il", __doc__)
    ap.add_argument("--data", required=True, nargs="+", help="dataset directory (index.json, clips/, maps/)")
    ap.add_argument("--out", default=None, help="run directory (checkpoints last/ and final/, tb/)")
    ap.add_argument(
        "--eval-only",
        default=None,
        metavar="CHECKPOINT",
        help="only print open-loop metrics of CHECKPOINT on --data",
    )
    ap.add_argument("--eval-stride", type=int_at_least(1, 100000), default=10,
                    help="--eval-only: every n-th log step is planned")
    ap.add_argument("--selection", type=schema_value("planner", "planner.fallback_selection"), default=None,
                    help="--eval-only: fallback selection rule override")
    ap.add_argument("--seed", type=schema_value("training", "imitation.seed"), default=None,
                    help="overrides imitation.seed")
    ap.add_argument("--max-steps", type=schema_value("training", "imitation.max_steps"), default=None,
                    help="overrides imitation.max_steps")
    ap.add_argument(
        "--time-budget-min", type=float_in(0.0, exclusive_min=True), default=None,
        help="stop (and save) after this many minutes"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an imitation.* hyper-parameter (JSON value), e.g. --set batch_size=32",
    )
    ap.add_argument("--workers", type=int_at_least(0, 256), default=2,
                    help="processes building the feature cache")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/last")
    ap.add_argument("--init-from", default=None, help="start from this checkpoint's weights (fine-tuning)")
    ap.add_argument(
        "--export-to", default=None, help="write the final checkpoint here, float16 weights (shipped form)"
    )
    ap.add_argument("--skip-bad", action="store_true",
                    help="use only the clips the simulator accepts, listing the refused ones (default: list "
                         "them and stop before any training)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _overrides(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict:
    """imitation.* overrides from --set KEY=VALUE (JSON values, else strings), --seed, --max-steps."""
    overrides = {}
    for kv in args.set:
        if "=" not in kv:
            ap.error(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        try:
            overrides[k] = json.loads(v)
        except json.JSONDecodeError:
            overrides[k] = v
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    return overrides


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    from rad2_core.config import load_merged
    from rad2_training.imitation import evaluate_open_loop, train

    params = load_merged()

    def accepted(d: Path, view_root: Path) -> Path:
        """``d``, or with --skip-bad a view of its accepted clips; an argparse error listing the refused
        clips otherwise."""
        from bev_warp_sim.preflight import RefusedClipsError, accepted_view, check_splits
        from bev_warp_sim.simulator import Simulator

        try:
            checked = check_splits([d], Simulator(params), skip_bad=args.skip_bad,
                                   progress=not args.no_progress)[0]
        except RefusedClipsError as exc:
            ap.error(f"--data: {exc}")
        if not checked.refused:
            return d
        for r in checked.refused:
            print(f"skipping refused clip {r}")
        return accepted_view(checked, view_root)

    if args.eval_only:
        for d in args.data:
            d = accepted(Path(d), Path(tempfile.mkdtemp(prefix="rad2_il_eval_")))
            res = evaluate_open_loop(
                Path(args.eval_only).resolve(),
                d,
                params,
                args.eval_stride,
                selection=args.selection,
                progress=not args.no_progress,
            )
            print(f"{d}: " + "  ".join(f"{k} {v:.3f}" for k, v in res.items()))
        return 0
    if args.out is None or len(args.data) != 1:
        ap.error("training needs --out and exactly one --data directory")

    overrides = _overrides(args, ap)
    data = Path(args.data[0])
    if not (data / "index.json").is_file():
        ap.error(f"--data {data}: no index.json (not a dataset directory)")
    data = accepted(data, Path(args.out) / "accepted_data")
    command = shlex.join(["rad2", "train", "il", *argv])
    train(
        data,
        args.out,
        params,
        overrides=overrides,
        resume=args.resume,
        workers=args.workers,
        progress=not args.no_progress,
        command=command,
        time_budget_s=args.time_budget_min * 60 if args.time_budget_min else None,
        init_from=args.init_from,
    )
    final = Path(args.out) / "final"
    print(f"final checkpoint: {final}")
    if args.export_to:
        import torch
        from rad2_planner.networks import PlannerModel

        PlannerModel.load(final).save(args.export_to, dtype=torch.float16)
        print(f"exported (float16 weights) to {args.export_to}")
    return 0

