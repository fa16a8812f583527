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
properly in every case). Run it in the rad2 environment (``source tools/env.sh``) or pass
--domain-id; it re-executes itself in that environment when rclpy is not importable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "ros2_ws" / "src" / "rad2_planner", ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from rad2_planner import bags  # noqa: E402

#: Topics every ROS graph has; recorded only with --include-system or when named in --topics.
SYSTEM_TOPICS = ("/rosout", "/parameter_events")


class RecordError(RuntimeError):
    """A requested topic is absent, its type cannot be imported, or the bag cannot be written."""


def message_class(msgtype: str) -> type:
    """The rclpy message class of ``pkg/msg/Name`` (needs the package on the Python path)."""
    pkg, kind, name = bags.normalize_msgtype(msgtype).split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (ImportError, AttributeError) as exc:
        raise RecordError(f"cannot import the Python type of {msgtype} ({exc}); is its package built "
                          f"and sourced (tools/env.sh)?") from exc


def full_topic_name(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def adapted_qos(node: Any, topic: str, depth: int = 100) -> Any:
    """A subscription QoS compatible with every current publisher of ``topic`` (like rosbag2)."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    infos = node.get_publishers_info_by_topic(topic)
    reliable = bool(infos) and all(i.qos_profile.reliability == ReliabilityPolicy.RELIABLE for i in infos)
    latched = bool(infos) and all(
        i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in infos)
    return QoSProfile(
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE,
    )


@dataclass
class Recorder:
    """Records topics of the graph ``node`` sees into ``writer`` (a bags.BagWriter, opened).

    ``topics=None`` records everything discovered (minus SYSTEM_TOPICS unless include_system).
    Call ``discover()`` periodically; spin ``node`` to receive messages.
    """

    node: Any
    writer: bags.BagWriter
    topics: list[str] | None = None
    include_system: bool = False
    use_node_clock: bool = False
    subscriptions: dict[str, Any] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    total: int = 0
    #: topic -> fn(topic, msgtype, data, log_time_ns) called for every message after it is written
    listeners: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.topics is not None:
            self.topics = [full_topic_name(t) for t in self.topics]

    def wanted(self, topic: str) -> bool:
        if self.topics is not None:
            return topic in self.topics
        return self.include_system or topic not in SYSTEM_TOPICS

    def discover(self) -> list[str]:
        """Subscribe to newly visible wanted topics; returns the topics added."""
        added = []
        for topic, types in self.node.get_topic_names_and_types():
            if topic in self.subscriptions or topic in self.skipped or not self.wanted(topic):
                continue
            if not self.node.get_publishers_info_by_topic(topic):
                continue  # only subscribers so far: wait for a publisher to learn its QoS
            msgtype = bags.normalize_msgtype(types[0])
            try:
                if len(types) > 1:
                    raise RecordError(f"{topic} is published with several types {types}")
                cls = message_class(msgtype)
                bags.ensure_type(self.writer.store, msgtype)
                self.writer.add_topic(topic, msgtype)
            except (RecordError, bags.BagError) as exc:
                self.skipped[topic] = str(exc)
                continue
            self.types[topic] = msgtype
            self.subscriptions[topic] = self.node.create_subscription(
                cls, topic, self._callback(topic, msgtype), adapted_qos(self.node, topic), raw=True)
            added.append(topic)
        return added

    def _callback(self, topic: str, msgtype: str):
        def write(data: bytes) -> None:
            stamp = self.node.get_clock().now().nanoseconds if self.use_node_clock else time.time_ns()
            self.writer.write(topic, data, stamp, msgtype=msgtype)
            self.total += 1
            listener = self.listeners.get(topic)
            if listener is not None:
                listener(topic, msgtype, data, stamp)

        return write

    def missing(self) -> list[str]:
        return [t for t in (self.topics or []) if t not in self.subscriptions]


def ensure_ros_environment(script: str | Path, argv: list[str], domain_id: int | None) -> None:
    """Re-execute ``script argv`` in tools/rosenv's environment when rclpy/rad2_msgs are not importable
    here (exits with its return code); otherwise just set ROS_DOMAIN_ID."""
    try:
        import rad2_msgs.msg  # noqa: F401
        import rclpy  # noqa: F401

        if domain_id is not None:
            os.environ["ROS_DOMAIN_ID"] = str(domain_id)
        return
    except ImportError:
        if os.environ.get("RAD2_RECORD_REEXEC"):
            raise RecordError("rclpy / rad2_msgs not importable even in the rad2 environment; run "
                              "`bash tools/bootstrap.sh`") from None
    from rosenv import RosEnvironmentError, ros_environment

    try:
        env = ros_environment(domain_id, require_build=True)
    except RosEnvironmentError as exc:
        raise RecordError(str(exc)) from exc
    env["RAD2_RECORD_REEXEC"] = "1"
    venv_python = str(Path(env["RAD2_VENV"]) / "bin" / "python")
    result = subprocess.run([venv_python, str(Path(script).resolve()), *argv], env=env, check=False)
    sys.exit(result.returncode)


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
        with bags.BagWriter(args.out, overwrite=args.force) as writer:
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
    parser.add_argument("--domain-id", type=int, help="ROS_DOMAIN_ID (default: the environment's)")
    parser.add_argument("--force", action="store_true", help="replace --out if it is an existing bag")
    args = parser.parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    out = Path(args.out)
    existed = out.exists()
    try:
        ensure_ros_environment(__file__, argv, args.domain_id)
        if existed and not args.force:
            raise RecordError(f"{args.out} exists already (pass --force to replace it)")
        return record(args)
    except (RecordError, bags.BagError) as exc:
        if not existed and out.is_dir():  # the empty bag this run created
            for child in out.iterdir():
                child.unlink()
            out.rmdir()
        print(f"record_bag: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
