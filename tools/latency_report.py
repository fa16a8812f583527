#!/usr/bin/env python3
"""Summarise planning-cycle latency from rad2_msgs/PlanningDiagnostics: a live run or a bag.

For every stage the planner reports (preprocess, encode, denoise_0..K-1, score, select, publish, ...)
plus the whole cycle (``total``), the sum of the denoising steps (``denoise_all``) and the end-to-end
latency (input stamp -> publication): count, mean, p50, p90, p99 and max in milliseconds, the
deadline-miss rate (cycles flagged ``deadline_missed``, and from the node's own cumulative counters,
which also count cycles whose diagnostics were dropped), fallbacks and rejected inputs. Prints a rich
table; optionally writes JSON and a histogram PNG.

  latency_report.py --bag runs/replay_bag            # from a recorded bag
  latency_report.py --duration 20                    # live: subscribe for 20 s (needs the colcon build)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rad2_planner import bags
from rad2_planner.latency import (
    default_deadline,
    diagnostics_record,
    plot_histograms,
    print_tables,
    records_from_bag,
    summarise,
)

ROOT = Path(__file__).resolve().parents[1]


DEFAULT_TOPIC = "/planning/diagnostics"


def records_live(topic: str, duration_s: float, domain_id: int | None = None) -> list[dict[str, Any]]:
    """Subscribe to ``topic`` for ``duration_s`` seconds (rclpy; needs the built rad2_msgs)."""
    import os

    if domain_id is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    try:
        from rad2_msgs.msg import PlanningDiagnostics
    except ImportError as exc:
        raise RuntimeError("rad2_msgs is not importable: build the workspace (tools/bootstrap.sh) and "
                           "source tools/env.sh") from exc
    from rich.progress import Progress

    records: list[dict[str, Any]] = []
    rclpy.init()
    node = rclpy.create_node("latency_report")
    try:
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(
            PlanningDiagnostics, topic,
            lambda msg: records.append(diagnostics_record(msg, time.time_ns())), qos)
        end = time.monotonic() + duration_s
        with Progress() as progress:
            task = progress.add_task(f"listening on {topic}", total=duration_s)
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
                progress.update(task, completed=duration_s - max(end - time.monotonic(), 0.0),
                                description=f"listening on {topic}: {len(records)} msgs")
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return records


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--bag", help="rosbag2 directory holding PlanningDiagnostics")
    src.add_argument("--duration", type=float, help="live mode: subscribe for this many seconds")
    parser.add_argument("--topic",
                        help=f"diagnostics topic (live default {DEFAULT_TOPIC}; bag: all of that type)")
    parser.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID for live mode (default: environment)")
    parser.add_argument("--deadline-ms", type=float, default=None,
                        help="deadline drawn in the plot (default: planner.deadline_ms, params/planner.yaml)")
    parser.add_argument("--json", help="write the summary as JSON here")
    parser.add_argument("--png", help="write the latency histogram here")
    args = parser.parse_args(argv)
    deadline = args.deadline_ms if args.deadline_ms is not None else default_deadline()
    try:
        if args.bag:
            records = records_from_bag(args.bag, args.topic)
            title = f"latency from {args.bag}"
        else:
            if args.duration <= 0:
                raise ValueError("--duration must be positive")
            records = records_live(args.topic or DEFAULT_TOPIC, args.duration, args.domain_id)
            title = f"latency, live {args.duration:.0f} s on {args.topic or DEFAULT_TOPIC}"
    except (bags.BagError, RuntimeError, ValueError) as exc:
        print(f"latency_report: error: {exc}", file=sys.stderr)
        return 2
    if not records:
        print("latency_report: error: no PlanningDiagnostics messages received", file=sys.stderr)
        return 3
    summary = summarise(records)
    print_tables(summary, deadline, title)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = _jsonable({"deadline_ms": deadline, "nodes": summary})
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.png:
        plot_histograms(records, args.png, deadline, title)
        print(f"histogram: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
