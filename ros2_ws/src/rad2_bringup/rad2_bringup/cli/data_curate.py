"""Curate the RL training sets (RAD-2 §4.1): drive every pool clip closed loop with the IL generator and
a uniformly random candidate per decision, keep the safety-oriented clips with elevated collision risk
and the efficiency-oriented ones with poor progress, and write two datasets disjoint from the
evaluation sets (checked), a summary table, summary.json and a scatter plot (rad2_training.curation.curate).

examples:
  rad2 data curate                          # data/train -> out/rl_train/{rl_safety,rl_efficiency}
  rad2 data curate --pool data/train out/train_large --workers 2 --out out/rl_train
"""

from __future__ import annotations

from rad2_bringup.cli.common import dataset_dirs, verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least, schema_value

    ap = verb_parser("data curate", __doc__)
    ap.add_argument("--pool", nargs="+", default=["data/train"],
                    help="dataset directories of candidate clips")
    ap.add_argument("--eval", nargs="+", default=["data/eval_safety", "data/eval_efficiency"],
                    help="held-out evaluation sets the curated sets must not overlap")
    ap.add_argument("--out", default="out/rl_train",
                    help="output directory (rl_safety/, rl_efficiency/, summary.json, curation.png)")
    ap.add_argument("--checkpoint", default=None,
                    help="generator checkpoint (default: planner.checkpoint_dir)")
    ap.add_argument("--workers", type=int_at_least(0, 4096), default=0, help="Ray workers (0: this process)")
    ap.add_argument("--rollouts-per-clip", type=schema_value("training", "curation.rollouts_per_clip"),
                    default=None, help="curation.rollouts_per_clip")
    ap.add_argument("--max-clips", type=int_at_least(1), default=None, help="use only the first N pool clips")
    ap.add_argument("--seed", type=schema_value("training", "rollout.seed"), default=None,
                    help="rollout seed (rollout.seed)")
    ap.add_argument("--skip-bad", action="store_true",
                    help="curate without the pool clips the simulator refuses (listed, and in summary.json; "
                         "default: list them and stop before any rollout)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    pool = [str(d) for d in dataset_dirs(ap, "--pool", args.pool)]
    held_out = [str(d) for d in dataset_dirs(ap, "--eval", args.eval)]
    from bev_warp_sim.preflight import RefusedClipsError
    from rad2_core.config import load_merged
    from rad2_training.curation import curate
    from rich.console import Console

    try:
        return curate(pool, held_out, args.out, load_merged(), checkpoint=args.checkpoint,
                      workers=args.workers, rollouts_per_clip=args.rollouts_per_clip,
                      max_clips=args.max_clips, seed=args.seed,
                      progress=not args.no_progress, console=Console(width=max(Console().width, 120)),
                      skip_bad=args.skip_bad)
    except RefusedClipsError as exc:
        ap.error(f"--pool: {exc}")
