"""Planner node in a ROS 2 graph: input -> trajectory latency over DDS (rad2_bringup.graph_bench).

Starts the planner node of launch/graphs.yaml as its own process (wall clock, the vehicle's parameter
files), plays BEV features + scene tokens of consecutive log steps of real clips into it at 10 Hz,
each stamped when published, and times the arrival of the trajectory planned from each stamp. Prints
p50/p90/p99/max of input -> trajectory and of the node's own stages, the machine and the load; writes
JSON and a histogram PNG.

examples:
  rad2 bench graph                          # 300 cycles, ~45 s
  rad2 bench graph --cycles 600 --no-recorder --out out/bench_graph
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rad2_bringup.cli.common import in_ros_environment, verb_parser


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    ap = verb_parser("bench graph", __doc__)
    ap.add_argument("--data", default="data/eval_efficiency", help="dataset whose clips give the inputs")
    ap.add_argument("--cycles", type=int_at_least(1), default=300,
                    help="timed planning cycles (after the warm-up)")
    ap.add_argument("--warmup", type=int_at_least(0), default=20, help="untimed cycles first")
    ap.add_argument("--rate-hz", type=float_in(0.5, 100.0), default=10.0, help="input rate")
    ap.add_argument("--no-recorder", action="store_true",
                    help="do not subscribe to the candidate set and the markers (they are then not built)")
    ap.add_argument("--domain-id", type=int_at_least(0, 232), default=None,
                    help="ROS_DOMAIN_ID (default: a free one)")
    ap.add_argument("--out", type=Path, default=Path("out") / "bench_graph",
                    help="writes <out>.json and <out>.png")
    return ap


def main(argv: list[str]) -> int:
    argv = list(argv)
    args = _parser().parse_args(argv)
    from rad2_core.config import ResourceNotFoundError, resource_path

    try:
        resource_path(args.data)
    except ResourceNotFoundError as exc:
        _parser().error(f"--data: {exc}")
    from rad2_ros.rosenv import RosEnvironmentError, unique_domain_id

    domain = unique_domain_id() if args.domain_id is None else args.domain_id
    try:
        in_ros_environment("bench graph", argv + ["--domain-id", str(domain)] * (args.domain_id is None),
                           domain)
    except RosEnvironmentError as exc:
        print(f"rad2 bench graph: error: {exc}", file=sys.stderr)
        return 2
    from rad2_evaluation.benchmarking import plot_graph_results, print_graph_results

    from rad2_bringup.bringup import BringupError
    from rad2_bringup.graph_bench import run_graph_benchmark

    try:
        res = run_graph_benchmark(data=args.data, cycles=args.cycles, warmup=args.warmup,
                                  rate_hz=args.rate_hz, subscribe_all=not args.no_recorder, domain_id=domain,
                                  log_dir=Path(str(args.out) + "_logs"))
    except BringupError as exc:  # the planner node did not come up or died: say why, no traceback
        print(f"rad2 bench graph: error: planner node: {exc}", file=sys.stderr)
        return 1
    print_graph_results(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(args.out) + ".json").write_text(json.dumps(res, indent=1))
    plot_graph_results(res, str(args.out) + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")
    return 0 if res["planned"] else 1

