"""One command for the safety-layer table: RAD-2 without the layer, with rejection sampling, with
candidate selection and with self-correction (params/planner.yaml ``safety_layer``), closed loop on the
evaluation splits.

For every mode, split and evaluation seed the planner drives the clips (bev_warp_sim.rollout, the
deterministic deployment selection, evaluation.h_reuse of params/sim.yaml; --max-clips N takes N clips
spread evenly over each split's index, which lists the clips kind by kind, so every scenario kind is
represented). The table takes CR, AF-CR
and Safety@1 from the safety split and EP-Mean from the efficiency split (the paper's layout; the
full per-split metrics are in the JSON), mean ± standard deviation over the seeds, plus the safety
layer's corrections per planning cycle (resampling rounds, or changed selections) and the planning
latency of single-observation cycles (B = 1, M candidates) on this CPU with the planner's backend
(ONNX Runtime by default), measured on observations the planner met in the closed-loop runs, without a
round budget and with safety_layer.round_budget_ms (the closed-loop runs use no budget, so their
metrics do not depend on the machine's speed).

Self-correction uses safety_layer.correction_checkpoint (rad2 train self-correction), which must share
its scene encoder with the planner (--checkpoint): the shipped one belongs to checkpoints/rad2_rl.

Every picked clip is checked before the first rollout, as the simulator would check it: refused clips
are listed with their reasons and the run stops (exit 2), or with --skip-bad runs without them and the
table and results.json name them.

Writes --out/results.json, --out/table.md and --out/safety_layer.png. The work is done by
rad2_evaluation.safety_layer.evaluate_safety_layer.

examples (the first about 10 minutes on 2 shared cores; then the full splits, three seeds; then one
process per core, merged into one table):
  rad2 eval safety-layer --max-clips 12 --seeds 0 --checkpoint checkpoints/rad2_rl
  rad2 eval safety-layer --seeds 0 1 2
  rad2 eval safety-layer --modes off self_correction --out out/sl_a &
  rad2 eval safety-layer --modes rejection_sampling candidate_selection --out out/sl_b
  rad2 eval safety-layer --merge out/sl_a out/sl_b --out out/safety_layer
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rad2_bringup.cli.common import dataset_dirs, verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import int_at_least, schema_choices, schema_value

    ap = verb_parser("eval safety-layer", __doc__)
    ap.add_argument(
        "--splits",
        nargs="+",
        default=["data/eval_safety", "data/eval_efficiency"],
        help="dataset directories (a name with 'safety' / 'efficiency' picks the table's columns)",
    )
    ap.add_argument(
        "--seeds", nargs="+", type=schema_value("training", "rollout.seed"), default=[0, 1, 2],
        help="evaluation seeds (planner noise)"
    )
    ap.add_argument(
        "--max-clips",
        type=int_at_least(1),
        default=None,
        help="N clips of each split, spread evenly over its scenario kinds (default: all)",
    )
    modes = schema_choices("planner", "safety_layer.mode")
    ap.add_argument("--modes", nargs="+", default=modes, choices=modes, help="safety_layer.mode values")
    ap.add_argument(
        "--threshold", type=schema_value("planner", "safety_layer.threshold"), default=None,
        help="safety_layer.threshold (default: planner.yaml)"
    )
    ap.add_argument(
        "--max-rounds", type=schema_value("planner", "safety_layer.max_rounds"), default=None,
        help="safety_layer.max_rounds (default: planner.yaml)"
    )
    ap.add_argument(
        "--critic", default=None, help="critic checkpoint (default: safety_layer.critic_checkpoint)"
    )
    ap.add_argument("--checkpoint", default=None,
                    help="planner checkpoint (default: planner.checkpoint_dir; the shipped self-correcting "
                         "generator belongs to checkpoints/rad2_rl)")
    ap.add_argument("--correction", default=None,
                    help="self-correcting generator (default: safety_layer.correction_checkpoint)")
    ap.add_argument("--num-candidates", type=schema_value("planner", "planner.num_candidates"),
                    default=None, help="M (default: planner.num_candidates)")
    ap.add_argument(
        "--backend",
        type=schema_value("planner", "planner.backend"),
        default="onnxruntime",
        help="planner backend (default: onnxruntime, the CPU deployment runtime)",
    )
    ap.add_argument(
        "--batch-size", type=schema_value("sim", "evaluation.batch_size"), default=None,
        help="clips stepped together (evaluation.batch_size)"
    )
    ap.add_argument(
        "--latency-cycles",
        type=int_at_least(0, 100000),
        default=120,
        help="single-observation cycles timed per mode (0: no latency measurement)",
    )
    ap.add_argument("--out", default="out/safety_layer", help="output directory")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="only merge the results.json of runs split by --modes (one per core) into --out; "
                         "a mode found in several keeps the last directory's runs")
    ap.add_argument("--skip-bad", action="store_true",
                    help="run without the clips the simulator refuses, naming them in the table (default: "
                         "list them and stop before any rollout)")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.merge:
        from rad2_core.cli_args import schema_choices
        from rad2_evaluation.safety_layer import merge_results

        for d in args.merge:
            if not (Path(d) / "results.json").is_file():
                ap.error(f"--merge: {d} holds no results.json")
        try:
            merge_results(args.merge, args.out, schema_choices("planner", "safety_layer.mode"))
        except ValueError as exc:
            ap.error(str(exc))
        return 0
    splits = [str(d) for d in dataset_dirs(ap, "--splits", args.splits)]

    from rad2_core.config import load_merged
    from rad2_evaluation.safety_layer import evaluate_safety_layer, safety_layers

    params = load_merged()
    if args.checkpoint:
        params["planner"]["checkpoint_dir"] = str(args.checkpoint)
    try:
        layers = safety_layers(args.modes, params, args.threshold, args.max_rounds, args.critic,
                               args.correction)
    except ValueError as exc:
        ap.error(str(exc))
    from bev_warp_sim.preflight import RefusedClipsError

    command = shlex.join(["rad2", "eval", "safety-layer", *argv])
    try:
        evaluate_safety_layer(splits, args.seeds, layers, params, out=args.out, command=command,
                              max_clips=args.max_clips, num_candidates=args.num_candidates,
                              backend=args.backend, batch_size=args.batch_size,
                              latency_cycles=args.latency_cycles, progress=not args.no_progress,
                              skip_bad=args.skip_bad)
    except RefusedClipsError as exc:
        ap.error(str(exc))
    return 0

