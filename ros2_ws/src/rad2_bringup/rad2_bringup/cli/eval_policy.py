"""Evaluate policies closed-loop in the BEV-Warp simulator on dataset splits.

Prints the paper-layout table (safety columns from the safety split, efficiency columns from the
efficiency split) and a table of every metric per split, writes JSON and renders GIFs of the worst
clips of each split (rad2_evaluation.evaluate) and a summary figure per split (summary_<split>.png).

Every clip is checked before the first rollout, as the simulator would check it: refused clips are
listed with their reasons and the run stops (exit 2), or with --skip-bad is driven without them and
the tables and results.json name them. Each finished chunk of clips is written to <out>/episodes.jsonl
at once; --resume continues an interrupted run in <out> (the same settings; what is done is not driven
again) and gives the table the uninterrupted run would have.

examples:
  rad2 eval policy --policy expert idm constant_velocity \\
      --split data/eval_safety data/eval_efficiency --out runs/eval
  rad2 eval policy --policy rad2 --checkpoint checkpoints/rad2_il --split data/eval_safety --max-clips 20
  rad2 eval policy --policy rad2 --split data/eval_safety --out runs/eval --resume --skip-bad
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rad2_bringup.cli.common import dataset_dirs, verb_parser


def _parser() -> argparse.ArgumentParser:
    from bev_warp_sim.reference_policies import POLICIES
    from rad2_core.cli_args import int_at_least, schema_value

    ap = verb_parser("eval policy", __doc__)
    ap.add_argument("--policy", nargs="+", default=["expert"], choices=sorted(POLICIES),
                    help="policies to evaluate (default: expert)")
    ap.add_argument("--split", nargs="+", default=["data/eval_safety", "data/eval_efficiency"],
                    help="dataset directories (default: the two bundled evaluation sets)")
    ap.add_argument("--out", default="runs/eval", help="output directory for results.json and GIFs")
    ap.add_argument("--max-clips", type=int_at_least(1), default=None,
                    help="evaluate only the first N clips per split")
    ap.add_argument("--batch-size", type=schema_value("sim", "evaluation.batch_size"), default=None,
                    help="clips stepped together (evaluation.batch_size)")
    ap.add_argument("--h-reuse", type=schema_value("sim", "evaluation.h_reuse"), default=None,
                    help="replanning period in steps (evaluation.h_reuse)")
    ap.add_argument("--reactive", action="store_true", help="IDM-reactive agents instead of log replay")
    ap.add_argument("--gifs", type=schema_value("sim", "evaluation.worst_clips_gif"), default=None,
                    help="worst clips to render per split (evaluation.worst_clips_gif)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory for the rad2 policy")
    ap.add_argument("--backend", type=schema_value("planner", "planner.backend"), default=None,
                    help="network runtime of the rad2 policy (default: planner.backend)")
    ap.add_argument("--openvino-precision", type=schema_value("planner", "runtime.openvino.precision"),
                    default=None, help="f32 | bf16: runtime.openvino.precision of --backend openvino")
    ap.add_argument("--no-traffic-rules", action="store_true",
                    help="rad2 without its traffic-signal rule layer (traffic_rules.enabled false; "
                    "--workers 0)")
    ap.add_argument("--workers", type=int_at_least(0, 4096), default=0,
                    help="collect the rollouts in N Ray workers (rollout.* in params/training.yaml; 0: this "
                         "process)")
    ap.add_argument("--seed", type=schema_value("training", "rollout.seed"), default=0,
                    help="evaluation seed: the learned policy's noise (reference policies are deterministic)")
    ap.add_argument("--skip-bad", action="store_true",
                    help="drive the clips the simulator accepts and report the refused ones (default: list "
                         "them and stop before any rollout)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --out from its episodes.jsonl (same settings; finished clips "
                         "are not driven again)")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    from rad2_core.config import ResourceNotFoundError, load_all

    files = load_all()
    backend = args.backend or files["planner"]["planner"]["backend"]
    if args.openvino_precision is not None and backend != "openvino":
        ap.error(f"--openvino-precision: only with the openvino backend (--backend or planner.backend; "
                 f"got {backend})")
    from bev_warp_sim.preflight import RefusedClipsError
    from rad2_evaluation.episode_log import EPISODES_FILE, SettingsMismatch
    from rad2_evaluation.evaluate import evaluate_policies, write_evaluation
    from rad2_planner.networks.model import CheckpointError
    from rich.console import Console

    if args.reactive:
        files["sim"]["sim"]["reactive_agents"] = True
    splits = [str(d) for d in dataset_dirs(ap, "--split", args.split)]
    if args.no_traffic_rules and args.workers:
        ap.error("--no-traffic-rules: only with --workers 0 (the workers load params/planner.yaml as it is)")
    if args.resume and not (Path(args.out) / EPISODES_FILE).is_file():
        ap.error(f"--resume: {args.out} holds no {EPISODES_FILE} (nothing to resume)")
    console = Console(width=max(Console().width, 160))
    try:
        evals = evaluate_policies(args.policy, splits, files, console, workers=args.workers,
                                  checkpoint=args.checkpoint, traffic_rules=not args.no_traffic_rules,
                                  max_clips=args.max_clips, batch_size=args.batch_size, h_reuse=args.h_reuse,
                                  seed=args.seed, progress=not args.no_progress,
                                  backend=args.backend, runtime_overrides=(
                                      {"openvino": {"precision": args.openvino_precision}}
                                      if args.openvino_precision else None),
                                  out=args.out, resume=args.resume, skip_bad=args.skip_bad,
                                  keep_worst=args.gifs)
    except (CheckpointError, ResourceNotFoundError) as exc:
        ap.error(f"--checkpoint: {exc}")
    except (RefusedClipsError, SettingsMismatch) as exc:
        ap.error(str(exc))
    write_evaluation(evals, files["sim"], Path(args.out), console, args.gifs, progress=not args.no_progress)
    return 0
