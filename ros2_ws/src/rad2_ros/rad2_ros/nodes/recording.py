"""Generic topic recording into a rosbag2 MCAP bag (what `ros2 bag record` does), on a given rclpy node.

Subscriptions are generic: every message is taken serialized (``raw=True``) and written as-is, with
its schema (from rad2_datasets.bags' typestore, or the ``share/<pkg>/msg`` files of the ament
prefixes) embedded in the MCAP so Foxglove can open the bag. QoS adapts to the publishers (reliable
only if every publisher is, transient-local likewise), so best-effort sensor topics are recorded too.
Used by rad2 graph record, rad2 eval replay and rad2 demo. It lives with the nodes because it
subscribes through rclpy (imported where used, so this module imports without a ROS environment).

Crash safety: open the writer with ``open_writer`` (chunks of at most ``recording.chunk_duration_s``
from params/nodes.yaml, each written with the MCAP summary and footer and fsynced, metadata.yaml
replaced after it) and call ``Recorder.flush_due()`` while spinning, so a recorder killed outright
leaves a bag that opens without a repair step, missing at most one chunk (``rad2_datasets.bags``).
"""

from __future__ import annotations

import importlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rad2_core import config
from rad2_datasets import bags

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


def chunk_duration_s() -> float:
    """``recording.chunk_duration_s`` of params/nodes.yaml: the longest a chunk stays in memory."""
    return float(config.load_params("nodes")["recording"]["chunk_duration_s"])


def open_writer(path: Any, *, overwrite: bool = False, chunk_duration: float | None = None) -> bags.BagWriter:
    """A (not yet opened) BagWriter for live recording: chunks closed, flushed and fsynced at least
    every ``chunk_duration`` seconds (default: params/nodes.yaml ``recording.chunk_duration_s``)."""
    duration = chunk_duration_s() if chunk_duration is None else chunk_duration
    return bags.BagWriter(path, overwrite=overwrite, chunk_duration_s=duration)


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

    def flush_due(self) -> bool:
        """Close, flush and fsync the writer's chunk in progress once chunk_duration_s has passed
        since the newest message on disk was written.

        Writes check this too, but a quiet graph writes nothing: call it between spins so the last
        messages before a silence reach the disk. True when a chunk was written."""
        return self.writer.flush_if_due()

    def missing(self) -> list[str]:
        return [t for t in (self.topics or []) if t not in self.subscriptions]

    def wait_for_publishers(self, timeout: float, stop: Callable[[], bool] = lambda: False) -> list[str]:
        """Spin the node and discover until every requested topic is subscribed, ``timeout`` seconds
        pass or ``stop()``; returns the requested topics still missing."""
        import rclpy

        end = time.monotonic() + timeout
        self.discover()
        while self.missing() and time.monotonic() < end and not stop():
            rclpy.spin_once(self.node, timeout_sec=0.1)
            self.discover()
        return self.missing()

    def table(self, title: str) -> Any:
        """A rich Table of the topics: type and messages written so far, and the skipped ones."""
        from rich.table import Table

        tab = Table(title=title)
        tab.add_column("topic")
        tab.add_column("type")
        tab.add_column("messages", justify="right")
        for topic, mtype in sorted(self.types.items()):
            tab.add_row(topic, mtype, str(self.writer.counts.get(topic, 0)))
        for topic, why in sorted(self.skipped.items()):
            tab.add_row(topic, f"[red]skipped: {why[:60]}", "")
        return tab


def record_topics(
    out: Any,
    topics: list[str] | None = None,
    *,
    duration: float | None = None,
    max_messages: int | None = None,
    wait_topics: float = 10.0,
    include_system: bool = False,
    use_sim_time: bool = False,
    chunk_duration: float | None = None,
    overwrite: bool = False,
    recorded_by: str = "rad2 graph record",
    console: Any = None,
) -> tuple[dict[str, int], dict[str, str]]:
    """Record the graph's topics into the bag ``out`` until SIGINT/SIGTERM, ``duration`` seconds or
    ``max_messages``, with a live rich table on ``console``; returns (messages per topic, skipped topic
    -> why). RecordError when a requested topic has no recordable publisher after ``wait_topics`` s."""
    import rclpy
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions
    from rich.console import Console
    from rich.live import Live

    console = console or Console(stderr=True)
    stop = {"flag": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("rad2_bag_recorder", parameter_overrides=[
        Parameter("use_sim_time", Parameter.Type.BOOL, bool(use_sim_time))])
    try:
        with open_writer(out, overwrite=overwrite, chunk_duration=chunk_duration) as writer:
            writer.set_metadata("recorded_by", recorded_by)
            recorder = Recorder(node, writer, topics, include_system, bool(use_sim_time))
            missing = recorder.wait_for_publishers(wait_topics, lambda: stop["flag"])
            if missing:
                visible = sorted(t for t, _ in node.get_topic_names_and_types())
                reasons = {t: recorder.skipped[t] for t in missing if t in recorder.skipped}
                raise RecordError(
                    f"topic(s) {missing} not recordable after {wait_topics:.0f} s "
                    f"({reasons or 'no publisher in the graph'}); visible topics: {visible}")
            t0 = last_discovery = time.monotonic()

            def table() -> Any:
                return recorder.table(f"recording {out}  {time.monotonic() - t0:.1f} s")

            live_opts = {"console": console, "refresh_per_second": 4, "transient": not console.is_terminal}
            with Live(table(), **live_opts) as live:
                while not stop["flag"]:
                    if duration is not None and time.monotonic() - t0 >= duration:
                        break
                    if max_messages is not None and recorder.total >= max_messages:
                        break
                    rclpy.spin_once(node, timeout_sec=0.05)
                    recorder.flush_due()
                    if time.monotonic() - last_discovery > 0.5:
                        recorder.discover()
                        last_discovery = time.monotonic()
                        live.update(table())
                live.update(table())
            counts = dict(writer.counts)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    console.print(table())
    return counts, dict(recorder.skipped)
