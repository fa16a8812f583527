"""The ROS side of open-loop replay: the replay graph, the player and one whole evaluation.

The nodes run as separate processes (graph ``replay`` of launch/graphs.yaml via rad2_bringup.bringup,
``use_sim_time`` on); :class:`Player` publishes, per log step, ``/clock`` (the log time),
``/localization/odometry`` and ``/perception/objects`` as the serialized bytes stored in the bag, and
records the planner outputs. :func:`run_replay` does a whole evaluation (graph up, play, score with
rad2_evaluation.replay, write ``replay_eval.json`` and the plots) and returns the report; the CLI is
rad2 eval replay. rclpy is imported when a Player is made.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rad2_core.config import load_merged, load_params
from rad2_datasets import bags
from rad2_datasets.input_bags import TOPIC_CLOCK, TOPIC_OBJECTS
from rad2_evaluation.replay import (
    Cycle,
    ReplayError,
    Step,
    open_loop_summary,
    plot_plans,
    plot_timeline,
    print_replay_report,
    read_replay_bag,
)
from rad2_ros import latency
from rad2_ros.nodes.recording import Recorder, message_class, open_writer

from rad2_bringup.bringup import Bringup

TOPIC_CANDIDATES = "/planning/candidates"
TOPIC_DIAGNOSTICS = "/planning/diagnostics"
OUTPUT_TOPICS = [TOPIC_CANDIDATES, "/planning/trajectory", "/planning/path", "/planning/markers",
                 TOPIC_DIAGNOSTICS]
PERCEPTION_OUTPUTS = ["/perception/scene_tokens", "/perception/bev_features"]
GRAPH = "replay"
PERCEPTION_NODE, PLANNER_NODE = "bev_features", "planner"


class Player:
    def __init__(self, steps: list[Step], out_bag: Path, record_perception: bool, realtime: bool,
                 rate: float, step_timeout: float, first_timeout: float, resend_after: float = 2.0):
        import rclpy
        from rclpy.parameter import Parameter
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        self.steps = steps
        self.realtime, self.rate = realtime, rate
        self.step_timeout, self.first_timeout = step_timeout, first_timeout
        # lock-step: a step without a plan after this long is offered again (same bytes, same stamp).
        # The nodes' input and feature streams are best effort (sensor QoS), so under load one sample
        # can be lost on the way; the nodes treat the copy as the same sample.
        self.resend_after = resend_after
        self.resent: dict[int, int] = {}  # step -> times its inputs were published again
        self.duplicate_outputs = 0
        self.rclpy = rclpy
        rclpy.init()
        self.node = rclpy.create_node("rad2_replay_player", parameter_overrides=[
            Parameter("use_sim_time", Parameter.Type.BOOL, True)])
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.publishers = {}
        for topic, msgtype, _ in (m for s in steps[:1] for m in s.messages):
            self.publishers[topic] = self.node.create_publisher(message_class(msgtype), topic, qos)
        self.writer = open_writer(out_bag, overwrite=True)  # chunked + fsynced: a kill loses <= 1 chunk
        self.writer.open()
        self.writer.set_metadata("recorded_by", "rad2 eval replay")
        wanted = OUTPUT_TOPICS + (PERCEPTION_OUTPUTS if record_perception else [])
        self.recorder = Recorder(self.node, self.writer, topics=wanted, use_node_clock=True)
        self.recorder.listeners[TOPIC_CANDIDATES] = self._on_candidates
        self.recorder.listeners[TOPIC_DIAGNOSTICS] = self._on_diagnostics
        self.stamp_index = {s.stamp_ns: s.index for s in steps}
        self.published_wall: dict[int, float] = {}
        self.cycles: dict[int, Cycle] = {}
        self.diagnostics: list[dict[str, Any]] = []
        self.unmatched = 0

    # -- callbacks -----------------------------------------------------------------------------------
    def _match(self, stamp_ns: int) -> int | None:
        if stamp_ns in self.stamp_index:
            return self.stamp_index[stamp_ns]
        stamps = np.fromiter(self.stamp_index, dtype=np.int64)
        k = int(np.argmin(np.abs(stamps - stamp_ns)))
        return self.stamp_index[int(stamps[k])] if abs(int(stamps[k]) - stamp_ns) < 20_000_000 else None

    def _on_candidates(self, topic: str, msgtype: str, data: bytes, _log: int) -> None:
        now = time.perf_counter()
        msg = bags.deserialize(data, msgtype, self.writer.store)
        stamp = bags.time_to_ns(msg.header.stamp)
        step = self._match(stamp)
        if step is None:
            self.unmatched += 1
            return
        if step in self.cycles:  # the plan of a re-sent copy (the first one was only late)
            self.duplicate_outputs += 1
            return
        cands = [np.array([[p.x, p.y] for p in c.points], dtype=np.float64).reshape(-1, 2)
                 for c in msg.candidates]
        lengths = {len(c) for c in cands}
        arr = np.stack(cands) if cands and len(lengths) == 1 else np.zeros((0, 0, 2))
        scores = np.array([c.score for c in msg.candidates], dtype=np.float64)
        plan_dt = float(msg.candidates[0].dt) if msg.candidates else float("nan")
        sent = self.published_wall.get(step)
        self.cycles[step] = Cycle(step, stamp, arr, scores, int(msg.selected_index), plan_dt,
                                  (now - sent) * 1e3 if sent is not None else None)

    def _on_diagnostics(self, topic: str, msgtype: str, data: bytes, log_ns: int) -> None:
        msg = bags.deserialize(data, msgtype, self.writer.store)
        self.diagnostics.append(latency.diagnostics_record(msg, log_ns))

    # -- running ---------------------------------------------------------------------------------
    def wait_for_outputs(self, timeout: float) -> None:
        if TOPIC_CANDIDATES in self.recorder.wait_for_publishers(timeout):
            visible = sorted(t for t, _ in self.node.get_topic_names_and_types())
            raise ReplayError(f"the planner does not publish {TOPIC_CANDIDATES} after {timeout:.0f} s "
                              f"(visible topics: {visible})")
        # discovery of our publishers by the nodes' subscriptions
        for topic, pub in self.publishers.items():
            # the perception node must see the object lists; other inputs get a short grace period
            end = time.monotonic() + (timeout if topic == TOPIC_OBJECTS else 2.0)
            while pub.get_subscription_count() == 0 and topic != TOPIC_CLOCK and time.monotonic() < end:
                self.rclpy.spin_once(self.node, timeout_sec=0.05)
        if self.publishers[TOPIC_OBJECTS].get_subscription_count() == 0:
            raise ReplayError(f"nothing subscribes to {TOPIC_OBJECTS} after {timeout:.0f} s")

    def publish_step(self, step: Step, record: bool = True) -> None:
        """Publish one log step (``/clock`` first); ``record`` writes it to the output bag (a
        re-sent copy is not recorded twice)."""
        for topic, _, data in step.messages:
            if topic == TOPIC_CLOCK:
                self.publishers[topic].publish(data)
                self.rclpy.spin_once(self.node, timeout_sec=0.002)  # let /clock land first
        if record:  # latency runs from the first offer; re-sent steps are left out of it (see report)
            self.published_wall[step.index] = time.perf_counter()
        for topic, _, data in step.messages:
            if topic != TOPIC_CLOCK:
                self.publishers[topic].publish(data)
        if record:
            for topic, msgtype, data in step.messages:
                self.writer.write(topic, data, step.stamp_ns, msgtype=msgtype)

    def run(self, progress: Any = None) -> None:
        if not any(t == TOPIC_CLOCK for s in self.steps[:1] for t, _, _ in s.messages):
            clock_type = "rosgraph_msgs/msg/Clock"
            self.publishers[TOPIC_CLOCK] = self.node.create_publisher(
                message_class(clock_type), TOPIC_CLOCK, 10)
            for s in self.steps:
                clock = self.writer.store.types[clock_type](clock=bags.ns_to_time(s.stamp_ns))
                s.messages.insert(0, (TOPIC_CLOCK, clock_type, bags.serialize(clock)))
        t0_wall = time.perf_counter()
        t0_log = self.steps[0].stamp_ns
        for step in self.steps:
            if self.realtime:
                due = t0_wall + (step.stamp_ns - t0_log) * 1e-9 / self.rate
                while time.perf_counter() < due:
                    wait = max(0.0, min(0.01, due - time.perf_counter()))
                    self.rclpy.spin_once(self.node, timeout_sec=wait)
                self.publish_step(step)
            else:
                self.publish_step(step)
                timeout = self.first_timeout if step.index == 0 else self.step_timeout
                end = time.monotonic() + timeout
                resend_at = time.monotonic() + self.resend_after
                while step.index not in self.cycles and time.monotonic() < end:
                    self.rclpy.spin_once(self.node, timeout_sec=0.01)
                    if step.index not in self.cycles and time.monotonic() >= resend_at:
                        self.publish_step(step, record=False)
                        self.resent[step.index] = self.resent.get(step.index, 0) + 1
                        resend_at = time.monotonic() + self.resend_after
            if progress is not None:
                progress(step, len(self.cycles))
        end = time.monotonic() + (2.0 if self.realtime else 0.5)
        while time.monotonic() < end:  # trailing outputs / diagnostics
            self.rclpy.spin_once(self.node, timeout_sec=0.05)

    def close(self) -> None:
        self.writer.close()
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def run_replay(
    bag: str | Path,
    out: str | Path,
    *,
    max_steps: int | None = None,
    map_file: str | None = None,
    clip_id: str | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    domain_id: int = 0,
    composed: bool = False,
    realtime: bool = False,
    rate: float = 1.0,
    step_timeout: float = 5.0,
    first_step_timeout: float = 30.0,
    resend_after: float = 2.0,
    startup_timeout: float = 60.0,
    record_perception: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Replay ``bag`` through the replay graph and score the plans; writes ``<out>/replay_eval.json``,
    ``<out>/*.png`` and the output bag ``<out>/outputs``, prints the tables, returns the report."""
    from tqdm import tqdm

    if not (math.isfinite(resend_after) and resend_after > 0):
        raise ReplayError(f"resend_after = {resend_after} s: must be finite and > 0 (a value beyond the "
                          "step timeout never re-sends)")
    steps, scene, meta = read_replay_bag(bag, max_steps)
    map_file = map_file or meta.get("map_file")
    clip_id = clip_id or meta.get("clip_id", "first")
    if not map_file:
        raise ReplayError(f"bag {bag} names no map (rad2.map_file in metadata.yaml); pass --map-file")
    if not Path(map_file).exists():
        raise ReplayError(f"map file {map_file} (from the bag metadata) does not exist; pass --map-file")
    log_dt = float(meta.get("dt", np.median(np.diff(scene.stamps_ns)) * 1e-9 if len(steps) > 1 else 0.1))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    graph = Bringup(GRAPH, args={"map_file": str(map_file), "clip_id": str(clip_id)}, domain_id=domain_id,
                    log_dir=out / "logs", overrides=overrides or {}, composed=composed)
    mode = f"real time x{rate:g}" if realtime else "as fast as possible"
    log(f"replaying {len(steps)} steps of {bag} ({mode}) through {PERCEPTION_NODE} + "
        f"{PLANNER_NODE}, ROS_DOMAIN_ID={domain_id}")
    t_start = time.perf_counter()
    with graph:
        ready_s = graph.wait_ready(timeout=startup_timeout)
        player = Player(steps, out / "outputs", record_perception, realtime, rate, step_timeout,
                        first_step_timeout, resend_after)
        try:
            player.wait_for_outputs(startup_timeout)
            bar = tqdm(total=len(steps), desc="replay", unit="step")

            def progress(step: Step, n_cycles: int) -> None:
                bar.update(1)
                bar.set_postfix(plans=n_cycles)

            t_play = time.perf_counter()
            player.run(progress)
            play_s = time.perf_counter() - t_play
            bar.close()
            graph.check_alive()
        finally:
            player.close()
    cycles = [player.cycles[k] for k in sorted(player.cycles)]
    if not cycles:
        raise ReplayError(f"no planner output for any of {len(steps)} steps; node logs in {out / 'logs'}")
    metrics = open_loop_summary(cycles, scene, log_dt, {**meta, "map_file": map_file, "clip_id": clip_id},
                                load_merged("bev", "sim", "vehicle"))
    diag_summary = latency.summarise(player.diagnostics) if player.diagnostics else {}
    # a re-sent step's latency would time the loss, not the nodes
    wall = latency.stats(c.wall_latency_ms for c in cycles
                         if c.wall_latency_ms is not None and c.step not in player.resent)
    report = {
        "bag": str(bag), "mode": mode, "steps": len(steps), "plans_received": len(cycles),
        "steps_without_plan": len(steps) - len(cycles), "unmatched_outputs": player.unmatched,
        "steps_resent": len(player.resent), "resends": sum(player.resent.values()),
        "duplicate_outputs": player.duplicate_outputs,
        "startup_s": ready_s, "play_s": play_s, "total_s": time.perf_counter() - t_start,
        "steps_per_s": len(steps) / play_s if play_s > 0 else None,
        "open_loop": metrics, "wall_latency_ms": wall, "diagnostics": diag_summary,
        "map_file": str(map_file), "clip_id": clip_id, "outputs_bag": str(out / "outputs"),
    }
    (out / "replay_eval.json").write_text(json.dumps(latency.jsonable(report), indent=1))
    name = Path(bag).name
    print_replay_report(report, f"open-loop metrics: {bag}")
    if diag_summary:
        deadline = float(load_params("planner")["planner"]["deadline_ms"])
        latency.print_tables(diag_summary, deadline, "planning diagnostics")
        latency.plot_histograms(player.diagnostics, out / "latency.png", deadline,
                               f"replay of {name}: planner latency")
    plot_plans(cycles, scene, out / "plans.png", f"replay of {name}: plans vs log")
    plot_timeline(cycles, metrics.get("per_step", []), out / "timeline.png", f"replay of {name}")
    return report
