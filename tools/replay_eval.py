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
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rad2_planner import bags, latency
from rad2_planner.config import parse_node_overrides
from rad2_planner.input_bags import TOPIC_CLOCK, TOPIC_OBJECTS
from rad2_planner.nodes.recording import Recorder, RecordError, message_class, open_writer
from rad2_planner.replay import (
    Cycle,
    LoggedScene,
    ReplayError,
    Step,
    open_loop_summary,
    read_replay_bag,
)
from rad2_planner.rosenv import ensure_ros_environment

ROOT = Path(__file__).resolve().parents[1]


TOPIC_CANDIDATES = "/planning/candidates"
TOPIC_DIAGNOSTICS = "/planning/diagnostics"
OUTPUT_TOPICS = [TOPIC_CANDIDATES, "/planning/trajectory", "/planning/path", "/planning/markers",
                 TOPIC_DIAGNOSTICS]
PERCEPTION_OUTPUTS = ["/perception/scene_tokens", "/perception/bev_features"]
GRAPH = "replay"
PERCEPTION_NODE, PLANNER_NODE = "bev_features", "planner"


# --------------------------------------------------------------------------------------------------
# Graph side
# --------------------------------------------------------------------------------------------------


def make_graph(map_file: str, clip_id: str, domain_id: int, log_dir: Path,
               overrides: dict[str, dict[str, Any]], composed: bool) -> Any:
    """The replay graph via tools/bringup.py."""
    from rad2_planner.bringup import Bringup

    return Bringup(GRAPH, args={"map_file": map_file, "clip_id": clip_id}, domain_id=domain_id,
                   log_dir=log_dir, overrides=overrides, composed=composed)


# --------------------------------------------------------------------------------------------------
# Player
# --------------------------------------------------------------------------------------------------


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
        self.writer = open_writer(out_bag, overwrite=True)  # chunked + fsynced: a kill loses <= 1 chunk
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


#: Summary keys of OpenLoopAccumulator shown in the table, with units.
METRIC_LABELS = {
    "ADE": ("ADE selected", "m"), "FDE": ("FDE selected", "m"),
    "minADE": ("minADE (best of M)", "m"), "minFDE": ("minFDE (best of M)", "m"),
    "CR": ("CR collision rate", "%"), "DCR": ("DCR dynamic", "%"), "SCR": ("SCR static", "%"),
    "coll_any": ("candidates colliding", "%"), "offroad": ("offroad (selected)", "%"),
}


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
    overrides = parse_node_overrides(args.set or [])
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
