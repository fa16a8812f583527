"""Driver of tests/ros/test_fault_injection.py (its own process in the ROS environment).

Plays the vehicle around the real vehicle graph (perception ``bev_features``, ``planner``,
``controller``, ``supervisor``, each its own process): odometry at 50 Hz and object lists at 10 Hz from
a clip (open loop: the ego follows the log), and injects one fault at a time, each followed by good
input again: impossible odometry (speed 1e6 m/s, yaw rate 1e9, a 1 km jump, an empty message with stamp
0), a BEV cell of 1e30 (the last perception pair re-sent with a fresh stamp), trajectories to the
controller with dt 1000 s / 1e-6 s, a point at 1e6 m, reversed, all zero or of 10,000 points, scene
tokens that are empty, in the world frame or reversing at 30 m/s, an object list in the ego frame,
odometry clock faults
(stamps 2 s back or 10 s ahead for 0.5 s, one sample 10 s ahead, 1 h ahead for 0.5 s), a 0.5 s burst
of 1e6 m/s odometry, odometry lost or frozen (stamps advance, the pose stands still) for 0.5 s and
2 s while the ego drives on, an odometry flood (1,000 samples/s for 5 s), planner starvation
(perception SIGSTOPped, scene tokens only, then SIGCONT), and finally SIGKILL of the planner. It
records, on its own monotonic clock, every command, trajectory, planner diagnostics report and every
non-OK /diagnostics status, and prints ``RESULT {json}``.

Usage: fault_driver.py DATASET_NPZ PLANNER_PID PERCEPTION_PID
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
from rad2_core.storage import load_clip, read_index
from rad2_msgs.msg import (
    BevFeatures,
    ControlCommand,
    PerceptionInputs,
    PlanningDiagnostics,
    SceneTokens,
    Trajectory,
)
from rad2_ros import conversions as rc
from rad2_ros.nodes.common import command_qos, report_qos, sensor_qos

DATASET, PLANNER_PID, PERCEPTION_PID = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
WINDOW_S = 1.3  # each fault, then good input until the next one
FLOOD_S = 5.0  # the odometry flood
ODOM_PERIOD, OBJECTS_PERIOD = 0.02, 0.1

_entry = read_index(DATASET)["clips"][0]
clip = load_clip(os.path.join(DATASET, _entry["file"]), maps_dir=os.path.join(DATASET, "maps"))
rclpy.init()
node = rclpy.create_node("fault_driver")
pub_odom = node.create_publisher(Odometry, "localization/odometry", command_qos())
pub_obj = node.create_publisher(PerceptionInputs, "perception/objects", command_qos())
pub_bev = node.create_publisher(BevFeatures, "perception/bev_features", command_qos())
pub_tok = node.create_publisher(SceneTokens, "perception/scene_tokens", command_qos())
pub_traj = node.create_publisher(Trajectory, "planning/trajectory", command_qos())

rec: dict = {"commands": [], "trajs": [], "plan_diags": [], "statuses": [], "faults": [], "ok_counts": {}}
last: dict = {}
T0 = time.monotonic()


def now_s() -> float:
    return time.monotonic() - T0


def on_cmd(m: ControlCommand) -> None:
    rec["commands"].append((now_s(), m.acceleration, m.steering_angle, m.steering_rate, m.target_speed,
                            bool(m.emergency_stop), m.reason[:300], rc.time_to_ns(m.header.stamp)))


def on_traj(m: Trajectory) -> None:
    rec["trajs"].append((now_s(), rc.time_to_ns(m.header.stamp)))


def on_plan_diag(m: PlanningDiagnostics) -> None:
    d = rc.planning_diagnostics_from_msg(m)
    rec["plan_diags"].append((now_s(), d["fallback_active"], d["fallback_reason"][:300],
                              d["deadline_miss_count"], d["rejected_input_count"], d["input_stamp_ns"],
                              d["total_ms"]))


def on_diag(m: DiagnosticArray) -> None:
    t = now_s()
    for st in m.status:
        level = st.level[0] if isinstance(st.level, bytes) else int(st.level)
        if level == 0:
            rec["ok_counts"][st.name] = rec["ok_counts"].get(st.name, 0) + 1
        else:
            rec["statuses"].append((t, st.name, level, st.message[:400]))


def on_bev(m: BevFeatures) -> None:
    last["bev"] = m


def on_tok(m: SceneTokens) -> None:
    last["tok"] = m


node.create_subscription(ControlCommand, "control/command", on_cmd, report_qos(100))
node.create_subscription(Trajectory, "planning/trajectory", on_traj, command_qos())
node.create_subscription(PlanningDiagnostics, "planning/diagnostics", on_plan_diag, report_qos(100))
node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, report_qos(200))
node.create_subscription(BevFeatures, "perception/bev_features", on_bev, sensor_qos())
node.create_subscription(SceneTokens, "perception/scene_tokens", on_tok, sensor_qos())

# -- the logged drive, at continuous time ------------------------------------------------------------
t_log = np.arange(clip.num_steps) * clip.dt
yaw_log = np.unwrap(clip.ego_yaw)
t_start = None  # driver time at which the log starts


def ego_at(t: float) -> rc.EgoMotion:
    x = float(np.interp(t, t_log, clip.ego_x))
    y = float(np.interp(t, t_log, clip.ego_y))
    yaw = float(np.interp(t, t_log, yaw_log))
    v = float(np.interp(t, t_log, clip.ego_speed))
    return rc.EgoMotion(x, y, yaw, v, 0.0, node.get_clock().now().nanoseconds)


def objects_at(t: float) -> PerceptionInputs:
    a = clip.agents_at(min(int(round(t / clip.dt)), clip.num_steps - 1))
    agents = rc.AgentList(a.ids, a.types, a.x, a.y, a.yaw, a.length, a.width, a.vx, a.vy)
    return rc.perception_inputs_to_msg(agents, node.get_clock().now().nanoseconds)


odom_fault: dict = {}
# clock faults of the odometry's sender: (stamp shift in s, how long it lasts in s; 0 = one sample)
CLOCK_FAULTS = {"odom_back_2s": (-2.0, 0.5), "odom_fwd_10s": (10.0, 0.5), "odom_single_fwd_10s": (10.0, 0.0),
                "odom_fwd_1h": (3600.0, 0.5)}
burst: dict = {}  # odometry fault applied to every sample until "until" (driver time)
LOST_OR_FROZEN = {"odom_lost_0.5s": 0.5, "odom_lost_2s": 2.0, "odom_frozen_0.5s": 0.5, "odom_frozen_2s": 2.0}
FLOOD_HZ = 1000.0
flood: dict = {}  # odometry flood: extra valid samples at FLOOD_HZ until "until"
next_odom = next_obj = 0.0
tokens_only = False
skip_objects: dict = {}  # a fault applied to the next object list


def _shifted(msg: Odometry, shift_s: float) -> Odometry:
    msg.header.stamp = rc.ns_to_time(rc.time_to_ns(msg.header.stamp) + int(shift_s * 1e9))
    return msg


def tick() -> None:
    """Publish the drive's odometry and object lists when due (one odometry sample may be a fault)."""
    global next_odom, next_obj
    t = now_s()
    if flood and t < flood["until"]:
        # the flood: valid samples of the drive, FLOOD_HZ of them per second (the pose of this tick,
        # each with its own stamp: the generator's own cost stays small on a 2-core machine)
        msg = rc.odometry_to_msg(ego_at(t - t_start))
        while flood["next"] <= t:
            msg.header.stamp = rc.ns_to_time(node.get_clock().now().nanoseconds)
            pub_odom.publish(msg)
            flood["next"] += 1.0 / FLOOD_HZ
            flood["sent"] += 1
    if t >= next_odom:
        m = ego_at(t - t_start)
        msg = rc.odometry_to_msg(m)
        kind = odom_fault.pop("kind", None)
        if kind is None and burst and t < burst["until"]:
            kind = burst["kind"]
        if kind is not None and kind.startswith("odom_lost"):
            next_odom = t + ODOM_PERIOD
            kind = "lost"  # nothing sent
        elif kind is not None and kind.startswith("odom_frozen"):
            msg = rc.odometry_to_msg(rc.EgoMotion(*burst["frozen"][:5], node.get_clock().now().nanoseconds))
        if kind == "odom_speed_1e6" or kind == "odom_1e6_burst":
            msg.twist.twist.linear.x = 1e6
        elif kind == "odom_yaw_rate_1e9":
            msg.twist.twist.angular.z = 1e9
        elif kind == "odom_jump_1km":
            msg.pose.pose.position.x += 1000.0
        elif kind == "odom_empty":
            msg = Odometry()
        elif kind in CLOCK_FAULTS:
            msg = _shifted(msg, CLOCK_FAULTS[kind][0])
        if kind != "lost":
            pub_odom.publish(msg)
        next_odom = t + ODOM_PERIOD
    if t >= next_obj:
        if not tokens_only:
            msg = objects_at(t - t_start)
            if "frame" in skip_objects:
                msg.header.frame_id = skip_objects.pop("frame")
                rec["faults"][-1] = (now_s(), rec["faults"][-1][1])  # when it actually went out
            pub_obj.publish(msg)
        elif "tok" in last:  # perception is stopped: tokens only, restamped
            tok = last["tok"]
            tok.header.stamp = rc.ns_to_time(node.get_clock().now().nanoseconds)
            pub_tok.publish(tok)
        next_obj = t + OBJECTS_PERIOD


def run(seconds: float) -> None:
    end = now_s() + seconds
    while now_s() < end:
        tick()
        rclpy.spin_once(node, timeout_sec=0.002)


def good_trajectory(speed: float) -> Trajectory:
    pts = np.stack([speed * 0.5 * np.arange(1, 9), np.zeros(8)], axis=1)
    return rc.trajectory_to_msg(pts, 0.5, node.get_clock().now().nanoseconds, "base_link")


def wait_for_a_fresh_trajectory(timeout_s: float = 0.5) -> None:
    n, end = len(rec["trajs"]), now_s() + timeout_s
    while len(rec["trajs"]) == n and now_s() < end:
        run(0.002)
    run(0.01)


def fault(kind: str) -> None:  # noqa: C901 -- one branch per fault kind
    rec["faults"].append((now_s(), kind))
    if kind in CLOCK_FAULTS and CLOCK_FAULTS[kind][1] > 0:
        burst.update(kind=kind, until=now_s() + CLOCK_FAULTS[kind][1])
    elif kind == "odom_1e6_burst":
        burst.update(kind=kind, until=now_s() + 0.5)
    elif kind in LOST_OR_FROZEN:
        m = ego_at(now_s() - t_start)
        burst.update(kind=kind, until=now_s() + LOST_OR_FROZEN[kind], frozen=(m.x, m.y, m.yaw, m.speed, 0.0))
    elif kind.startswith("odom_"):
        odom_fault["kind"] = kind
    elif kind == "bev_1e30":
        # right after a planner trajectory, as for the trajectory faults: the planner is idle and takes
        # this pair at once, instead of finding perception's next pair in its keep-last-1 readers
        # (newest input wins there by design) when a loaded host kept it busy
        wait_for_a_fresh_trajectory()
        rec["faults"][-1] = (now_s(), kind)
        bev, tok = last["bev"], last["tok"]
        stamp = rc.ns_to_time(node.get_clock().now().nanoseconds)
        data = np.frombuffer(bytes(bev.data), dtype=np.float32).copy()
        data[1000] = 1e30  # channel 0 (drivable_area), a cell in its first rows
        bev.data = rc.float32_array(data)
        bev.header.stamp = stamp
        tok.header.stamp = stamp
        pub_bev.publish(bev)
        pub_tok.publish(tok)
    elif kind.startswith("tokens_"):
        # an implausible pair, as bev_1e30: empty tokens, tokens in the world frame, the ego reversing at
        # 30 m/s
        wait_for_a_fresh_trajectory()
        rec["faults"][-1] = (now_s(), kind)
        bev, tok = last["bev"], last["tok"]
        stamp = rc.ns_to_time(node.get_clock().now().nanoseconds)
        bev.header.stamp = stamp
        tok.header.stamp = stamp
        if kind == "tokens_empty":
            tok.map_polylines, tok.agents, tok.route = [], [], []
        elif kind == "tokens_frame_map":
            tok.header.frame_id = "map"
        elif kind == "tokens_reverse_30":
            tok.ego_speed = -30.0
        pub_bev.publish(bev)
        pub_tok.publish(tok)
    elif kind == "objects_frame_base_link":
        skip_objects["frame"] = "base_link"  # the next object list, at its time, in the ego frame
    elif kind.startswith("traj_"):
        # right after a planner trajectory, so the planner's next one comes a cycle later
        wait_for_a_fresh_trajectory()
        rec["faults"][-1] = (now_s(), kind)
        speed = float(clip.ego_speed[0])
        msg = good_trajectory(speed)
        pts = np.stack([speed * 0.5 * np.arange(1, 9), np.zeros(8)], axis=1)
        if kind == "traj_dt_1000":
            msg.dt = 1000.0
        elif kind == "traj_dt_1e-6":
            msg.dt = 1e-6
        elif kind == "traj_point_1e6":
            pts[3] = [1e6, 0.0]
        elif kind == "traj_reversed":
            pts = -pts
        elif kind == "traj_all_zero":
            pts[:] = 0.0
        elif kind == "traj_10000_points":
            pts = np.stack([np.linspace(0.005, 50.0, 10_000), np.zeros(10_000)], axis=1)
            msg = rc.trajectory_to_msg(pts, 0.0005, node.get_clock().now().nanoseconds, "base_link")
        if kind in ("traj_point_1e6", "traj_reversed", "traj_all_zero"):
            msg = rc.trajectory_to_msg(pts, 0.5, node.get_clock().now().nanoseconds, "base_link")
        pub_traj.publish(msg)


def main() -> int:
    global t_start, tokens_only
    # discovery of every node's endpoints, then the drive starts
    end = time.monotonic() + 30
    while time.monotonic() < end and not (
        pub_odom.get_subscription_count() >= 2 and pub_obj.get_subscription_count() >= 1
        and pub_traj.get_subscription_count() >= 1 and node.count_publishers("control/command") >= 1
    ):
        rclpy.spin_once(node, timeout_sec=0.05)
    t_start = now_s()
    # warm-up: until the controller tracks plans (not stopping) for a second, at most 25 s
    end = now_s() + 25
    while now_s() < end:
        run(0.2)
        recent = [c for c in rec["commands"] if c[0] > now_s() - 1.0]
        # tracking: no stop (a flag for the plan's own hard braking names the plan "itself")
        if len(recent) > 15 and not any(c[5] and "itself" not in c[6] for c in recent):
            break
    rec["warm_s"] = now_s() - t_start
    for kind in ("odom_speed_1e6", "odom_yaw_rate_1e9", "odom_jump_1km", "odom_empty", "bev_1e30",
                 "traj_dt_1000", "traj_dt_1e-6", "traj_point_1e6", "traj_reversed", "traj_all_zero",
                 "traj_10000_points", "tokens_empty", "tokens_frame_map", "tokens_reverse_30",
                 "objects_frame_base_link", *CLOCK_FAULTS, "odom_1e6_burst", *LOST_OR_FROZEN):
        fault(kind)
        lasts = CLOCK_FAULTS[kind][1] if kind in CLOCK_FAULTS else (0.5 if kind == "odom_1e6_burst" else 0.0)
        run(WINDOW_S + LOST_OR_FROZEN.get(kind, lasts))
    # an odometry flood: FLOOD_S of FLOOD_HZ valid samples on top of the 50 Hz stream
    rec["faults"].append((now_s(), "flood"))
    flood.update(until=now_s() + FLOOD_S, next=now_s(), sent=0)
    run(FLOOD_S)
    rec["flood_sent"] = flood["sent"]
    rec["faults"].append((now_s(), "flood_end"))
    flood.clear()
    run(1.0)
    # starvation: perception stopped, scene tokens only
    rec["faults"].append((now_s(), "starvation"))
    os.kill(PERCEPTION_PID, signal.SIGSTOP)
    tokens_only = True
    run(1.2)
    tokens_only = False
    os.kill(PERCEPTION_PID, signal.SIGCONT)
    rec["faults"].append((now_s(), "starvation_end"))
    run(2.0)
    # planner killed
    n, end = len(rec["trajs"]), now_s() + 5.0
    while len(rec["trajs"]) == n and now_s() < end:  # kill just after a fresh trajectory
        run(0.005)
    run(0.03)
    os.kill(PLANNER_PID, signal.SIGKILL)
    rec["faults"].append((now_s(), "planner_kill"))
    run(1.5)
    rec["end_s"] = now_s()
    print("RESULT " + json.dumps(rec), flush=True)
    node.destroy_node()
    rclpy.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
