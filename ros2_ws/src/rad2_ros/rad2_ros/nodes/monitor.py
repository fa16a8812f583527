"""Closed-loop graph monitor: one rclpy node that records a run into a bag and timestamps arrivals.

It records the topics of a simulation graph (odometry, tokens, plans, diagnostics, commands, episode
results) with rad2_ros.nodes.recording.Recorder and, on this process's wall clock, measures
end-to-end latency: arrival of a step's odometry (the sim publishes odometry, BEV and tokens of one
step together) -> arrival of the trajectory planned from that stamp, and -> the first controller
cycle that used it (control/diagnostics input_stamp). Used by rad2 demo and the HIL tests
(tests/hil_driver.py).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from rad2_datasets import bags

from rad2_ros.latency import diagnostics_record
from rad2_ros.nodes.recording import Recorder, open_writer

RECORD_TOPICS = [
    "/clock", "/localization/odometry", "/perception/scene_tokens", "/planning/candidates",
    "/planning/trajectory", "/planning/path", "/planning/markers", "/planning/diagnostics",
    "/control/command", "/control/diagnostics", "/sim/episode_result",
]


class Monitor:
    """One rclpy node that records the bag and timestamps arrivals for the latency figures."""

    def __init__(self, bag_dir: Path | None, record_bev: bool, recorded_by: str = "rad2 demo"):
        import rclpy
        from rad2_msgs.msg import PlanningDiagnostics, Trajectory
        from rclpy.serialization import deserialize_message
        from rclpy.signals import SignalHandlerOptions

        from rad2_ros import conversions as rc

        self.rc, self.deserialize = rc, deserialize_message
        self.diagnostics_record = diagnostics_record
        rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
        self.rclpy = rclpy
        self.node = rclpy.create_node("rad2_demo_monitor")
        self.writer = None
        if bag_dir is not None:
            self.writer = open_writer(bag_dir, overwrite=True)  # chunked + fsynced: a kill loses <= 1 chunk
            self.writer.open()
            self.writer.set_metadata("recorded_by", recorded_by)
        topics = RECORD_TOPICS + (["/perception/bev_features"] if record_bev else [])
        self.recorder = Recorder(self.node, self.writer if self.writer is not None else _NullWriter(), topics)
        self.t_input: dict[int, int] = {}
        self.input_count: dict[int, int] = defaultdict(int)
        self.odom: list[tuple[int, float, float, float, float]] = []
        self.t_traj: dict[int, int] = {}
        self.t_ctrl: dict[int, int] = {}
        self.planner_diags: list[dict[str, Any]] = []
        self.control_diags: list[dict[str, Any]] = []
        self.commands: list[tuple[int, bool, str]] = []
        self.results: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self.clip_of_odom: list[int] = []
        types = {"traj": Trajectory, "diag": PlanningDiagnostics}
        from nav_msgs.msg import Odometry
        from rad2_msgs.msg import ControlCommand
        from std_msgs.msg import String

        types.update(odom=Odometry, cmd=ControlCommand, result=String)
        self.types = types
        self.recorder.listeners = {
            "/localization/odometry": self._on_odom, "/planning/trajectory": self._on_traj,
            "/planning/diagnostics": self._on_planner_diag, "/control/diagnostics": self._on_control_diag,
            "/control/command": self._on_command, "/sim/episode_result": self._on_result,
        }

    # listeners get (topic, msgtype, serialized bytes, log time)
    def _on_odom(self, _t, _m, data, _s) -> None:
        now = time.time_ns()
        m = self.deserialize(data, self.types["odom"])
        e = self.rc.odometry_from_msg(m)
        self.input_count[e.stamp_ns] += 1
        if e.stamp_ns not in self.t_input:
            self.t_input[e.stamp_ns] = now
            self.odom.append((e.stamp_ns, e.x, e.y, e.yaw, e.speed))
            self.clip_of_odom.append(len(self.results))

    def _on_traj(self, _t, _m, data, _s) -> None:
        now = time.time_ns()
        stamp = self.rc.time_to_ns(self.deserialize(data, self.types["traj"]).header.stamp)
        self.t_traj.setdefault(stamp, now)

    def _on_planner_diag(self, _t, _m, data, s) -> None:
        self.planner_diags.append(self.diagnostics_record(self.deserialize(data, self.types["diag"]), s))

    def _on_control_diag(self, _t, _m, data, s) -> None:
        now = time.time_ns()
        rec = self.diagnostics_record(self.deserialize(data, self.types["diag"]), s)
        self.control_diags.append(rec)
        if not rec["fallback_active"]:
            self.t_ctrl.setdefault(rec["input_stamp_ns"], now)

    def _on_command(self, _t, _m, data, _s) -> None:
        m = self.deserialize(data, self.types["cmd"])
        self.commands.append((time.time_ns(), bool(m.emergency_stop), str(m.reason)))

    def _on_result(self, _t, _m, data, _s) -> None:
        payload = json.loads(self.deserialize(data, self.types["result"]).data)
        if payload.get("done"):
            self.summary = payload
        else:
            self.results.append(payload)

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        last = 0.0
        while time.monotonic() < end:
            self.rclpy.spin_once(self.node, timeout_sec=0.02)
            if time.monotonic() - last > 0.5:
                self.recorder.discover()
                last = time.monotonic()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.node.destroy_node()
        self.rclpy.try_shutdown()

    # -- figures ---------------------------------------------------------------------------------
    def latencies(self) -> dict[str, list[float]]:
        """Wall-clock latencies per input stamp. Stamps that arrived more than once are left out:
        their first arrival is not when the planner started on them (the sim stamps every
        observation with its own time, including those it repeats while holding a clip start)."""
        once = {s: t for s, t in self.t_input.items() if self.input_count[s] == 1}
        traj = [(self.t_traj[s] - t) / 1e6 for s, t in once.items() if s in self.t_traj]
        ctrl = [(self.t_ctrl[s] - t) / 1e6 for s, t in once.items() if s in self.t_ctrl]
        return {"input_to_trajectory_ms": traj, "input_to_control_ms": ctrl}

    def control_rate(self, t0_ns: int, t1_ns: int) -> float:
        n = sum(t0_ns <= t <= t1_ns for t, _, _ in self.commands)
        return n / max((t1_ns - t0_ns) / 1e9, 1e-9)

    def tracks(self) -> dict[int, np.ndarray]:
        out: dict[int, list] = defaultdict(list)
        for clip, row in zip(self.clip_of_odom, self.odom):
            out[clip].append((row[1], row[2], row[3], row[4]))
        return {k: np.asarray(v) for k, v in out.items()}


class _NullWriter:
    """Stands in for a BagWriter with --no-bag (the recorder still subscribes for the listeners)."""

    def __init__(self):
        self.store = bags.typestore()
        self.counts: dict[str, int] = {}

    def add_topic(self, *_a, **_k) -> None:
        pass

    def write(self, topic, *_a, **_k) -> None:
        self.counts[topic] = self.counts.get(topic, 0) + 1
