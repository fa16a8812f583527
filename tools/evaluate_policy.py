#!/usr/bin/env python3
"""Evaluate policies closed-loop in the BEV-Warp simulator on dataset splits.

Prints the paper-layout table (safety columns from the safety split, efficiency columns from the
efficiency split) and a table of every metric per split, writes JSON and renders GIFs of the worst
clips of each split.

  evaluate_policy.py --policy expert idm constant_velocity \\
      --split data/eval_safety data/eval_efficiency --out runs/eval
  evaluate_policy.py --policy rad2 --checkpoint checkpoints/rad2_il --split data/eval_safety --max-clips 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    from bev_warp_sim.reference_policies import POLICIES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", nargs="+", default=["expert"], choices=sorted(POLICIES),
                    help="policies to evaluate (default: expert)")
    ap.add_argument("--split", nargs="+", default=["data/eval_safety", "data/eval_efficiency"],
                    help="dataset directories (default: the two bundled evaluation sets)")
    ap.add_argument("--out", default="runs/eval", help="output directory for results.json and GIFs")
    ap.add_argument("--max-clips", type=int, default=None, help="evaluate only the first N clips per split")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="clips stepped together (evaluation.batch_size)")
    ap.add_argument("--h-reuse", type=int, default=None,
                    help="replanning period in steps (evaluation.h_reuse)")
    ap.add_argument("--reactive", action="store_true", help="IDM-reactive agents instead of log replay")
    ap.add_argument("--gifs", type=int, default=None,
                    help="worst clips to render per split (evaluation.worst_clips_gif)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory for the rad2 policy")
    ap.add_argument("--no-traffic-rules", action="store_true",
                    help="rad2 without its traffic-signal rule layer (traffic_rules.enabled false; "
                    "--workers 0)")
    ap.add_argument("--workers", type=int, default=0,
                    help="collect the rollouts in N Ray workers (rollout.* in params/training.yaml; 0: this "
                         "process)")
    ap.add_argument("--seed", type=int, default=0,
                    help="evaluation seed: the learned policy's noise (reference policies are deterministic)")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = ap.parse_args(argv)

    from bev_warp_sim.evaluate import (
        evaluate_split,
        full_table,
        make_decider,
        markdown_tables,
        paper_table,
        render_worst,
        write_json,
    )
    from rad2_planner.clip import read_index
    from rad2_planner.config import load_params
    from rich.console import Console

    params = load_params("sim")
    if args.reactive:
        params["sim"]["reactive_agents"] = True
    for split in args.split:
        if not (Path(split) / "index.json").is_file():
            ap.error(f"--split: {split} is not a dataset directory (no index.json)")
    kwargs = {"checkpoint_dir": args.checkpoint} if args.checkpoint else {}
    if args.no_traffic_rules:
        if args.workers:
            ap.error("--no-traffic-rules: only with --workers 0 (the workers load params/planner.yaml "
                     "as it is)")
        kwargs["traffic_rules"] = False
    console = Console(width=max(Console().width, 160))
    evals = []
    if args.workers < 0:
        ap.error(f"--workers: must be >= 0, got {args.workers}")
    for policy in args.policy:
        pool, decider, runner = None, None, None
        if args.workers:
            from rad2_rl.workers import PolicySpec, RolloutPool

            threads = int(load_params("training")["rollout"]["threads_per_worker"])
            spec = PolicySpec(name=policy, checkpoint_dir=args.checkpoint, threads=threads)
            pool = RolloutPool(spec, num_workers=args.workers, sim_params=params)
            runner = pool.run
        else:
            from rad2_planner.networks.model import CheckpointError

            try:
                decider = make_decider(policy, **(kwargs if policy == "rad2" else {}))  # loaded once
            except CheckpointError as exc:
                ap.error(f"--checkpoint: {exc}")
        for split in args.split:
            t0 = time.perf_counter()
            batch = args.batch_size
            if args.workers and batch is None:  # several chunks per worker keep them all busy to the end
                n = min(len(read_index(split)["clips"]), args.max_clips or 1 << 30)
                batch = max(1, min(int(params["evaluation"]["batch_size"]), -(-n // (4 * args.workers))))
            evals.append(evaluate_split(policy, split, params, max_clips=args.max_clips,
                                        batch_size=batch, h_reuse=args.h_reuse,
                                        progress=not args.no_progress, decider=decider, seed=args.seed,
                                        runner=runner))
            st = evals[-1].stats
            wall = time.perf_counter() - t0
            sec = {k: f"{v:.1f} s" for k, v in st.seconds.items()}
            console.print(f"{policy} @ {Path(split).name}: {st.env_steps} env steps, {st.decisions} "
                          f"decisions in {wall:.1f} s wall ({st.env_steps / wall:.0f} steps/s); stage "
                          f"seconds summed over workers: plan {sec['plan']}, observe {sec['observe']}, "
                          f"track {sec['commit']}, step {sec['step']}")
        if pool is not None:
            pool.close()
    console.print(paper_table(evals))
    console.print(full_table(evals))
    out = Path(args.out)
    path = write_json(evals, out / "results.json")
    (out / "table.md").write_text(markdown_tables(evals) + "\n")
    n_gif = int(params["evaluation"]["worst_clips_gif"] if args.gifs is None else args.gifs)
    gifs = []
    for e in evals:
        gifs += render_worst(e, out / "gifs", n_gif, fps=float(params["evaluation"]["gif_fps"]))
    console.print(f"wrote {path}, {out / 'table.md'} and {len(gifs)} GIFs under {out / 'gifs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
