#!/usr/bin/env python3
"""RAD-2 experiments: closed-loop metrics of several planner configurations ("arms") on the held-out
sets, each cell the mean over evaluation seeds with its spread, as one Markdown table and a plot.

An arm is written ``KIND[:ARG][@M=..][@H=..]``:
- ``il:uniform`` | ``il:medoid`` | ``il:safe_medoid``: the IL generator (``--il-checkpoint``) with a
  uniformly random candidate, or the named selection rule (the discriminator is not used);
- ``ckpt:PATH``: a planner checkpoint (e.g. ``runs/rl_seed0/final``), executed candidate = argmax of its
  discriminator when it is trained, else the ``planner.fallback_selection`` rule;
- ``@M=64``: candidates per cycle (inference-time scaling, RAD-2 Table 10); ``@H=4``: replanning period
  in steps (latched execution, RAD-2 Table 5; evaluation default ``evaluation.h_reuse``).

Metrics (bev_warp_sim.metrics.aggregate): CR, AF-CR and Safety@1 on the safety split, EP-Mean and EP@1.0
on the efficiency split, comfort-violating steps on both.

    .venv/bin/python tools/rl_experiments.py --arms il:uniform il:medoid il:safe_medoid \\
        ckpt:runs/rl_seed0/final --seeds 0 1 2 --workers 2 --out out/rl_experiments
    .venv/bin/python tools/rl_experiments.py --arms il:safe_medoid@M=8 il:safe_medoid@M=128 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RULES = ("uniform", "medoid", "safe_medoid")
COLUMNS = {"safety": ("CR", "AF-CR", "Safety@1", "comfort_violation_steps"),
           "efficiency": ("EP-Mean", "EP@1.0", "CR", "comfort_violation_steps")}


@dataclass(frozen=True)
class Arm:
    label: str
    checkpoint: str
    rule: str | None  # uniform | medoid | safe_medoid | None (the checkpoint's own selection)
    m: int | None
    h_reuse: int | None


def parse_arm(text: str, il_checkpoint: str) -> Arm:
    head, *opts = text.split("@")
    kind, _, arg = head.partition(":")
    m = h = None
    for opt in opts:
        key, _, value = opt.partition("=")
        if key not in ("M", "H") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"arm {text!r}: option {opt!r} is not M=<int >= 1> or H=<int >= 1>")
        m, h = (int(value), h) if key == "M" else (m, int(value))
    if kind == "il":
        if arg not in RULES:
            raise ValueError(f"arm {text!r}: il:{arg} is not one of il:{'|il:'.join(RULES)}")
        return Arm(text, il_checkpoint, arg, m, h)
    if kind == "ckpt":
        if not (Path(arg) / "config.json").is_file():
            raise ValueError(f"arm {text!r}: {arg} is not a planner checkpoint (no config.json)")
        return Arm(text, arg, None, m, h)
    raise ValueError(f"arm {text!r}: expected il:RULE or ckpt:PATH")


def policy_spec(arm: Arm, threads: int | None):
    from rad2_rl.workers import PolicySpec

    overrides = {}
    if arm.m:
        overrides["num_candidates"] = arm.m
    if arm.rule == "uniform":
        return PolicySpec(checkpoint_dir=arm.checkpoint, selection="sample", distribution="uniform",
                          planner_overrides=overrides, threads=threads)
    if arm.rule is not None:
        overrides["fallback_selection"] = arm.rule
    return PolicySpec(checkpoint_dir=arm.checkpoint, selection="deterministic", planner_overrides=overrides,
                      threads=threads)


def evaluate_arm(arm: Arm, splits: list[str], seeds: list[int], workers: int, max_clips: int | None,
                 sim_params) -> dict[str, list[dict[str, float]]]:
    """``{split: [metrics per seed]}``."""
    from bev_warp_sim.evaluate import evaluate_split
    from bev_warp_sim.simulator import Simulator

    spec = policy_spec(arm, threads=1 if workers > 0 else None)
    pool = runner = decider = None
    if workers > 0:
        from rad2_rl.workers import RolloutPool

        pool = RolloutPool(spec, num_workers=workers)
        runner = pool.run
    else:
        decider = spec.build()
    sim = Simulator(sim_params)
    if arm.rule is not None and decider is not None:
        decider.policy.model.discriminator_trained = False  # the rule, never the discriminator
    out: dict[str, list[dict[str, float]]] = {}
    try:
        for split in splits:
            out[split] = []
            for seed in seeds:
                ev = evaluate_split("rad2", split, sim_params, max_clips=max_clips, h_reuse=arm.h_reuse,
                                    simulator=sim, decider=decider, runner=runner, seed=seed, progress=True)
                out[split].append(ev.metrics)
    finally:
        if pool is not None:
            pool.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=["il:uniform", "il:medoid", "il:safe_medoid"],
                    help="arms to evaluate (see above)")
    ap.add_argument("--il-checkpoint", default="checkpoints/rad2_il", help="generator of the il: arms")
    ap.add_argument("--splits", nargs="+", default=["data/eval_safety", "data/eval_efficiency"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                    help="evaluation seeds (>= 3 for a spread)")
    ap.add_argument("--workers", type=int, default=0, help="Ray workers per arm (0: this process)")
    ap.add_argument("--max-clips", type=int, default=None, help="first N clips of each split (quick looks)")
    ap.add_argument("--out", type=Path, default=Path("out/rl_experiments"))
    args = ap.parse_args(argv)
    if args.workers < 0:
        ap.error(f"--workers: must be >= 0, got {args.workers}")
    if args.max_clips is not None and args.max_clips < 1:
        ap.error(f"--max-clips: must be >= 1, got {args.max_clips}")

    from bev_warp_sim.evaluate import split_kind
    from rad2_planner.config import load_params
    from rad2_planner.policy import resolve_path

    try:
        arms = [parse_arm(a, str(resolve_path(args.il_checkpoint))) for a in args.arms]
    except ValueError as exc:
        ap.error(f"--arms: {exc}")
    for split in args.splits:
        if not (resolve_path(split) / "index.json").is_file():
            ap.error(f"--splits: {split} is not a dataset directory (no index.json)")
    sim_params = load_params("sim")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = {}
    for arm in arms:
        results[arm.label] = evaluate_arm(arm, [str(resolve_path(s)) for s in args.splits], args.seeds,
                                          args.workers, args.max_clips, sim_params)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))

    lines = [f"# RAD-2 experiments ({time.strftime('%Y-%m-%d %H:%M')}, {time.time() - t0:.0f} s)", "",
             f"Seeds {args.seeds}; each cell: mean ± standard deviation over the seeds"
             + (f"; first {args.max_clips} clips per split" if args.max_clips else "") + ".", ""]
    for split in args.splits:
        kind = split_kind(split)
        cols = COLUMNS.get(kind, COLUMNS["safety"])
        lines += [f"## {Path(split).name}", "", "| arm | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for label, per_split in results.items():
            runs = per_split[str(resolve_path(split))]
            cells = [f"{np.mean([r[c] for r in runs]):.3f} ± {np.std([r[c] for r in runs]):.3f}"
                     for c in cols]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    (args.out / "experiments.md").write_text("\n".join(lines))
    _plot(results, args.splits, args.out / "experiments.png", resolve_path)
    print("\n".join(lines))
    print(f"wrote {args.out / 'experiments.md'}, experiments.png and results.json")
    return 0


def _plot(results, splits, path: Path, resolve) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from bev_warp_sim.evaluate import split_kind

    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4), squeeze=False)
    labels = list(results)
    for ax, split in zip(axes[0], splits):
        metric = "EP-Mean" if split_kind(split) == "efficiency" else "CR"
        vals = [[r[metric] for r in results[a][str(resolve(split))]] for a in labels]
        ax.bar(range(len(labels)), [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], capsize=4)
        ax.set_xticks(range(len(labels)), labels, rotation=25, ha="right", fontsize=8)
        ax.set(title=f"{Path(split).name}: {metric}", ylabel=metric)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
