"""Benchmark the batched iLQR tracker against CasADi + IPOPT on the same tracking problems.

Both solvers get the same model (midpoint bicycle step of rad2_core.bicycle), the same
Eq. 10 cost, horizon, input box and speed/steering bounds, and the same initial guess. Problems are
straight, curved, stop-and-go and lane-change plans (params/controller.yaml, params/vehicle.yaml)
with random initial offsets. Reported: solve time median / p99 (single problem cold, single problem
warm-started from the previous step's solution, batch of 64 in one call) and the final cost relative
to IPOPT's (IPOPT solved to tolerance 1e-9 on every problem).

Run single-core figures with ``taskset -c 0 rad2 bench ilqr``; the load average is printed with them
(timings on a busy machine are not comparable). ``--kernel`` forces the iLQR kernel (default: the
per-problem one for small batches, the batched numpy one otherwise).
The benchmark itself is rad2_evaluation.benchmarks.ilqr.

examples:
  rad2 bench ilqr                              # also writes docs/figures/bench_ilqr.png
  rad2 bench ilqr --no-ipopt --batch 64 --json out/ilqr.json --png out/ilqr.png
"""

from __future__ import annotations

from pathlib import Path

from rad2_bringup.cli.common import verb_parser


def main(argv: list[str]) -> int:
    from rad2_core.cli_args import int_at_least

    ap = verb_parser("bench ilqr", __doc__)
    ap.add_argument("--problems", type=int_at_least(1, 100000), default=40,
                    help="number of tracking problems (default 40)")
    ap.add_argument("--repeats", type=int_at_least(1), default=5,
                    help="timing repeats per iLQR problem (default 5)")
    ap.add_argument("--batch", type=int_at_least(1, 4096), default=64,
                    help="batch size of the batched timing (default 64)")
    ap.add_argument("--batch-repeats", type=int_at_least(1), default=20,
                    help="timing repeats of the batch (default 20)")
    ap.add_argument("--seed", type=int_at_least(0, 2**32 - 1), default=0)
    ap.add_argument(
        "--png",
        type=Path,
        default=Path("docs") / "figures" / "bench_ilqr.png",
        help="where to save the figure (default docs/figures/bench_ilqr.png, the README's)",
    )
    ap.add_argument("--no-ipopt", action="store_true", help="skip the CasADi/IPOPT side")
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the timings as JSON (rad2 bench all)")
    ap.add_argument(
        "--kernel", choices=("auto", "numpy", "small"), default="auto", help="iLQR kernel (default auto)"
    )
    args = ap.parse_args(argv)
    from rad2_core.config import load_all
    from rad2_evaluation.benchmarks.ilqr import run_benchmark

    run_benchmark(load_all(("controller", "vehicle", "planner")), args.problems, args.repeats, args.batch,
                  args.batch_repeats, args.seed, args.png, ipopt=not args.no_ipopt, json_path=args.json,
                  kernel=args.kernel)
    return 0

