"""ROS 2 wrapper of the BEV-Warp simulator (node ``bev_warp_sim``): drives the ROS graph closed-loop.

Per simulated step (``sim.dt``, paced at ``node.realtime_factor`` x real time) it publishes
``/clock`` (the simulated time: clip k starts where clip k-1 ended), ``localization/odometry``
(nav_msgs/Odometry, box centre in ``map``), ``perception/bev_features`` (rad2_msgs/BevFeatures: the
logged features warped to the simulated pose) and ``perception/scene_tokens`` (rad2_msgs/SceneTokens),
then integrates the kinematic bicycle with the latest rad2_msgs/ControlCommand from ``control/command``
(acceleration, steering angle reached through the steering-rate limit). A malformed command is
counted, reported (throttled) and ignored: the last valid one is held; with no valid command for
``node.stale_command_s`` of simulated time the ego brakes at ``node.brake_decel``. At a clip start the
clock waits up to ``node.wait_for_first_command_s`` (wall) for the first command. Each finished clip
publishes its episode result as JSON (std_msgs/String, ``sim/episode_result``); after the last clip a
summary with the split metrics (``{"done": true, ...}``) follows. Message conversion goes through
``rad2_planner.ros_conversions``.
"""

from __future__ import annotations

import json
import time

import numpy as np
import rclpy
from nav_msgs.msg import Odometry
from rad2_msgs.msg import BevFeatures, ControlCommand, SceneTokens
from rad2_planner import ros_conversions as rc
from rad2_planner.config import load_params
from rad2_planner.nodes.common import (
    Throttle,
    command_qos,
    declare_parameters,
    report_qos,
    run_node,
    sensor_qos,
)
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String

from bev_warp_sim.metrics import aggregate
from bev_warp_sim.simulator import Controls, Simulator

NODE_NAME = "bev_warp_sim"


class SimNode(Node):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        values = declare_parameters(self, ["sim"])
        self.params = values
        cfg = values["node"]
        self.cfg = cfg
        self.bev_params = load_params("bev")
        self.sim = Simulator(values, self.bev_params)
        self.dt = self.sim.dt
        self.grid = rc.BevGrid.from_params(self.bev_params["bev"])
        self.channels = list(self.bev_params["bev"]["channels"])
        self.throttle = Throttle(2.0)
        self.rejected = 0
        self.clips = self._load_clips()
        self.results = []
        self.clip_index = -1
        self.state = None
        self.sim_time_ns = 0
        self.cmd: rc.ControlCommandValues | None = None
        self.cmd_sim_ns = -1
        self.clip_start_wall = 0.0
        self.finished = False
        self.pub_clock = self.create_publisher(Clock, "/clock", 10)
        self.pub_odom = self.create_publisher(Odometry, "localization/odometry", sensor_qos())
        self.pub_bev = self.create_publisher(BevFeatures, "perception/bev_features", sensor_qos())
        self.pub_tokens = self.create_publisher(SceneTokens, "perception/scene_tokens", sensor_qos())
        self.pub_result = self.create_publisher(String, "sim/episode_result", report_qos())
        self.create_subscription(ControlCommand, "control/command", self.on_command, command_qos())
        period = self.dt / max(float(cfg["realtime_factor"]), 1e-3)
        self.create_timer(period, self.on_timer)
        self._next_clip()
        self.get_logger().info(
            f"bev_warp_sim ready: {len(self.clips)} clips from {cfg['dataset']}, dt {self.dt} s, "
            f"x{float(cfg['realtime_factor']):g} real time")

    # -- setup ----------------------------------------------------------------------------------------
    def _load_clips(self):
        from rad2_planner.clip import load_dataset

        clips = load_dataset(self.cfg["dataset"])
        wanted = [c.strip() for c in str(self.cfg["clip_ids"]).split(",") if c.strip()]
        if wanted:
            known = {c.clip_id for c in clips}
            missing = [c for c in wanted if c not in known]
            if missing:
                raise ValueError(f"node.clip_ids: {missing} not in dataset {self.cfg['dataset']}")
            clips = [c for c in clips if c.clip_id in wanted]
        if int(self.cfg["max_clips"]) > 0:
            clips = clips[: int(self.cfg["max_clips"])]
        if not clips:
            raise ValueError(f"node.dataset: {self.cfg['dataset']} has no clips to drive")
        return clips

    def _next_clip(self) -> None:
        self.clip_index += 1
        if self.clip_index >= len(self.clips):
            self._finish()
            return
        clip = self.clips[self.clip_index]
        start = min(int(self.cfg["start_step"]), clip.num_steps - 2)
        self.state = self.sim.init([clip], [start])
        self.cmd = None
        self.cmd_sim_ns = -1
        self.clip_start_wall = time.monotonic()
        self._publish_observation()

    def _finish(self) -> None:
        self.finished = True
        self.state = None
        summary = {"done": True, "num_clips": len(self.results), "rejected_commands": self.rejected}
        if self.results:
            summary["metrics"] = aggregate(self.results, self.params)
        self.pub_result.publish(String(data=json.dumps(summary)))
        self.get_logger().info(f"all clips done: {json.dumps(summary.get('metrics', {}))}")
        if bool(self.cfg["exit_when_done"]):
            self.create_timer(1.0, self._exit)  # wall-clock grace so the summary reaches subscribers

    def _exit(self) -> None:
        raise SystemExit(0)

    # -- inputs ---------------------------------------------------------------------------------------
    def on_command(self, msg: ControlCommand) -> None:
        try:
            cmd = rc.control_command_from_msg(msg)
        except (rc.MessageValidationError, ValueError) as exc:
            self.rejected += 1
            if self.throttle("bad_command"):
                self.get_logger().warning(f"rejected control command ({self.rejected} so far): {exc}")
            return
        self.cmd = cmd
        self.cmd_sim_ns = self.sim_time_ns

    # -- loop -----------------------------------------------------------------------------------------
    def _control(self) -> np.ndarray:
        """(accel, steering rate) for this step from the held command, or a brake when stale."""
        veh = self.sim.controller.vehicle
        ego = self.state.ego[0]
        age_s = (self.sim_time_ns - self.cmd_sim_ns) / 1e9
        stale = self.cmd is None or age_s > float(self.cfg["stale_command_s"])
        if stale:
            if self.cmd is not None and self.throttle("stale"):
                self.get_logger().warning("control command stale: braking")
            return np.array([-float(self.cfg["brake_decel"]), 0.0])
        rate = (float(self.cmd.steering_angle) - ego[4]) / self.dt
        rate = float(np.clip(rate, -veh.max_steer_rate, veh.max_steer_rate))
        return np.array([float(self.cmd.acceleration), rate])

    def on_timer(self) -> None:
        if self.finished or self.state is None:
            return
        waited = time.monotonic() - self.clip_start_wall
        if self.cmd is None and waited < float(self.cfg["wait_for_first_command_s"]):
            self._publish_observation()  # the clock holds until the graph answers
            return
        u = self._control()
        self.state = self.sim.commit(self.state, {0: Controls(u[None, :])}, h_reuse=1)
        self.state, _ = self.sim.step(self.state)
        self.sim_time_ns += int(round(self.dt * 1e9))
        if self.state.done[0]:
            res = self.state.results[0]
            self.results.append(res)
            payload = {"index": self.clip_index, "of": len(self.clips), **res.as_dict()}
            self.pub_result.publish(String(data=json.dumps(payload)))
            self.get_logger().info(
                f"clip {res.clip_id} done: {res.termination}, collided={res.collided}, "
                f"min_ttc={res.min_ttc:.2f}, rho={res.rho:.3f}")
            self._next_clip()
            return
        self._publish_observation()

    def _publish_observation(self) -> None:
        stamp = self.sim_time_ns
        self.pub_clock.publish(Clock(clock=rc.ns_to_time(stamp)))
        st = self.state
        ego = st.ego[0]
        es = self.sim.ego_state_vector(st)[0]
        self.pub_odom.publish(rc.odometry_to_msg(rc.EgoMotion(
            float(ego[0]), float(ego[1]), float(ego[2]), float(ego[3]), float(es[2]), stamp,
            str(self.cfg["map_frame_id"]), str(self.cfg["frame_id"]))))
        obs = self.sim.observe(st)[0]
        frame = str(self.cfg["frame_id"])
        self.pub_bev.publish(rc.bev_to_msg(obs.bev, self.grid, self.channels, stamp, frame))
        tokens = rc.SceneTokenArrays.from_observation(obs, stamp, str(self.cfg["frame_id"]))
        self.pub_tokens.publish(rc.scene_tokens_to_msg(tokens))


def main(args=None) -> int:
    try:
        return run_node(SimNode, args)
    except SystemExit as exc:
        rclpy.try_shutdown()
        return int(exc.code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
