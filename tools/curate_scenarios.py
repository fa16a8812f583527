#!/usr/bin/env python3
"""Curate the RL training sets (RAD-2 §4.1): drive every pool clip closed loop with the IL generator and
a uniformly random candidate per decision, keep the safety-oriented clips with elevated collision risk
and the efficiency-oriented ones with poor progress, and write two datasets disjoint from the
evaluation sets (checked), a summary table, summary.json and a scatter plot.

  curate_scenarios.py                                  # data/train -> out/rl_train/{rl_safety,rl_efficiency}
  curate_scenarios.py --pool data/train out/train_large --workers 2 --out out/rl_train
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", nargs="+", default=["data/train"],
                    help="dataset directories of candidate clips")
    ap.add_argument("--eval", nargs="+", default=["data/eval_safety", "data/eval_efficiency"],
                    help="held-out evaluation sets the curated sets must not overlap")
    ap.add_argument("--out", default="out/rl_train",
                    help="output directory (rl_safety/, rl_efficiency/, summary.json, curation.png)")
    ap.add_argument("--checkpoint", default=None,
                    help="generator checkpoint (default: planner.checkpoint_dir)")
    ap.add_argument("--workers", type=int, default=0, help="Ray workers (0: this process)")
    ap.add_argument("--rollouts-per-clip", type=int, default=None, help="curation.rollouts_per_clip")
    ap.add_argument("--max-clips", type=int, default=None, help="use only the first N pool clips")
    ap.add_argument("--seed", type=int, default=None, help="rollout seed (rollout.seed)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    from rad2_planner.clip import load_dataset
    from rad2_planner.config import load_params
    from rad2_rl.curation import CurationError, composition, judge, overlapping, write_sets
    from rad2_rl.workers import PolicySpec, RolloutPool
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    console = Console(width=max(Console().width, 120))
    training = load_params("training")
    cfg, rcfg = training["curation"], training["rollout"]
    group = int(args.rollouts_per_clip or cfg["rollouts_per_clip"])
    seed = int(rcfg["seed"] if args.seed is None else args.seed)
    for d in args.pool + args.eval:
        if not (Path(d) / "index.json").is_file():
            ap.error(f"{d} is not a dataset directory (no index.json)")
    if group < 1 or args.workers < 0:
        ap.error("--rollouts-per-clip must be >= 1 and --workers >= 0")
    pool = [c for d in args.pool for c in load_dataset(d)]
    held_out = [c for d in args.eval for c in load_dataset(d)]
    clash = set(overlapping(pool, held_out))
    pool = [c for c in pool if c.clip_id not in clash][: args.max_clips]
    if not pool:
        console.print("[red]the pool holds no clips outside the evaluation sets[/red]")
        return 2
    console.print(f"pool: {len(pool)} clips ({len(clash)} dropped: also in an evaluation set); "
                  f"{group} rollouts each, h_reuse {cfg['h_reuse']}, uniformly random candidate")
    threads = int(rcfg["threads_per_worker"]) if args.workers else None
    spec = PolicySpec(name="rad2", checkpoint_dir=args.checkpoint, selection="sample",
                      distribution="uniform", threads=threads)
    kwargs = dict(batch_size=int(rcfg["batch_size"]), seed=seed, h_reuse=int(cfg["h_reuse"]))
    bar = tqdm(total=len(pool) * group, unit="rollout", desc="curation rollouts", disable=args.no_progress)
    with bar:
        if args.workers:
            with RolloutPool(spec, num_workers=args.workers) as workers:
                rollouts, stats = workers.run(pool, group, progress=bar.update, **kwargs)
        else:
            from bev_warp_sim.rollout import run_rollouts
            from bev_warp_sim.simulator import Simulator

            rollouts, stats = run_rollouts(Simulator(), spec.build(), pool, group, progress=bar.update,
                                           **kwargs)
    verdicts = judge(pool, rollouts, cfg)
    try:
        dirs = write_sets(pool, verdicts, args.out, held_out)
    except CurationError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    table = Table(title=f"Curated RL training sets ({args.out})")
    for col in ("kind", "orientation", "pool", "collided_clips", "safety", "efficiency"):
        table.add_column(col, justify="right")
    rows = composition(verdicts)
    for r in rows:
        table.add_row(*(str(r[k]) for k in ("kind", "orientation", "pool", "collided_clips", "safety",
                                           "efficiency")))
    console.print(table)
    summary = {
        "pool": args.pool, "eval": args.eval, "dropped_overlap": sorted(clash), "rollouts_per_clip": group,
        "seed": seed, "criteria": {k: cfg[k] for k in ("safety_max_min_ttc_s", "efficiency_max_mean_rho")},
        "composition": rows, "env_steps": stats.env_steps, "decisions": stats.decisions,
        "sets": {"safety": str(dirs[0]), "efficiency": str(dirs[1])},
        "clips": [v.__dict__ for v in verdicts],
    }
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    _plot(verdicts, cfg, out / "curation.png")
    n_s = sum(v.keep_safety for v in verdicts)
    n_e = sum(v.keep_efficiency for v in verdicts)
    console.print(f"wrote {dirs[0]} ({n_s} clips), {dirs[1]} ({n_e} clips), {out / 'summary.json'}, "
                  f"{out / 'curation.png'}; {stats.env_steps} env steps in {stats.wall_s:.0f} s")
    return 0


def _plot(verdicts, cfg, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    for keep, colour, label in ((0, "0.6", "not kept"), (1, "tab:red", "kept (safety)"),
                                (2, "tab:blue", "kept (efficiency)")):
        pts = [(v.min_ttc, v.mean_rho) for v in verdicts
               if (keep == 1 and v.keep_safety) or (keep == 2 and v.keep_efficiency)
               or (keep == 0 and not (v.keep_safety or v.keep_efficiency))]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=14, c=colour, label=label, alpha=0.8)
    ax.axvline(float(cfg["safety_max_min_ttc_s"]), color="tab:red", ls="--", lw=0.8)
    ax.axhline(float(cfg["efficiency_max_mean_rho"]), color="tab:blue", ls="--", lw=0.8)
    ax.set_xlabel("min TTC over the clip's rollouts (s; 0 = collision)")
    ax.set_ylabel("mean ego progress ratio ρ (capped at 1)")
    ax.set_title("RL training-set curation (IL generator, random candidate)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
