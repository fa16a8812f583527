#!/usr/bin/env python3
"""Record topics of a live ROS 2 graph into a rosbag2 MCAP bag (what `ros2 bag record` does).

Subscriptions are generic: every message is taken serialized (``raw=True``) and written as-is, with
its schema (from rad2_planner.bags' typestore, or the ``share/<pkg>/msg`` files of the ament
prefixes) embedded in the MCAP so Foxglove can open the bag. QoS adapts to the publishers (reliable
only if every publisher is, transient-local likewise), so best-effort sensor topics are recorded too.
Topics are discovered continuously: ones that appear later are picked up.

  record_bag.py --out runs/live_bag --duration 30                   # every topic of the graph
  record_bag.py --out runs/plan_bag --topics /planning/trajectory /planning/diagnostics

Stops after --duration seconds, --max-messages messages, or on Ctrl-C / SIGTERM (the bag is closed
properly in every case). Messages reach the disk in MCAP chunks of at most --chunk-duration seconds
(params/nodes.yaml recording.chunk_duration_s), each flushed and fsynced: if the recorder is killed
outright (SIGKILL, power loss) at most that much is lost, and tools/repair_bag.py BAG makes the
unfinished bag readable again. Run it in the rad2 environment (``source tools/env.sh``) or pass
--domain-id; it re-executes itself in that environment when rclpy is not importable.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rad2_planner import bags
from rad2_planner.nodes.recording import Recorder, RecordError, open_writer
from rad2_planner.rosenv import RosEnvironmentError, ensure_ros_environment


def record(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    console = Console(stderr=True)
    stop = {"flag": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("rad2_bag_recorder", parameter_overrides=[
        Parameter("use_sim_time", Parameter.Type.BOOL, bool(args.use_sim_time))])
    try:
        with open_writer(args.out, overwrite=args.force, chunk_duration=args.chunk_duration) as writer:
            writer.set_metadata("recorded_by", "tools/record_bag.py")
            recorder = Recorder(node, writer, args.topics, args.include_system, bool(args.use_sim_time))
            # 1. discovery: wait until every requested topic has a publisher
            deadline = time.monotonic() + args.wait_topics
            recorder.discover()
            while args.topics and recorder.missing() and time.monotonic() < deadline and not stop["flag"]:
                rclpy.spin_once(node, timeout_sec=0.1)
                recorder.discover()
            if args.topics and recorder.missing():
                visible = sorted(t for t, _ in node.get_topic_names_and_types())
                reasons = {t: recorder.skipped[t] for t in recorder.missing() if t in recorder.skipped}
                raise RecordError(
                    f"topic(s) {recorder.missing()} not recordable after {args.wait_topics:.0f} s "
                    f"({reasons or 'no publisher in the graph'}); visible topics: {visible}")
            # 2. record
            t0 = time.monotonic()
            last_discovery = t0

            def table() -> Table:
                tab = Table(title=f"recording {args.out}  {time.monotonic() - t0:.1f} s")
                tab.add_column("topic")
                tab.add_column("type")
                tab.add_column("messages", justify="right")
                for topic, mtype in sorted(recorder.types.items()):
                    tab.add_row(topic, mtype, str(writer.counts.get(topic, 0)))
                for topic, why in sorted(recorder.skipped.items()):
                    tab.add_row(topic, f"[red]skipped: {why[:60]}", "")
                return tab

            live_opts = {"console": console, "refresh_per_second": 4, "transient": not console.is_terminal}
            with Live(table(), **live_opts) as live:
                while not stop["flag"]:
                    if args.duration is not None and time.monotonic() - t0 >= args.duration:
                        break
                    if args.max_messages is not None and recorder.total >= args.max_messages:
                        break
                    rclpy.spin_once(node, timeout_sec=0.05)
                    recorder.flush_due()
                    now = time.monotonic()
                    if now - last_discovery > 0.5:
                        recorder.discover()
                        last_discovery = now
                        live.update(table())
                live.update(table())
            counts = dict(writer.counts)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    console.print(table())
    total = sum(counts.values())
    print(f"wrote {total} messages on {len(counts)} topics to {args.out}")
    if recorder.skipped:
        for topic, why in recorder.skipped.items():
            print(f"record_bag: warning: skipped {topic}: {why}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True,
                        help="bag directory to create (rosbag2 layout, MCAP storage)")
    parser.add_argument("--topics", nargs="+", metavar="TOPIC",
                        help="topics to record (default: every topic discovered in the graph)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: Ctrl-C)")
    parser.add_argument("--max-messages", type=int, help="stop after this many messages")
    parser.add_argument("--wait-topics", type=float, default=10.0,
                        help="seconds to wait for each --topics topic to be published (default %(default)s)")
    parser.add_argument("--include-system", action="store_true",
                        help="also record /rosout, /parameter_events")
    parser.add_argument("--use-sim-time", action="store_true",
                        help="log times from /clock instead of wall time")
    parser.add_argument("--chunk-duration", type=float, metavar="S",
                        help="longest a chunk stays in memory before it is written and fsynced, i.e. the "
                             "most a killed recorder loses (default: params/nodes.yaml "
                             "recording.chunk_duration_s)")
    parser.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID (default: the environment's)")
    parser.add_argument("--force", action="store_true", help="replace --out if it is an existing bag")
    args = parser.parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    if args.chunk_duration is not None and args.chunk_duration <= 0:
        parser.error("--chunk-duration must be positive")
    out = Path(args.out)
    existed = out.exists()
    try:
        ensure_ros_environment(__file__, argv, args.domain_id)
        if existed and not args.force:
            raise RecordError(f"{args.out} exists already (pass --force to replace it)")
        return record(args)
    except (RecordError, RosEnvironmentError, bags.BagError) as exc:
        if not existed and out.is_dir():  # the empty bag this run created
            for child in out.iterdir():
                child.unlink()
            out.rmdir()
        print(f"record_bag: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
