"""Summarise planning-cycle latency from rad2_msgs/PlanningDiagnostics: a live run or a bag.

For every stage the planner reports (preprocess, encode, denoise_0..K-1, score, select, publish, ...)
plus the whole cycle (``total``), the sum of the denoising steps (``denoise_all``) and the end-to-end
latency (input stamp -> publication): count, mean, p50, p90, p99 and max in milliseconds, the
deadline-miss rate (cycles flagged ``deadline_missed``, and from the node's own cumulative counters,
which also count cycles whose diagnostics were dropped), fallbacks and rejected inputs. Prints a rich
table; optionally writes JSON and a histogram PNG.

examples:
  rad2 eval latency-report --bag runs/demo/bag          # from a recorded bag
  rad2 eval latency-report --duration 20 --png out/latency.png   # live: subscribe for 20 s
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rad2_bringup.cli.common import verb_parser

DEFAULT_TOPIC = "/planning/diagnostics"  # live mode


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least, schema_value

    parser = verb_parser("eval latency-report", __doc__)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--bag", help="rosbag2 directory holding PlanningDiagnostics")
    src.add_argument("--duration", type=float_in(0.0, 86400.0, exclusive_min=True),
                     help="live mode: subscribe for this many seconds")
    parser.add_argument("--topic",
                        help=f"diagnostics topic (live default {DEFAULT_TOPIC}; bag: all of that type)")
    parser.add_argument("--domain-id", type=int_at_least(0, 232),
                        help="ROS_DOMAIN_ID for live mode (default: environment)")
    parser.add_argument("--deadline-ms", type=schema_value("planner", "planner.deadline_ms"), default=None,
                        help="deadline drawn in the plot (default: planner.deadline_ms, params/planner.yaml)")
    parser.add_argument("--json", help="write the summary as JSON here")
    parser.add_argument("--png", help="write the latency histogram here")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from rad2_core.config import load_params
    from rad2_datasets import bags
    from rad2_ros.latency import (
        jsonable,
        plot_histograms,
        print_tables,
        records_from_bag,
        summarise,
    )

    deadline = (args.deadline_ms if args.deadline_ms is not None
                else float(load_params("planner")["planner"]["deadline_ms"]))
    try:
        if args.bag:
            records = records_from_bag(args.bag, args.topic)
            title = f"latency from {args.bag}"
        else:
            if args.duration <= 0:
                raise ValueError("--duration must be positive")
            from rad2_bringup.latency_live import records_live

            records = records_live(args.topic or DEFAULT_TOPIC, args.duration, args.domain_id)
            title = f"latency, live {args.duration:.0f} s on {args.topic or DEFAULT_TOPIC}"
    except (bags.BagError, RuntimeError, ValueError) as exc:
        print(f"rad2 eval latency-report: error: {exc}", file=sys.stderr)
        return 2
    if not records:
        print("rad2 eval latency-report: error: no PlanningDiagnostics messages received", file=sys.stderr)
        return 3
    summary = summarise(records)
    print_tables(summary, deadline, title)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = jsonable({"deadline_ms": deadline, "nodes": summary})
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.png:
        plot_histograms(records, args.png, deadline, title)
        print(f"histogram: {args.png}")
    return 0

