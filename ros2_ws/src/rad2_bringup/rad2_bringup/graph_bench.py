"""Input -> trajectory latency of the planner node in a ROS 2 graph (rclpy; needs the built workspace).

The planner node runs as its own process (the ``planner`` node of launch/graphs.yaml, wall clock, the
parameter files a vehicle uses); this process plays perception inputs into it over DDS and listens to
its outputs, as a perception stack and a recorder would on a vehicle:
- inputs: BEV features + scene tokens of consecutive log steps of real clips (the ego follows its log),
  built once before the run so the player costs only the publish; each pair is stamped with the wall
  clock at the moment it is published, at ``rate_hz`` (10 Hz, the planner's input period);
- figure: arrival time of ``planning/trajectory`` minus the stamp of the input it was planned from
  (the planner echoes the input stamp), the same definition as the demo monitor's "input ->
  trajectory"; plus the node's own per-stage timings from ``planning/diagnostics``;
- ``subscribe_all``: also subscribe to the candidate set and the markers (a recorder on the vehicle),
  so the planner builds and publishes them too.

The CLI is rad2 bench graph; rad2 bench all runs it as the "graph" stage.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from rad2_evaluation.benchmarking import RunContext, percentiles


def recorded_inputs(data: str, steps: int, frame_id: str) -> list[tuple[Any, Any]]:
    """(BevFeatures, SceneTokens) messages of the first ``steps`` consecutive log steps of the clips of
    ``data`` (clip after clip), stamps to be set when published."""
    from rad2_core.bev import snapshot_from_clip
    from rad2_core.config import load_merged, resource_path
    from rad2_core.observation import build_observation
    from rad2_core.storage import iter_dataset
    from rad2_ros import conversions as rc

    bev_params = load_merged("bev", "vehicle")
    grid = rc.BevGrid.from_params(bev_params["bev"])
    channels = tuple(bev_params["bev"]["channels"])
    msgs = []
    for clip in iter_dataset(resource_path(data)):
        for t in range(clip.num_steps):
            obs = build_observation(snapshot_from_clip(clip, t, bev_params, bev_params), params=bev_params)
            msgs.append((rc.bev_to_msg(obs.bev, grid, channels, 0, frame_id),
                         rc.scene_tokens_to_msg(rc.SceneTokenArrays.from_observation(obs, 0, frame_id))))
            if len(msgs) >= steps:
                return msgs
    if not msgs:
        raise SystemExit(f"--data {data}: no clips")
    return msgs


def run_graph_benchmark(*, data: str = "data/eval_efficiency", cycles: int = 300, warmup: int = 20,
                        rate_hz: float = 10.0, subscribe_all: bool = True, domain_id: int,
                        log_dir: Path | None = None) -> dict[str, Any]:
    """Bring the planner node up on ROS domain ``domain_id``, play ``warmup + cycles`` inputs into it
    and return the figures."""
    from rad2_core.config import load_params
    from rad2_ros import conversions as rc
    from rad2_ros.latency import diagnostics_record
    from rich.progress import Progress

    from rad2_bringup.bringup import Bringup

    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    import rclpy
    from rad2_msgs.msg import BevFeatures, CandidateSet, PlanningDiagnostics, SceneTokens, Trajectory
    from rad2_ros.nodes.common import command_qos, report_qos, sensor_qos
    from visualization_msgs.msg import MarkerArray

    params = load_params("planner")
    # the frame the perception node stamps its BEV and tokens with
    frame_id = str(load_params("nodes")["perception"]["frame_id"])
    total = warmup + cycles
    print(f"building {total} inputs from {data} ...", flush=True)
    inputs = recorded_inputs(data, total, frame_id)
    ctx = RunContext.start(int(params["runtime"]["ort_intra_op_threads"]), probe=False)

    sent_ns: dict[int, int] = {}
    arrived_ns: dict[int, int] = {}
    diags: dict[int, dict[str, Any]] = {}
    bringup = Bringup("vehicle", only=["planner"], domain_id=domain_id, log_dir=log_dir)
    rclpy.init()
    node = rclpy.create_node("rad2_graph_bench")
    try:
        pub_bev = node.create_publisher(BevFeatures, "perception/bev_features", sensor_qos())
        pub_tokens = node.create_publisher(SceneTokens, "perception/scene_tokens", sensor_qos())

        def on_trajectory(msg: Trajectory) -> None:
            arrived_ns.setdefault(rc.time_to_ns(msg.header.stamp), time.time_ns())

        def on_diagnostics(msg: PlanningDiagnostics) -> None:
            rec = diagnostics_record(msg, time.time_ns())
            diags[int(rec["input_stamp_ns"])] = rec

        node.create_subscription(Trajectory, "planning/trajectory", on_trajectory, command_qos())
        node.create_subscription(PlanningDiagnostics, "planning/diagnostics", on_diagnostics, report_qos(50))
        if subscribe_all:
            node.create_subscription(CandidateSet, "planning/candidates", lambda _m: None, command_qos())
            node.create_subscription(MarkerArray, "planning/markers", lambda _m: None, report_qos(2))
        bringup.start()
        ready_s = bringup.wait_ready(timeout=120.0)
        print(f"planner node up in {ready_s:.1f} s (logs: {bringup.log_dir})", flush=True)
        # the planner must see the publishers before the first timed input
        deadline = time.monotonic() + 30.0
        while pub_bev.get_subscription_count() == 0 and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.05)
        period_ns = int(1e9 / rate_hz)
        next_ns = time.monotonic_ns()
        with Progress() as progress:
            task = progress.add_task("inputs -> planner", total=total)
            for i, (bev_msg, tokens_msg) in enumerate(inputs):
                while (wait := next_ns - time.monotonic_ns()) > 0:
                    rclpy.spin_once(node, timeout_sec=wait / 1e9)
                stamp = time.time_ns()
                bev_msg.header.stamp = tokens_msg.header.stamp = rc.ns_to_time(stamp)
                pub_bev.publish(bev_msg)
                pub_tokens.publish(tokens_msg)
                if i >= warmup:
                    sent_ns[stamp] = i
                next_ns += period_ns
                progress.update(task, completed=i + 1)
                bringup.check_alive()
        end = time.monotonic() + 2.0  # the last outputs
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        bringup.stop()
    ctx.finish()

    latency = [(arrived_ns[s] - s) / 1e6 for s in sent_ns if s in arrived_ns]
    recs = [diags[s] for s in sent_ns if s in diags]
    stages: dict[str, list[float]] = {}
    for rec in recs:
        for key, ms in rec["stages"].items():
            stages.setdefault(key, []).append(float(ms))
    deadline_ms = float(params["planner"]["deadline_ms"])
    return {
        "meta": {"data": data, "cycles": cycles, "warmup": warmup, "rate_hz": rate_hz,
                 "subscribe_all": subscribe_all, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "run": ctx.to_dict(), "load_avg": [ctx.load_before, ctx.load_after],
                 "checkpoint": str(params["planner"]["checkpoint_dir"]),
                 "num_candidates": int(params["planner"]["num_candidates"])},
        "sent": len(sent_ns), "planned": len(latency),
        "fallbacks": sum(1 for r in recs if r["fallback_active"]),
        "deadline_misses": int(np.sum(np.asarray(latency) > deadline_ms)) if latency else 0,
        "input_to_trajectory_ms": percentiles(latency) if latency else None,
        "latency_samples_ms": [round(v, 3) for v in latency],
        "stages_ms": {k: percentiles(v) for k, v in stages.items()},
    }
