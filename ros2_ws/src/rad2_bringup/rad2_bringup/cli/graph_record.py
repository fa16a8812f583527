"""Record topics of a live ROS 2 graph into a rosbag2 MCAP bag (what `ros2 bag record` does).

Subscriptions are generic: every message is taken serialized (``raw=True``) and written as-is, with
its schema (from rad2_datasets.bags' typestore, or the ``share/<pkg>/msg`` files of the ament
prefixes) embedded in the MCAP so Foxglove can open the bag. QoS adapts to the publishers (reliable
only if every publisher is, transient-local likewise), so best-effort sensor topics are recorded too.
Topics are discovered continuously: ones that appear later are picked up.

Stops after --duration seconds, --max-messages messages, or on Ctrl-C / SIGTERM (the bag is closed
properly in every case). Messages reach the disk in MCAP chunks of at most --chunk-duration seconds
(params/nodes.yaml recording.chunk_duration_s), each flushed and fsynced: if the recorder is killed
outright (SIGKILL, power loss) at most that much is lost, and `rad2 data repair-bag BAG` makes the
unfinished bag readable again. Run it in the rad2 environment (``source tools/env.sh``) or pass
--domain-id; it re-executes itself in that environment when rclpy is not importable.

examples:
  rad2 graph record --out runs/live_bag --duration 30                   # every topic of the graph
  rad2 graph record --out runs/plan_bag --topics /planning/trajectory /planning/diagnostics
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rad2_datasets import bags
from rad2_ros.nodes.recording import RecordError, record_topics
from rad2_ros.rosenv import RosEnvironmentError

from rad2_bringup.cli.common import in_ros_environment, verb_parser


def record(args: argparse.Namespace) -> int:
    counts, skipped = record_topics(
        args.out, args.topics, duration=args.duration, max_messages=args.max_messages,
        wait_topics=args.wait_topics, include_system=args.include_system, use_sim_time=args.use_sim_time,
        chunk_duration=args.chunk_duration, overwrite=args.force)
    print(f"wrote {sum(counts.values())} messages on {len(counts)} topics to {args.out}")
    for topic, why in skipped.items():
        print(f"rad2 graph record: warning: skipped {topic}: {why}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    from rad2_core.cli_args import float_in, int_at_least

    parser = verb_parser("graph record", __doc__)
    parser.add_argument("--out", required=True,
                        help="bag directory to create (rosbag2 layout, MCAP storage)")
    parser.add_argument("--topics", nargs="+", metavar="TOPIC",
                        help="topics to record (default: every topic discovered in the graph)")
    parser.add_argument("--duration", type=float_in(0.0, 86400.0, exclusive_min=True),
                        help="stop after this many seconds (default: Ctrl-C)")
    parser.add_argument("--max-messages", type=int_at_least(1), help="stop after this many messages")
    parser.add_argument("--wait-topics", type=float_in(0.0, 3600.0), default=10.0,
                        help="seconds to wait for each --topics topic to be published (default %(default)s)")
    parser.add_argument("--include-system", action="store_true",
                        help="also record /rosout, /parameter_events")
    parser.add_argument("--use-sim-time", action="store_true",
                        help="log times from /clock instead of wall time")
    parser.add_argument("--chunk-duration", type=float_in(0.0, 86400.0, exclusive_min=True), metavar="S",
                        help="longest a chunk stays in memory before it is written and fsynced, i.e. the "
                             "most a killed recorder loses (default: params/nodes.yaml "
                             "recording.chunk_duration_s)")
    parser.add_argument("--domain-id", type=int_at_least(0, 232),
                        help="ROS_DOMAIN_ID (default: the environment's)")
    parser.add_argument("--force", action="store_true", help="replace --out if it is an existing bag")
    return parser


def main(argv: list[str]) -> int:
    argv = list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    out = Path(args.out)
    existed = out.exists()
    try:
        in_ros_environment("graph record", argv, args.domain_id)
        if existed and not args.force:
            raise RecordError(f"{args.out} exists already (pass --force to replace it)")
        return record(args)
    except (RecordError, RosEnvironmentError, bags.BagError) as exc:
        if not existed and out.is_dir():  # the empty bag this run created
            for child in out.iterdir():
                child.unlink()
            out.rmdir()
        print(f"rad2 graph record: error: {exc}", file=sys.stderr)
        return 2

