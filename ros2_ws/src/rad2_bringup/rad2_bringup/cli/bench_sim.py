"""Benchmark the BEV-Warp simulator: warp time per frame (OpenCV warpAffine vs torch grid_sample) and
environment steps per second without a planner (single rollout and batched).

An environment step = observe (warped BEV + transformed tokens) + one latched control step (bicycle,
collision, TTC, off-road) with a fixed control sequence re-latched (one batched iLQR-free commit) every
``latch.h_reuse`` steps; no planner and no iLQR run, so the figure is the simulator's own cost.

The benchmark itself is rad2_evaluation.benchmarks.sim.

examples:
  rad2 bench sim                       # first clip of data/eval_efficiency, B = 1, 16, 64
  rad2 bench sim --dataset data/eval_safety --batch 1 16 --steps 40
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("bench sim", __doc__)
    ap.add_argument("--dataset", default=None,
                    help="dataset directory (default: first clip of data/eval_efficiency)")
    ap.add_argument("--batch", nargs="+", type=int_at_least(1, 1024), default=[1, 16, 64], help="batch sizes")
    ap.add_argument("--steps", type=int_at_least(1, 100000), default=60, help="environment steps per rollout")
    ap.add_argument("--warp-repeats", type=int_at_least(1), default=20,
                    help="repetitions of each warp timing")
    ap.add_argument("--warp-only", action="store_true", help="time the warp only (no environment steps)")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the figures as JSON (rad2 bench all)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from rad2_core.cli_args import schema_choices
    from rad2_core.config import load_merged
    from rad2_evaluation.benchmarks.sim import run_sim_benchmark

    run_sim_benchmark(load_merged(), schema_choices("sim", "sim.warp_backend"), args.batch,
                      dataset=args.dataset, steps=args.steps, warp_repeats=args.warp_repeats,
                      warp_only=args.warp_only, json_path=args.json, progress=not args.no_progress)
    return 0

