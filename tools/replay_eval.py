#!/usr/bin/env python3
"""Replay a bag of perception inputs through the real perception-features and planner nodes.

The nodes run as separate processes (graph ``replay`` of launch/graphs.yaml via tools/bringup.py,
``use_sim_time`` on); this tool is the player: per log step it publishes ``/clock`` (the log time),
``/localization/odometry`` and ``/perception/objects`` as the serialized bytes stored in the bag.

  as fast as possible (default)  after each step, wait for the planner's CandidateSet of that step
                                 (or --step-timeout) before the next one: no cycle is skipped
  --realtime [--rate R]          publish on the bag's timeline (R x speed) without waiting

It records the planner outputs (and the inputs) into an output bag, then reports open-loop metrics
of the plans against the log (ADE/FDE of the selected and best-of-M candidates vs the logged ego
future, CR/DCR/SCR, via rad2_planner.open_loop_metrics), the per-stage latency and deadline misses
from planning/diagnostics, and the wall-clock latency input-publish -> candidates-received.
Writes <out>/replay_eval.json, <out>/*.png and the bag <out>/outputs.

  replay_eval.py --bag runs/bags/clip0 --out runs/replay/clip0
  replay_eval.py --bag runs/bags/clip0 --realtime --max-steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "ros2_ws" / "src" / "rad2_planner", ROOT / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from clip_to_bag import TOPIC_CLOCK, TOPIC_OBJECTS, TOPIC_ODOM  # noqa: E402
from rad2_planner import bags, latency  # noqa: E402
from record_bag import Recorder, RecordError, ensure_ros_environment, message_class  # noqa: E402

TOPIC_CANDIDATES = "/planning/candidates"
TOPIC_DIAGNOSTICS = "/planning/diagnostics"
OUTPUT_TOPICS = [TOPIC_CANDIDATES, "/planning/trajectory", "/planning/path", "/planning/markers",
                 TOPIC_DIAGNOSTICS]
PERCEPTION_OUTPUTS = ["/perception/scene_tokens", "/perception/bev_features"]
INPUT_TOPICS = [TOPIC_CLOCK, TOPIC_ODOM, TOPIC_OBJECTS]
GRAPH = "replay"
PERCEPTION_NODE, PLANNER_NODE = "bev_features", "planner"


class ReplayError(RuntimeError):
    """The bag lacks what replay needs, the nodes did not start, or no plan came back."""


# --------------------------------------------------------------------------------------------------
# Bag side
# --------------------------------------------------------------------------------------------------


@dataclass
class Step:
    """Everything the player publishes at one log time."""

    index: int
    stamp_ns: int
    messages: list[tuple[str, str, bytes]] = field(default_factory=list)  # (topic, msgtype, CDR)


@dataclass
class LoggedScene:
    """The log the plans are scored against: ego poses and agent boxes per step (world frame)."""

    stamps_ns: np.ndarray  # [S]
    ego: np.ndarray  # [S, 3] x, y, yaw (from odometry)
    ego_speed: np.ndarray  # [S]
    agents: list[dict[str, np.ndarray]]  # per step: ids, x, y, yaw, length, width, vx, vy, type


def read_replay_bag(path: str | Path, max_steps: int | None = None) -> tuple[list[Step], LoggedScene, dict]:
    """Steps to publish, the logged scene and the rad2 metadata of a perception-inputs bag."""
    with bags.BagReader(path) as reader:
        reader.check_topics([TOPIC_ODOM, TOPIC_OBJECTS])
        topics = [t for t in INPUT_TOPICS if t in reader.topics]
        meta = reader.custom_data
        by_stamp: dict[int, Step] = {}
        odom: dict[int, tuple[float, float, float, float]] = {}
        objects: dict[int, dict[str, np.ndarray]] = {}
        for m in reader.messages(topics, raw=True):
            step = by_stamp.setdefault(m.log_time_ns, Step(len(by_stamp), m.log_time_ns))
            step.messages.append((m.topic, m.msgtype, bytes(m.msg)))
            if m.topic == TOPIC_ODOM:
                msg = bags.deserialize(m.msg, m.msgtype, reader.store)
                q = msg.pose.pose.orientation
                yaw = float(np.arctan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z)))
                odom[m.log_time_ns] = (msg.pose.pose.position.x, msg.pose.pose.position.y, yaw,
                                       msg.twist.twist.linear.x)
            elif m.topic == TOPIC_OBJECTS:
                msg = bags.deserialize(m.msg, m.msgtype, reader.store)
                a = msg.agents
                objects[m.log_time_ns] = {
                    "ids": np.array([s.id for s in a], dtype=np.int64),
                    "type": np.array([s.type for s in a], dtype=np.int64),
                    "x": np.array([s.pose.x for s in a]), "y": np.array([s.pose.y for s in a]),
                    "yaw": np.array([s.pose.theta for s in a]),
                    "length": np.array([s.length for s in a]), "width": np.array([s.width for s in a]),
                    "vx": np.array([s.velocity_x for s in a]), "vy": np.array([s.velocity_y for s in a]),
                }
    steps = [s for s in by_stamp.values() if any(t == TOPIC_OBJECTS for t, _, _ in s.messages)]
    if not steps:
        raise ReplayError(f"bag {path} has no {TOPIC_OBJECTS} messages")
    for k, s in enumerate(steps):
        s.index = k
        if not any(t == TOPIC_ODOM for t, _, _ in s.messages):
            raise ReplayError(f"bag {path}: no {TOPIC_ODOM} at log time {s.stamp_ns} (step {k})")
    stamps = np.array([s.stamp_ns for s in steps], dtype=np.int64)
    scene = LoggedScene(
        stamps_ns=stamps,
        ego=np.array([odom[t][:3] for t in stamps]),
        ego_speed=np.array([odom[t][3] for t in stamps]),
        agents=[objects[t] for t in stamps],
    )
    if max_steps is not None:
        steps = steps[:max_steps]
    return steps, scene, meta


# --------------------------------------------------------------------------------------------------
# Graph side
# --------------------------------------------------------------------------------------------------


class DirectGraph:
    """Fallback when tools/bringup.py is unavailable: the two console scripts as processes."""

    def __init__(self, map_file: str, clip_id: str, domain_id: int, log_dir: Path):
        from rosenv import ros_environment

        self.env = {**ros_environment(domain_id, require_build=True), "PYTHONUNBUFFERED": "1"}
        lib = ROOT / "ros2_ws" / "install" / "rad2_planner" / "lib" / "rad2_planner"
        params = [ROOT / "params" / f for f in ("bev.yaml", "vehicle.yaml", "planner.yaml", "nodes.yaml")]
        files = [a for p in params if p.is_file() for a in ("--params-file", str(p))]
        self.commands = {
            PERCEPTION_NODE: [str(lib / "perception_node"), "--ros-args", "-r", f"__node:={PERCEPTION_NODE}",
                              *files, "-p", f"perception.map_file:={map_file}",
                              "-p", f"perception.clip_id:={clip_id}", "-p", "use_sim_time:=true"],
            PLANNER_NODE: [str(lib / "planner_node"), "--ros-args", "-r", f"__node:={PLANNER_NODE}", *files,
                           "-p", "use_sim_time:=true"],
        }
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> DirectGraph:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name, cmd in self.commands.items():
            if not Path(cmd[0]).exists():
                raise ReplayError(f"{cmd[0]} does not exist: build the workspace (tools/bootstrap.sh)")
            log = (self.log_dir / f"{name}.log").open("w")
            self.procs[name] = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_ready(self, timeout: float) -> float:
        time.sleep(min(timeout, 3.0))  # readiness is checked by waiting for the planner's topics
        self.check_alive()
        return 3.0

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise ReplayError(f"node process(es) exited: {dead}; logs in {self.log_dir}")

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(2)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def make_graph(map_file: str, clip_id: str, domain_id: int, log_dir: Path,
               overrides: dict[str, dict[str, Any]], composed: bool) -> Any:
    """The replay graph via tools/bringup.py (else the console scripts directly)."""
    try:
        from bringup import Bringup
    except ImportError:
        return DirectGraph(map_file, clip_id, domain_id, log_dir)
    return Bringup(GRAPH, args={"map_file": map_file, "clip_id": clip_id}, domain_id=domain_id,
                   log_dir=log_dir, overrides=overrides, composed=composed)


# --------------------------------------------------------------------------------------------------
# Player
# --------------------------------------------------------------------------------------------------


@dataclass
class Cycle:
    """One planner output matched to the step it planned from."""

    step: int
    stamp_ns: int
    candidates: np.ndarray  # [M, T, 2] ego frame at the step
    scores: np.ndarray  # [M]
    selected: int  # -1 = fallback
    plan_dt: float
    wall_latency_ms: float | None  # input published -> candidates received


class Player:
    def __init__(self, steps: list[Step], out_bag: Path, record_perception: bool, realtime: bool,
                 rate: float, step_timeout: float, first_timeout: float):
        import rclpy
        from rclpy.parameter import Parameter
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        self.steps = steps
        self.realtime, self.rate = realtime, rate
        self.step_timeout, self.first_timeout = step_timeout, first_timeout
        self.rclpy = rclpy
        rclpy.init()
        self.node = rclpy.create_node("rad2_replay_player", parameter_overrides=[
            Parameter("use_sim_time", Parameter.Type.BOOL, True)])
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.publishers = {}
        for topic, msgtype, _ in (m for s in steps[:1] for m in s.messages):
            self.publishers[topic] = self.node.create_publisher(message_class(msgtype), topic, qos)
        self.writer = bags.BagWriter(out_bag, overwrite=True)
        self.writer.open()
        self.writer.set_metadata("recorded_by", "tools/replay_eval.py")
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
        end = time.monotonic() + timeout
        self.recorder.discover()
        while self.recorder.missing() and time.monotonic() < end:
            self.rclpy.spin_once(self.node, timeout_sec=0.1)
            self.recorder.discover()
        if TOPIC_CANDIDATES in self.recorder.missing():
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

    def publish_step(self, step: Step) -> None:
        for topic, _, data in step.messages:
            if topic == TOPIC_CLOCK:
                self.publishers[topic].publish(data)
                self.rclpy.spin_once(self.node, timeout_sec=0.002)  # let /clock land first
        self.published_wall[step.index] = time.perf_counter()
        for topic, _, data in step.messages:
            if topic != TOPIC_CLOCK:
                self.publishers[topic].publish(data)
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
                while step.index not in self.cycles and time.monotonic() < end:
                    self.rclpy.spin_once(self.node, timeout_sec=0.01)
            if progress is not None:
                progress(step, len(self.cycles))
        end = time.monotonic() + (2.0 if self.realtime else 0.5)
        while time.monotonic() < end:  # trailing outputs / diagnostics
            self.rclpy.spin_once(self.node, timeout_sec=0.05)

    def close(self) -> None:
        self.writer.close()
        self.node.destroy_node()
        self.rclpy.try_shutdown()


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


def _meta_float(meta: dict, key: str, default: float | None = None) -> float | None:
    try:
        return float(meta[key])
    except (KeyError, TypeError, ValueError):
        return default


def clip_from_metadata(meta: dict, scene: LoggedScene, log_dt: float,
                       tol_m: float = 0.05) -> tuple[Any | None, int, str]:
    """The clip the bag was made from (``rad2.map_file`` + ``rad2.clip_id``), the clip step of bag step 0
    (``rad2.first_step``) and a note; ``(None, 0, why)`` when it cannot be loaded or does not match the
    bag's odometry (then the bag itself is the log, see :func:`clip_from_bag`)."""
    from clip_to_bag import load_clip_source

    map_file, clip_id = meta.get("map_file"), str(meta.get("clip_id") or "first")
    if not map_file:
        return None, 0, "bag metadata names no rad2.map_file"
    path = Path(map_file)
    try:
        if path.is_dir():
            src = load_clip_source(str(path), None if clip_id in ("", "first") else clip_id, None, None)
        else:
            src = load_clip_source(None, None, None, str(path))
    except Exception as exc:  # noqa: BLE001 - any load failure falls back to the bag
        return None, 0, f"clip {clip_id!r} of {map_file} not loadable ({exc})"
    clip = src.clip
    first = int(_meta_float(meta, "first_step", 0.0) or 0)
    if abs(float(clip.dt) - log_dt) > 1e-6:
        return None, 0, f"clip dt {clip.dt} differs from the bag's {log_dt}"
    n = len(scene.stamps_ns)
    if first < 0 or first + n > clip.num_steps:
        return None, 0, f"bag steps {first}..{first + n} exceed clip {clip.clip_id} ({clip.num_steps} steps)"
    idx = first + np.arange(n)
    err = np.hypot(clip.ego_x[idx] - scene.ego[:, 0], clip.ego_y[idx] - scene.ego[:, 1]).max()
    if err > tol_m:
        return None, 0, f"clip {clip.clip_id} ego differs from the bag odometry by {err:.2f} m"
    return clip, first, f"clip {clip.clip_id} of {map_file} (bag step 0 = clip step {first})"


def clip_from_bag(scene: LoggedScene, log_dt: float, meta: dict) -> Any:
    """A clip-like log (the fields rad2_planner.open_loop_metrics.logged_future reads) built from the bag's
    odometry and object lists; agents are matched across steps by id."""
    from types import SimpleNamespace

    n_steps = len(scene.stamps_ns)
    ids = sorted({int(i) for a in scene.agents for i in a["ids"]})
    col = {i: k for k, i in enumerate(ids)}
    shape = (len(ids), n_steps)
    tracks = {k: np.zeros(shape) for k in ("x", "y", "yaw", "vx", "vy")}
    valid = np.zeros(shape, bool)
    length, width = np.zeros(len(ids)), np.zeros(len(ids))
    for t, a in enumerate(scene.agents):
        rows = np.array([col[int(i)] for i in a["ids"]], dtype=np.int64)
        if not len(rows):
            continue
        for k in tracks:
            tracks[k][rows, t] = a[k]
        valid[rows, t] = True
        length[rows], width[rows] = a["length"], a["width"]
    vehicle = load_params_safe("vehicle")
    ego_length = _meta_float(meta, "ego_length", vehicle.get("length"))
    ego_width = _meta_float(meta, "ego_width", vehicle.get("width"))
    return SimpleNamespace(
        clip_id="bag", dt=log_dt, num_steps=n_steps,
        ego_x=scene.ego[:, 0], ego_y=scene.ego[:, 1], ego_yaw=scene.ego[:, 2],
        ego_length=ego_length, ego_width=ego_width,
        agent_ids=np.array(ids, dtype=np.int64), agent_length=length, agent_width=width,
        agent_x=tracks["x"], agent_y=tracks["y"], agent_yaw=tracks["yaw"],
        agent_vx=tracks["vx"], agent_vy=tracks["vy"], agent_valid=valid,
    )


def load_params_safe(name: str) -> dict[str, Any]:
    """``params/<name>.yaml`` section ``name`` (flat dict), or {} when it cannot be read."""
    try:
        from rad2_planner.config import load_params

        return dict(load_params(name).get(name, {}))
    except Exception:  # noqa: BLE001 - only used for fallbacks
        return {}


class DrivableRaster:
    """The BEV drivable-area channel at a world pose (params/bev.yaml geometry) for the offroad metric."""

    def __init__(self, clip: Any):
        from rad2_planner import bev
        from rad2_planner.config import load_params

        params = load_params("bev")
        params = {**params, "bev": {**params["bev"], "channels": ["drivable_area"], "vector_channels": []}}
        self.params, self.bev, self.clip = params, bev, clip
        self.cfg = bev.BevConfig.from_params(params)
        self.prepared = bev.prepare_map(clip.map)
        self.origin = (self.cfg.origin_x, self.cfg.origin_y)
        self.resolution = self.cfg.resolution

    def __call__(self, pose: np.ndarray) -> np.ndarray:
        snap = self.bev.SceneSnapshot(map=self.clip.map, ego_pose=np.asarray(pose, np.float64),
                                      route_polyline=self.clip.route_polyline,
                                      agents=self.bev.AgentFrame.empty())
        return self.bev.rasterize_bev(snap, params=self.params, prepared=self.prepared)[0]


#: Summary keys of OpenLoopAccumulator shown in the table, with units.
METRIC_LABELS = {
    "ADE": ("ADE selected", "m"), "FDE": ("FDE selected", "m"),
    "minADE": ("minADE (best of M)", "m"), "minFDE": ("minFDE (best of M)", "m"),
    "CR": ("CR collision rate", "%"), "DCR": ("DCR dynamic", "%"), "SCR": ("SCR static", "%"),
    "coll_any": ("candidates colliding", "%"), "offroad": ("offroad (selected)", "%"),
}


def open_loop_summary(cycles: list[Cycle], scene: LoggedScene, log_dt: float, meta: dict) -> dict[str, Any]:
    """Open-loop metrics of the plans against the log (rad2_planner.open_loop_metrics)."""
    usable = [c for c in cycles if c.candidates.ndim == 3 and c.candidates.shape[0] > 0]
    out: dict[str, Any] = {"cycles": len(cycles), "cycles_with_candidates": len(usable),
                           "fallback_cycles": sum(c.selected < 0 for c in cycles)}
    if not usable:
        return out
    try:
        from rad2_planner import open_loop_metrics as olm
    except ImportError as exc:
        out["error"] = f"rad2_planner.open_loop_metrics is not available ({exc})"
        return out
    out.update(_call_open_loop_metrics(olm, usable, scene, log_dt, meta))
    return out


def _call_open_loop_metrics(olm: Any, cycles: list[Cycle], scene: LoggedScene, log_dt: float,
                            meta: dict) -> dict[str, Any]:
    """Score each cycle's candidates (ego frame of its step) against the logged future.

    The log is the clip named by the bag metadata when it loads and matches the bag's odometry (its
    future reaches past the bag's last step, and it gives the map for the offroad check); otherwise the
    bag's own odometry and object lists. Fallback cycles (selected < 0) count only in ``fallback_cycles``.
    """
    clip, first, note = clip_from_metadata(meta, scene, log_dt)
    source = "clip"
    if clip is None:
        clip, first, source = clip_from_bag(scene, log_dt, meta), 0, "bag"
        note = f"bag odometry and objects ({note})"
    drivable = None
    if source == "clip":
        try:
            drivable = DrivableRaster(clip)
        except Exception as exc:  # noqa: BLE001 - offroad is optional
            note += f"; no offroad check ({exc})"
    acc = olm.OpenLoopAccumulator()
    per_step: list[dict[str, float]] = []
    full = 0
    for c in cycles:
        if c.selected < 0 or c.selected >= len(c.candidates) or not np.isfinite(c.plan_dt):
            continue
        t = first + c.step
        fut = olm.logged_future(clip, t, c.plan_dt, c.candidates.shape[1])
        if drivable is not None:
            row = acc.add(c.candidates, c.selected, fut, drivable(clip.ego_pose(t)), drivable.origin,
                          drivable.resolution)
        else:
            row = acc.add(c.candidates, c.selected, fut)
        if row:
            full += bool(fut.ego_valid.all())
            per_step.append({"step": c.step, **row})
    return {**acc.summary(), "samples_full_horizon": full, "future_source": source,
            "future_note": note, "per_step": per_step}


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------


def plot_plans(cycles: list[Cycle], scene: LoggedScene, png: Path, title: str, every: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rad2_planner.geometry import ego_to_world

    fig, ax = plt.subplots(figsize=(9, 7))
    ax.plot(scene.ego[:, 0], scene.ego[:, 1], "k-", lw=2, label="logged ego")
    for c in cycles:
        if c.step % every or c.candidates.ndim != 3 or not len(c.candidates):
            continue
        pose = scene.ego[c.step]
        for cand in c.candidates:
            w = ego_to_world(cand, pose)
            ax.plot(w[:, 0], w[:, 1], color="0.7", lw=0.5, alpha=0.5)
        if c.selected >= 0:
            w = ego_to_world(c.candidates[c.selected], pose)
            ax.plot(w[:, 0], w[:, 1], "-", color="tab:blue", lw=1.5)
        else:
            ax.plot(pose[0], pose[1], "rx")
    ax.plot([], [], color="tab:blue", label=f"selected plan (every {every} steps)")
    ax.plot([], [], color="0.7", label="candidates")
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_timeline(cycles: list[Cycle], per_step: list[dict[str, float]], png: Path, title: str) -> None:
    """Wall latency per step, and ADE/FDE (selected and best of M) per step with collision marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    steps = [c.step for c in cycles]
    lat = [c.wall_latency_ms if c.wall_latency_ms is not None else np.nan for c in cycles]
    axes[0].plot(steps, lat, ".-", label="input published -> candidates received (wall)")
    axes[0].set_ylabel("ms")
    axes[0].legend(loc="upper right")
    ax = axes[1]
    if per_step:
        x = np.array([r["step"] for r in per_step])
        for key, style in (("ADE", "-"), ("FDE", "-"), ("minADE", "--"), ("minFDE", "--")):
            y = np.array([r.get(key, np.nan) for r in per_step])
            color = "tab:blue" if "ADE" in key else "tab:orange"
            label = f"{key} ({'selected' if key[0] != 'm' else 'best of M'})"
            ax.plot(x, y, style, marker=".", ms=3, color=color, lw=1.2, label=label)
        hit = np.array([r.get("CR", 0.0) > 0 for r in per_step])
        if hit.any():
            y = np.array([r["FDE"] for r in per_step])
            ax.plot(x[hit], y[hit], "rx", ms=7, label="selected plan collides (CR)")
        ax.legend(loc="upper right", fontsize=8, ncol=2)
    else:
        ax.text(0.5, 0.5, "no open-loop metrics", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("log step")
    ax.set_ylabel("displacement error vs logged ego (m)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    import yaml

    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in items:
        key, sep, value = item.partition("=")
        node, dot, param = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {item!r}: expected NODE.PARAM=VALUE (planner.planner.deadline_ms=80)")
        out[node][param] = yaml.safe_load(value)
    return dict(out)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def replay(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from tqdm import tqdm

    console = Console()
    steps, scene, meta = read_replay_bag(args.bag, args.max_steps)
    map_file = args.map_file or meta.get("map_file")
    clip_id = args.clip_id or meta.get("clip_id", "first")
    if not map_file:
        raise ReplayError(f"bag {args.bag} names no map (rad2.map_file in metadata.yaml); pass --map-file")
    if not Path(map_file).exists():
        raise ReplayError(f"map file {map_file} (from the bag metadata) does not exist; pass --map-file")
    log_dt = float(meta.get("dt", np.median(np.diff(scene.stamps_ns)) * 1e-9 if len(steps) > 1 else 0.1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = _parse_overrides(args.set or [])
    graph = make_graph(str(map_file), str(clip_id), args.domain_id, out / "logs", overrides, args.composed)
    mode = f"real time x{args.rate:g}" if args.realtime else "as fast as possible"
    console.print(f"replaying {len(steps)} steps of {args.bag} ({mode}) through {PERCEPTION_NODE} + "
                  f"{PLANNER_NODE}, ROS_DOMAIN_ID={args.domain_id}")
    t_start = time.perf_counter()
    with graph:
        ready_s = graph.wait_ready(timeout=args.startup_timeout)
        player = Player(steps, out / "outputs", args.record_perception, args.realtime, args.rate,
                        args.step_timeout, args.first_step_timeout)
        try:
            player.wait_for_outputs(args.startup_timeout)
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
    metrics = open_loop_summary(cycles, scene, log_dt, {**meta, "map_file": map_file, "clip_id": clip_id})
    diag_summary = latency.summarise(player.diagnostics) if player.diagnostics else {}
    wall = latency.stats(c.wall_latency_ms for c in cycles if c.wall_latency_ms is not None)
    report = {
        "bag": str(args.bag), "mode": mode, "steps": len(steps), "plans_received": len(cycles),
        "steps_without_plan": len(steps) - len(cycles), "unmatched_outputs": player.unmatched,
        "startup_s": ready_s, "play_s": play_s, "total_s": time.perf_counter() - t_start,
        "steps_per_s": len(steps) / play_s if play_s > 0 else None,
        "open_loop": metrics, "wall_latency_ms": wall, "diagnostics": diag_summary,
        "map_file": str(map_file), "clip_id": clip_id, "outputs_bag": str(out / "outputs"),
    }
    (out / "replay_eval.json").write_text(json.dumps(_jsonable(report), indent=1))
    # -- tables and plots
    table = Table(title=f"open-loop metrics: {args.bag}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, (label, unit) in METRIC_LABELS.items():
        if key in metrics:
            value = metrics[key]
            table.add_row(f"{label} ({unit})", f"{value:.2f}" if unit == "%" else f"{value:.3f}")
    if "samples" in metrics:
        table.add_row("scored plans (with full horizon)",
                      f"{int(metrics['samples'])} ({metrics['samples_full_horizon']})")
        table.add_row("logged future from", str(metrics["future_source"]))
    if "error" in metrics:
        table.add_row("error", str(metrics["error"]))
    table.add_row("fallback cycles", str(metrics.get("fallback_cycles", 0)))
    table.add_row("steps / plans received", f"{len(steps)} / {len(cycles)}")
    table.add_row("wall latency p50 / p90 / p99 (ms)",
                  " / ".join(f"{wall[q]:.1f}" for q in ("p50", "p90", "p99")))
    table.add_row("replay speed (steps/s)", f"{report['steps_per_s']:.1f}")
    console.print(table)
    if diag_summary:
        deadline = latency.default_deadline()
        latency.print_tables(diag_summary, deadline, "planning diagnostics")
        latency.plot_histograms(player.diagnostics, out / "latency.png", deadline,
                               f"replay of {Path(args.bag).name}: planner latency")
    plot_plans(cycles, scene, out / "plans.png", f"replay of {Path(args.bag).name}: plans vs log")
    plot_timeline(cycles, metrics.get("per_step", []), out / "timeline.png",
                  f"replay of {Path(args.bag).name}")
    console.print(f"wrote {out / 'replay_eval.json'}, {out}/*.png and the bag {out / 'outputs'}")
    if len(cycles) < len(steps) and not args.realtime:
        console.print(f"[yellow]{len(steps) - len(cycles)} step(s) got no plan within --step-timeout")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bag", required=True, help="bag of perception inputs (tools/clip_to_bag.py)")
    parser.add_argument("--out", help="output directory (default runs/replay/<bag name>)")
    parser.add_argument("--realtime", action="store_true",
                        help="play on the bag's timeline instead of lock-step")
    parser.add_argument("--rate", type=float, default=1.0, help="speed factor of --realtime (default 1)")
    parser.add_argument("--max-steps", type=int, help="replay only the first N steps")
    parser.add_argument("--step-timeout", type=float, default=5.0,
                        help="lock-step mode: seconds to wait for a step's plan (default %(default)s)")
    parser.add_argument("--first-step-timeout", type=float, default=30.0,
                        help="the same for the first step (model warm-up; default %(default)s)")
    parser.add_argument("--startup-timeout", type=float, default=60.0,
                        help="seconds for the nodes to come up (default %(default)s)")
    parser.add_argument("--map-file", help="override the bag's rad2.map_file (clip .npz or dataset dir)")
    parser.add_argument("--clip-id", help="override the bag's rad2.clip_id")
    parser.add_argument("--set", action="append", metavar="NODE.PARAM=VALUE",
                        help="parameter override for a node of the graph (repeatable)")
    parser.add_argument("--composed", action="store_true", help="run both nodes in one process (executor)")
    parser.add_argument("--record-perception", action="store_true",
                        help="also record perception/scene_tokens and bev_features into the output bag")
    parser.add_argument("--domain-id", type=int, default=None,
                        help="ROS_DOMAIN_ID for the replay graph (default: 100 + pid %% 100, isolated)")
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    if args.domain_id is None:
        args.domain_id = 100 + os.getpid() % 100
        argv += ["--domain-id", str(args.domain_id)]
    if args.out is None:
        args.out = str(ROOT / "runs" / "replay" / Path(args.bag).resolve().name)
    try:
        bags.resolve_bag_path(args.bag)  # fail fast on a missing bag, before any environment work
        ensure_ros_environment(__file__, argv, args.domain_id)
        return replay(args)
    except (ReplayError, RecordError, bags.BagError, ValueError) as exc:
        print(f"replay_eval: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # bring-up failures (BringupError) and the like
        if type(exc).__name__ in ("BringupError", "GraphError", "RosEnvironmentError"):
            print(f"replay_eval: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
