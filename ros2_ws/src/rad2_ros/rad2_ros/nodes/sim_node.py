"""ROS 2 wrapper of the BEV-Warp simulator (node ``bev_warp_sim``): drives the ROS graph closed-loop.

Per simulated step (``sim.dt``, paced at ``node.realtime_factor`` x real time) it publishes
``localization/odometry`` (nav_msgs/Odometry, box centre in ``map``), ``perception/bev_features``
(rad2_msgs/BevFeatures: the logged features warped to the simulated pose) and
``perception/scene_tokens`` (rad2_msgs/SceneTokens), all stamped with the step's time, and only then
``/clock`` at that time, so that a node woken by the clock already has the step's inputs. Between
steps ``/clock`` advances at ``node.clock_rate_hz`` (simulated), so nodes on the simulated clock (the
controller at its 20-50 Hz) run at their own rates; clip k starts where clip k-1 ended.

Commands (rad2_msgs/ControlCommand on ``control/command``) apply from the simulated time they arrive:
a step integrates the kinematic bicycle with the commands of its interval, each held until the next
(acceleration averaged over the interval; steering angle ramped to the command's ``steering_angle``
over one step at most at the steering-rate limit, then held: ``control.estimation.SteeringRamp``, the
model the controller node estimates its steering with). A malformed command is counted,
reported (throttled) and ignored: the last valid one is held; with no valid command for
``node.stale_command_s`` of simulated time the ego brakes at ``node.brake_decel``. At a clip start
the ego is held (the clock runs and the first observation is republished every step with a fresh
stamp) until a command that is not an emergency stop arrives (the graph tracks a plan of this clip),
at most ``node.wait_for_first_command_s`` (wall). Each finished clip publishes its episode result as
JSON (std_msgs/String, ``sim/episode_result``); after the last clip a summary with the split metrics
(``{"done": true, ...}``) follows. Message conversion goes through ``rad2_ros.conversions``.

Clamps: a command beyond the vehicle's limits (acceleration outside [min_accel, max_accel], a steering
angle beyond max_steer, a steering rate beyond max_steer_rate) is applied clamped to them, as the
vehicle would; the first such value of each field in an episode is logged and reported on
``/diagnostics`` (status ``bev_warp_sim``, warn: the field, the value, the limit, the counts), and the
episode result carries ``command_clamps`` (field -> commands clamped) and the summary their total.
"""

from __future__ import annotations

import json
import time

import numpy as np
import rclpy
from bev_warp_sim.metrics import aggregate
from bev_warp_sim.simulator import Simulator
from bev_warp_sim.state import Controls
from nav_msgs.msg import Odometry
from rad2_control.estimation import SteeringRamp
from rad2_core.bicycle import VehicleParams
from rad2_core.config import load_merged, resource_path
from rad2_msgs.msg import BevFeatures, ControlCommand, SceneTokens
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String

from rad2_ros import conversions as rc
from rad2_ros.nodes.common import (
    DiagnosticsReporter,
    Throttle,
    command_qos,
    report_qos,
    run_node,
    sensor_qos,
)
from rad2_ros.nodes.parameters import declare_parameters

NODE_NAME = "bev_warp_sim"
PARAM_FILES = ["sim"]


class _Held:
    """A valid command, the simulated time it arrived and (once in force) its steering ramp.

    The ramp is the controller's own model of its commands (``control.estimation.SteeringRamp``),
    started from the arrival time so that a command arriving mid-step acts for one step from then.
    """

    __slots__ = ("cmd", "t_ns", "ramp")

    def __init__(self, cmd: rc.ControlCommandValues, t_ns: int):
        self.cmd, self.t_ns = cmd, t_ns
        self.ramp: SteeringRamp | None = None

    def start(self, steer: float, dt: float, vehicle: VehicleParams) -> None:
        """The command takes effect with the angle at ``steer``: ramp towards its angle."""
        self.ramp = SteeringRamp.towards(self.t_ns, steer, float(self.cmd.steering_angle), dt, vehicle)


class SimNode(Node):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        values = declare_parameters(self, PARAM_FILES, cli_args=kwargs.get("cli_args"))
        self.params = values
        cfg = values["node"]
        self.cfg = cfg
        # the simulator's other files as they are; sim.yaml's values are the node's declared parameters
        self.bev_params = load_merged("bev", "planner", "controller", "vehicle", "validators")
        self.sim = Simulator({**self.bev_params, **values})
        self.dt = self.sim.dt
        self.grid = rc.BevGrid.from_params(self.bev_params["bev"])
        self.channels = list(self.bev_params["bev"]["channels"])
        self.throttle = Throttle(2.0)
        self.rejected = 0
        self.clamps: dict[str, int] = {}  # field -> commands clamped to the vehicle's limits, this episode
        self.clamps_total = 0
        self.diagnostics = DiagnosticsReporter(self)
        self.clips = self._load_clips()
        self.results = []
        self.clip_index = -1
        self.state = None
        # simulated time starts after 0: a stamp of 0 is an unset stamp, which the validators reject
        self.sim_time_ns = int(round(float(cfg["start_time_s"]) * 1e9))
        # commands by arrival (simulated ns): the one in force at the step start, then later ones
        self.held: _Held | None = None
        self.pending: list[_Held] = []
        self.started = False  # a non-emergency command arrived since the clip start
        self.clip_start_wall = 0.0
        self.clock_ns = self.sim_time_ns  # last published /clock
        self.sub_ticks = int(round(float(cfg["clock_rate_hz"]) * self.dt))
        if self.sub_ticks < 1 or abs(self.sub_ticks - float(cfg["clock_rate_hz"]) * self.dt) > 1e-6:
            raise ValueError(f"node.clock_rate_hz: {cfg['clock_rate_hz']} must be a positive multiple of "
                             f"1 / sim.dt = {1.0 / self.dt:g} Hz")
        self.factor = max(float(cfg["realtime_factor"]), 1e-3)
        self.tick_ns = int(round(self.dt * 1e9)) // self.sub_ticks
        self.finished = False
        self.pub_clock = self.create_publisher(Clock, "/clock", 10)
        self.pub_odom = self.create_publisher(Odometry, "localization/odometry", sensor_qos())
        self.pub_bev = self.create_publisher(BevFeatures, "perception/bev_features", sensor_qos())
        self.pub_tokens = self.create_publisher(SceneTokens, "perception/scene_tokens", sensor_qos())
        self.pub_result = self.create_publisher(String, "sim/episode_result", report_qos())
        self.create_subscription(ControlCommand, "control/command", self.on_command, command_qos())
        self._next_clip()
        self.anchor = (time.monotonic(), self.sim_time_ns)  # (wall s, simulated ns) of the pacing
        self.create_timer(self.tick_ns / 1e9 / self.factor, self.on_timer)
        self.get_logger().info(
            f"bev_warp_sim ready: {len(self.clips)} clips from {cfg['dataset']}, dt {self.dt} s, "
            f"/clock at {float(cfg['clock_rate_hz']):g} Hz, x{self.factor:g} real time")

    # -- setup ----------------------------------------------------------------------------------------
    def _load_clips(self):
        from rad2_core.storage import load_dataset

        clips = load_dataset(resource_path(self.cfg["dataset"]))  # sim.yaml names data/eval_safety
        wanted = [c.strip() for c in str(self.cfg["clip_ids"]).split(",") if c.strip()]
        if wanted:
            known = {c.clip_id for c in clips}
            missing = [c for c in wanted if c not in known]
            if missing:
                raise ValueError(f"node.clip_ids: {missing} not in dataset {self.cfg['dataset']}")
            clips = [c for c in clips if c.clip_id in wanted]
        if int(self.cfg["max_clips"]) > 0:
            clips = clips[: int(self.cfg["max_clips"])]
        # a clip that logs the impossible would stop the simulator at its start, mid-run: refuse it
        # here, say which and why, and drive the others (validators.check_clip, as Simulator.init)
        from rad2_core.validators import PlausibilityError, check_clip, load_limits

        limits, drivable = load_limits(self.bev_params), []
        for clip in clips:
            bad = check_clip(clip, limits)
            if bad:
                what = f"clip {clip.clip_id!r} skipped, not a drivable log"
                self.get_logger().error(str(PlausibilityError(what, bad)))
            else:
                drivable.append(clip)
        if not drivable:
            raise ValueError(f"node.dataset: {self.cfg['dataset']} has no clips to drive")
        return drivable

    def _next_clip(self) -> None:
        self.clip_index += 1
        if self.clip_index >= len(self.clips):
            self._finish()
            return
        clip = self.clips[self.clip_index]
        start = min(int(self.cfg["start_step"]), clip.num_steps - 2)
        self.state = self.sim.init([clip], [start])
        self.held = None
        self.pending = []
        self.started = False
        self.clip_start_wall = time.monotonic()
        self._publish_observation()

    def _finish(self) -> None:
        self.finished = True
        self.state = None
        summary = {"done": True, "num_clips": len(self.results), "rejected_commands": self.rejected,
                   "clamped_commands": self.clamps_total}
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
        self._note_clamps(cmd)
        self.pending.append(_Held(cmd, self.clock_ns))
        if not cmd.emergency_stop:
            self.started = True

    def _note_clamps(self, cmd: rc.ControlCommandValues) -> None:
        """Count the fields of ``cmd`` the vehicle limits will clamp; say so once per field and episode."""
        veh = self.sim.controller.vehicle
        for field, value, lo, hi in (
            ("acceleration", cmd.acceleration, veh.min_accel, veh.max_accel),
            ("steering_angle", cmd.steering_angle, -veh.max_steer, veh.max_steer),
            ("steering_rate", cmd.steering_rate, -veh.max_steer_rate, veh.max_steer_rate),
        ):
            if lo <= value <= hi:
                continue
            first = field not in self.clamps
            self.clamps[field] = self.clamps.get(field, 0) + 1
            self.clamps_total += 1
            if first:
                clip = self.clips[self.clip_index].clip_id if 0 <= self.clip_index < len(self.clips) else "-"
                text = (f"control/command {field} = {value:.6g} beyond the vehicle's [{lo:g}, {hi:g}]: "
                        f"clamped (clip {clip}; first this episode, counted in command_clamps)")
                self.get_logger().warning(text)
                self.diagnostics.publish("warn", text, {f"clamped_{k}": v for k, v in self.clamps.items()})

    # -- loop -----------------------------------------------------------------------------------------
    def _control(self, t0_ns: int, t1_ns: int) -> np.ndarray:
        """(accel, steering rate) that integrate the step [t0, t1] under the commands by arrival."""
        veh = self.sim.controller.vehicle
        stale_ns = int(float(self.cfg["stale_command_s"]) * 1e9)
        steer = float(self.state.ego[0][4])
        records = [self.held, *sorted(self.pending, key=lambda r: r.t_ns)]
        if records[0] is None and len(records) > 1:
            records.pop(0)  # the clip's first command applies from the step start
        starts = [t0_ns] + [min(max(r.t_ns, t0_ns), t1_ns) for r in records[1:]] + [t1_ns]
        accel_dt = 0.0
        stale_warned = False
        for rec, a, b in zip(records, starts[:-1], starts[1:]):
            if rec is not None and rec.ramp is None:  # the command takes effect now: start its ramp
                rec.start(steer, self.dt, veh)
            if b <= a:
                continue
            if rec is None or (b - rec.t_ns) > stale_ns:
                if rec is not None and not stale_warned and self.throttle("stale"):
                    self.get_logger().warning("control command stale: braking")
                    stale_warned = True
                accel_dt -= float(self.cfg["brake_decel"]) * (b - a) / 1e9
                continue  # steering held
            accel_dt += float(rec.cmd.acceleration) * (b - a) / 1e9
            steer = rec.ramp.angle_at(b)
        self.held = records[-1]
        self.pending = []
        rate = (steer - self.state.ego[0][4]) / self.dt
        rate = float(np.clip(rate, -veh.max_steer_rate, veh.max_steer_rate))
        return np.array([accel_dt / self.dt, rate])

    def on_timer(self) -> None:
        if self.finished or self.state is None:
            return
        # the simulated time this wall instant stands for (catch up at most one step, never burst)
        wall0, sim0 = self.anchor
        target = sim0 + int((time.monotonic() - wall0) * self.factor * 1e9)
        step_end = self.sim_time_ns + self.sub_ticks * self.tick_ns
        if target - step_end > self.sub_ticks * self.tick_ns:
            target = step_end
            self.anchor = (time.monotonic(), target)
        if target < step_end:
            tick = self.sim_time_ns + (target - self.sim_time_ns) // self.tick_ns * self.tick_ns
            if tick > self.clock_ns:
                self._publish_clock(tick)
            return
        waited = time.monotonic() - self.clip_start_wall
        if not self.started and waited < float(self.cfg["wait_for_first_command_s"]):
            # clip start: hold the ego, let the clock run and show the graph a fresh observation
            self.sim_time_ns = step_end
            self.pending = [r for r in self.pending if not r.cmd.emergency_stop][-1:]
            self._publish_observation()
            return
        u = self._control(self.sim_time_ns, step_end)
        self.state = self.sim.commit(self.state, {0: Controls(u[None, :])}, h_reuse=1)
        self.state, _ = self.sim.step(self.state)
        self.sim_time_ns = step_end
        if self.state.done[0]:
            res = self.sim.episode_result(self.state, 0)
            self.results.append(res)
            # wall_s: how long the clip took on this node's clock (from its start, the hold for the
            # first command included), so a HIL run can check the pacing without discovery delays
            payload = {"index": self.clip_index, "of": len(self.clips), **res.as_dict(),
                       "wall_s": round(time.monotonic() - self.clip_start_wall, 3),
                       "command_clamps": dict(self.clamps)}
            self.diagnostics.publish("warn" if self.clamps else "ok", f"clip {res.clip_id} done" + (
                f": commands clamped to the vehicle's limits {dict(self.clamps)}" if self.clamps else ""),
                {f"clamped_{k}": v for k, v in self.clamps.items()})
            self.clamps = {}  # said once per episode
            self.pub_result.publish(String(data=json.dumps(payload)))
            self.get_logger().info(
                f"clip {res.clip_id} done: {res.termination}, collided={res.collided}, "
                f"min_ttc={res.min_ttc:.2f}, rho={res.rho:.3f}")
            self._next_clip()
            return
        self._publish_observation()

    def _publish_clock(self, stamp_ns: int) -> None:
        self.clock_ns = stamp_ns
        self.pub_clock.publish(Clock(clock=rc.ns_to_time(stamp_ns)))

    def _publish_observation(self) -> None:
        stamp = self.sim_time_ns
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
        self._publish_clock(stamp)  # after the step's inputs: whoever wakes on the clock has them


def main(args=None) -> int:
    try:
        return run_node(SimNode, args)
    except SystemExit as exc:
        rclpy.try_shutdown()
        return int(exc.code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
