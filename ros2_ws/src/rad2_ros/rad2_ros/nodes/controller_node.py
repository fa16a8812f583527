"""Controller node: tracks the selected trajectory with the iLQR tracker and publishes commands.

Subscribes ``planning/trajectory`` (rad2_msgs/Trajectory, reliable keep-last-1) and
``localization/odometry`` (nav_msgs/Odometry, best effort keep-last-1); publishes
``control/command`` (rad2_msgs/ControlCommand) at ``controller.node.rate_hz`` and
``control/diagnostics`` (rad2_msgs/PlanningDiagnostics) every cycle.

Trajectories in ``controller.node.world_frame`` are used as they are; those in
``controller.node.ego_frame`` are placed with the odometry pose nearest to their stamp.

Time alignment: a command applies from the cycle's time ``now`` on, so every cycle predicts the latest
odometry (stamp ``t_odom``) forward to ``now`` with the core bicycle model
(``control.bicycle.propagate``) under the commands this node issued in between, and evaluates the
reference at ``now`` too (``age = now - plan stamp``). When the two clocks disagree (``t_odom`` after
``now`` or older than ``stale_timeout_s``) nothing is predicted and state and reference are both
taken at ``t_odom``. Odometry carries no steering angle: the node's estimate follows its own commands
over real elapsed time (a command ramps the angle at its ``steering_rate`` for one controller step,
reaching its ``steering_angle``, then holds it), so missed cycles do not skew it; it starts from the
odometry yaw rate. An odometry jump further than the vehicle can travel (``max_speed`` times the stamp
difference plus one vehicle length: a localization reset, or the simulator starting the next clip)
drops the trajectory, the warm start and the command history; trajectories stamped before the jump
are then rejected. The solve is warm-started with the previous solution (shifted by the elapsed
controller steps). When there is no
trajectory, it is older than ``stale_timeout_s`` (by receive time), it was invalid (non-finite,
too short, unknown frame, no pose for its stamp) or the solve fails, the node commands a
comfortable stop (``stop_decel``, steering held), sets ``emergency_stop`` and ``reason`` and
reports the fallback in the diagnostics. Nothing from the outside can kill it: every callback
catches, logs (throttled) and falls back.

Plausibility and watchdogs (``rad2_core.validators``, ``rad2_core.supervision``): odometry passes
an ``OdometryGate`` (impossible speed, yaw rate, stamp 0, a jump or speed change the stamp gap cannot
explain: rejected; a jump confirmed by ``validators.odometry.reset_confirm_samples`` consistent samples
is a relocalisation); a trajectory must pass ``planner_guard.check_plan_kinematics`` in the ego frame
of its stamp from the ego's speed (time step, implied speed, start offset over the whole plan;
acceleration, curvature, lateral acceleration and jerk, backwards segments over
``validators.trajectory.kinematics_horizon_s``). Any rejection, odometry older than ``odom_timeout_s``
(receive time), or a planner heartbeat (``/heartbeat`` from ``planner_name``, once seen; after that
a received trajectory counts as one too) overdue by ``planner_heartbeat_timeout_s`` on the steady
clock (liveness of a process is a wall-clock matter: on simulated time, /clock advancing in bursts
under load made beats that arrived every 40 ms look 0.2 s apart) makes the cycle a
minimal-risk stop with the reason (field and value named) in the command, in ``control/diagnostics`` and on
``/diagnostics``; a rejection that good input replaced before the next cycle still stops and is
reported for that one cycle
(``supervision.FaultLatch``). Normal tracking resumes with the next valid input. A thread publishes
this node's own ``/heartbeat``.

The estimation and prediction above live in ``rad2_control.estimation`` (no ROS, unit-tested
there); this node holds the ROS I/O, the validation, the fallbacks and the diagnostics.

Run: ``controller_node --ros-args --params-file params/controller.yaml --params-file params/vehicle.yaml
--params-file params/validators.yaml --params-file params/nodes.yaml``.
"""

from __future__ import annotations

import math
import time

import numpy as np
from nav_msgs.msg import Odometry
from rad2_control import TrackingController, shift_controls
from rad2_control.estimation import StateEstimator, bicycle_state, steps_advance
from rad2_control.reference import plan_to_world
from rad2_core.geometry import world_to_ego
from rad2_core.supervision import FaultLatch, HeartbeatMonitor, OdometryGate, describe_violations
from rad2_msgs.msg import ControlCommand, PlanningDiagnostics, Trajectory
from rad2_planner.planner_guard import check_plan_kinematics
from rclpy.node import Node
from std_msgs.msg import Header

from rad2_ros import conversions as rc
from rad2_ros.nodes.common import (
    EVERY_SAMPLE_DEPTH,
    HEARTBEAT_TOPIC,
    CycleStats,
    DiagnosticsReporter,
    Heartbeat,
    Throttle,
    command_qos,
    declare_parameters,
    heartbeat_qos,
    report_qos,
    run_node,
    sensor_qos,
    stop_heartbeat,
)

NODE_NAME = "controller"

PARAM_FILES = ["controller", "vehicle", "validators", "nodes"]
PREFIXES = ("controller", "vehicle", "validators", "heartbeat")


class _Plan:
    """A validated trajectory in the world frame."""

    __slots__ = ("points", "dt", "origin", "stamp_ns", "received_ns")

    def __init__(self, points, dt, origin, stamp_ns, received_ns):
        self.points, self.dt, self.origin = points, dt, origin
        self.stamp_ns, self.received_ns = stamp_ns, received_ns


class ControllerNode(Node):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        values = declare_parameters(self, PARAM_FILES, prefixes=PREFIXES,
                                    cli_args=kwargs.get("cli_args"))
        self.tracker = TrackingController(values, values)
        cfg = values["controller"]["node"]
        self.rate_hz = float(cfg["rate_hz"])
        self.stale_ns = int(float(cfg["stale_timeout_s"]) * 1e9)
        self.stop_decel = float(cfg["stop_decel"])
        self.world_frame = str(cfg["world_frame"])
        self.ego_frame = str(cfg["ego_frame"])
        self.min_points = int(cfg["min_points"])
        # odometry, issued commands, steering estimate and prediction (see control/estimation.py)
        self.estimator = StateEstimator(self.tracker.vehicle, self.tracker.dt,
                                        int(float(cfg["odom_history_s"]) * 1e9), self.stale_ns,
                                        self.tracker.min_heading_speed)
        self.plan: _Plan | None = None
        self.fault = "no trajectory received"
        self.warm: np.ndarray | None = None
        self.warm_ns = 0
        self.reset_ns: int | None = None  # odometry stamp of the last localization reset
        self.stats = CycleStats(deadline_ms=1e3 / self.rate_hz)
        self.throttle = Throttle(2.0)
        self.limits = values["validators"]
        self.gate = OdometryGate(self.limits, int(self.limits["odometry"]["reset_confirm_samples"]))
        self.odom_timeout_ns = int(float(cfg["odom_timeout_s"]) * 1e9)
        self.planner_name = str(cfg["planner_name"])
        self.heartbeats = HeartbeatMonitor({self.planner_name: float(cfg["planner_heartbeat_timeout_s"])})
        self.latch = FaultLatch()
        self._last_tick_ns: int | None = None
        self.diagnostics = DiagnosticsReporter(self)
        # Both inputs are validated message by message and taken in order: a rejected one is reported
        # and stopped for even when a good one follows before this process runs (a loaded host).
        self.sub_trajectory = self.create_subscription(Trajectory, "planning/trajectory", self.on_trajectory,
                                                       command_qos(depth=4))
        self.sub_odometry = self.create_subscription(Odometry, "localization/odometry", self.on_odometry,
                                                     sensor_qos(EVERY_SAMPLE_DEPTH))
        self.pub_cmd = self.create_publisher(ControlCommand, "control/command", command_qos())
        self.pub_diag = self.create_publisher(PlanningDiagnostics, "control/diagnostics", report_qos())
        self.sub_heartbeat = self.create_subscription(Header, HEARTBEAT_TOPIC, self.on_heartbeat,
                                                      heartbeat_qos())
        self.create_timer(1.0 / self.rate_hz, self.on_timer)
        self.heartbeat = Heartbeat(self, float(values["heartbeat"]["period_s"]))
        self.get_logger().info(
            f"controller ready: {self.rate_hz:.0f} Hz, horizon {self.tracker.horizon} x {self.tracker.dt} s, "
            f"stale timeout {self.stale_ns / 1e9:.2f} s"
        )

    def destroy_node(self):
        stop_heartbeat(self)
        return super().destroy_node()

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    @staticmethod
    def _steady_ns() -> int:
        """Heartbeat bookkeeping clock: the process's monotonic clock, whatever the node clock is."""
        return time.monotonic_ns()

    def _warn(self, key: str, text: str) -> None:
        if self.throttle(key):
            self.get_logger().warning(text)

    # -- inputs ---------------------------------------------------------------------------------------
    def on_odometry(self, msg: Odometry) -> None:
        try:
            motion = rc.odometry_from_msg(msg)
        except Exception as exc:  # noqa: BLE001 -- bad input must never kill the node
            self.stats.reject()
            self.latch.raise_fault("odometry", f"odometry rejected: {exc}")
            self._warn("odom", f"odometry rejected: {exc}")
            return
        gate = self.gate.offer(motion)
        if not gate.accepted:
            self.stats.reject()
            self.latch.raise_fault("odometry", f"odometry rejected: implausible {gate.reason}")
            self._warn("odom", f"odometry rejected: implausible {gate.reason}")
            return
        self.latch.clear("odometry")
        jump = self.estimator.add_odometry(motion, self._now_ns())
        if jump:
            self.plan = None
            self.warm = None
            self.reset_ns = motion.stamp_ns
            self.fault = f"localization reset: {jump}; waiting for a trajectory planned after it"
            self._warn("jump", self.fault)

    def on_trajectory(self, msg: Trajectory) -> None:
        now = self._now_ns()
        self.heartbeats.refresh(self.planner_name, self._steady_ns())  # a trajectory shows it alive too
        try:
            traj = rc.trajectory_from_msg(msg)
            if self.reset_ns is not None and traj.stamp_ns < self.reset_ns:
                raise ValueError(f"stamp {traj.stamp_ns / 1e9:.3f} s predates the localization reset at "
                                 f"{self.reset_ns / 1e9:.3f} s")
            if traj.points.shape[0] < self.min_points:
                raise ValueError(f"Trajectory.points: has {traj.points.shape[0]} points, "
                                 f"need at least {self.min_points}")
            if traj.stamp_ns <= 0:
                raise ValueError(f"Trajectory.header.stamp = {traj.stamp_ns} ns is unset")
            if traj.frame_id == self.world_frame:
                pts = traj.points
                latest = self.estimator.odometry.latest
                origin = self.estimator.odometry.pose_at(traj.stamp_ns)
                if origin is None:
                    if latest is None:
                        raise ValueError("no odometry yet to anchor the trajectory start")
                    origin = np.array([latest.x, latest.y, latest.yaw])
            elif traj.frame_id == self.ego_frame:
                origin = self.estimator.odometry.pose_at(traj.stamp_ns)
                if origin is None:
                    raise ValueError(f"no odometry near the trajectory stamp {traj.stamp_ns} ns")
                pts = plan_to_world(traj.points, origin)
            else:
                raise ValueError(f"Trajectory.header.frame_id: is {traj.frame_id!r}, expected "
                                 f"{self.world_frame!r} or {self.ego_frame!r}")
            # the ego's speed: the latest accepted odometry's, unknown while a jump awaits confirmation
            latest = None if self.gate.pending else self.estimator.odometry.latest
            bad = check_plan_kinematics(world_to_ego(pts, origin), traj.dt, self.limits, self.tracker.vehicle,
                                        None if latest is None else max(latest.speed, 0.0))
            if bad:
                raise ValueError(f"implausible {describe_violations(bad)}")
        except Exception as exc:  # noqa: BLE001 -- reject, stop, keep running
            self.stats.reject()
            self.plan = None
            self.warm = None
            self.fault = f"invalid trajectory: {exc}"
            self.latch.raise_fault("trajectory", self.fault)
            self._warn("trajectory", self.fault)
            return
        self.plan = _Plan(pts, traj.dt, origin, traj.stamp_ns, now)
        self.fault = ""
        self.latch.clear("trajectory")

    def on_heartbeat(self, msg: Header) -> None:
        self.heartbeats.beat(msg.frame_id, self._steady_ns())

    def _drain_heartbeats(self, now: int) -> None:
        """Take the heartbeats that arrived but wait behind this timer in the executor (after a stall the
        executor runs ready timers before ready subscriptions): they were received, not lost."""
        self._drain(self.sub_heartbeat, lambda msg: self.heartbeats.beat(msg.frame_id, now))

    @staticmethod
    def _drain(sub, handle_message, limit: int = 50) -> None:
        """Hand every message waiting on ``sub`` to ``handle_message`` now. The single-threaded executor
        runs a ready timer before ready subscriptions, so when a cycle takes longer than the timer period
        (a loaded CPU) the timer is always ready and subscriptions would wait indefinitely."""
        try:
            for _ in range(limit):
                with sub.handle:
                    taken = sub.handle.take_message(sub.msg_type, sub.raw)
                if taken is None:
                    return
                handle_message(taken[0])
        except Exception:  # noqa: BLE001 -- a destroyed subscription at shutdown: nothing to take
            return

    # -- cycle ----------------------------------------------------------------------------------------
    def _stop(self, state: np.ndarray | None, steer_now: float) -> tuple[float, float, float, float]:
        """(accel, steering rate, steering angle, speed) one step into the minimal-risk stop."""
        u = self.tracker.stop_controls(state if state is not None else np.zeros(5), self.stop_decel)
        accel, rate = float(u[0, 0, 0]), float(u[0, 0, 1])
        speed = max(0.0, (state[3] if state is not None else 0.0) + accel * self.tracker.dt)
        return accel, rate, steer_now, speed

    def on_timer(self) -> None:
        t0 = time.perf_counter()
        now = self._now_ns()
        steady = self._steady_ns()
        last_tick, self._last_tick_ns = self._last_tick_ns, steady
        if last_tick is None or steady - last_tick > 5e9 / self.rate_hz:
            # this timer did not run for 5 periods (simulated time paused between clips, or this
            # process was not scheduled): a planner beat missed meanwhile is not evidence of its loss
            self.heartbeats.rebase(steady)
        self._drain_heartbeats(steady)
        self._drain(self.sub_odometry, self.on_odometry)  # the freshest state, even if starved
        self._drain(self.sub_trajectory, self.on_trajectory)  # and the newest plan
        stages: dict[str, float] = {}
        reason = ""
        accel = rate = 0.0
        steer_now = self.estimator.commands.steer_at(now)
        try:
            ta = time.perf_counter()
            state, t_state = self.estimator.state(now)
            stages["predict"] = (time.perf_counter() - ta) * 1e3
            if state is not None:
                steer_now = float(state[4])
            latched = self.latch.reason()
            odom_age = self.estimator.odometry.age_ns(now)
            lost = self.heartbeats.lost(steady)
            if state is None:
                reason = latched or "no odometry received"
            elif odom_age > self.odom_timeout_ns:
                reason = (f"odometry lost: {odom_age / 1e9:.2f} s since the last accepted sample "
                          f"(timeout {self.odom_timeout_ns / 1e9:g} s)" + (f"; {latched}" if latched else ""))
            elif latched:
                reason = latched
            elif lost:
                reason = lost[0].message
            elif self.plan is None:
                reason = self.fault or "no trajectory received"
            elif now - self.plan.received_ns > self.stale_ns:
                reason = f"stale trajectory: {(now - self.plan.received_ns) / 1e9:.2f} s since reception"
            if reason:
                self.warm = None
                accel, rate, steer_next, speed_next = self._stop(state, steer_now)
            else:
                plan = self.plan
                # the reference at the state's time (both at `now`, or both at the odometry stamp)
                age = (t_state - plan.stamp_ns) / 1e9
                if not (0.0 <= age <= plan.dt * len(plan.points)):
                    age = (now - plan.received_ns) / 1e9  # clocks disagree: fall back to receive time
                ta = time.perf_counter()
                ref = self.tracker.reference(plan.points, plan.dt, plan.origin, age=age, frame="world")
                stages["reference"] = (time.perf_counter() - ta) * 1e3
                warm = None
                if self.warm is not None:
                    steps = int(round((now - self.warm_ns) / 1e9 / self.tracker.dt))
                    warm = shift_controls(self.warm, steps)
                ta = time.perf_counter()
                sol = self.tracker.solve(state, ref, warm_start=warm)
                stages["solve"] = (time.perf_counter() - ta) * 1e3
                if not np.isfinite(sol.controls).all():
                    raise FloatingPointError("solver returned non-finite controls")
                if steps_advance(self.warm_ns, now, self.tracker.dt) or self.warm is None:
                    self.warm, self.warm_ns = sol.controls, now
                accel, rate = float(sol.controls[0, 0, 0]), float(sol.controls[0, 0, 1])
                steer_next = float(sol.states[0, 1, 4])
                speed_next = float(sol.states[0, 1, 3])
        except Exception as exc:  # noqa: BLE001 -- any failure ends in the stop manoeuvre
            reason = f"controller failure: {type(exc).__name__}: {exc}"
            self._warn("solve", reason)
            self.warm = None
            latest = self.estimator.odometry.latest
            state = None if latest is None else bicycle_state(latest, steer_now)
            accel, rate, steer_next, speed_next = self._stop(state, steer_now)
        # The command applies from `now`: the steering estimate ramps from here (SteeringRamp).
        self.estimator.commands.issue(now, accel, rate, steer_now)
        if reason:
            self._warn("stop:" + reason.split(":")[0], f"minimal-risk stop: {reason}")
        try:
            cmd = rc.ControlCommandValues(
                acceleration=accel, steering_angle=float(steer_next), steering_rate=rate,
                target_speed=float(speed_next), emergency_stop=bool(reason), reason=reason[:500],
                stamp_ns=now, frame_id=self.ego_frame,
            )
            self.pub_cmd.publish(rc.control_command_to_msg(cmd))
            total_ms = (time.perf_counter() - t0) * 1e3
            latest = self.estimator.odometry.latest
            odom_stamp = latest.stamp_ns if latest is not None else 0
            e2e = (now - odom_stamp) / 1e6 + total_ms if odom_stamp else math.nan
            rep = self.stats.record(stages, total_ms, total_ms, fallback_reason=reason[:500])
            self.diagnostics.publish("error" if reason else "ok", reason or "tracking", {
                "cycle_count": rep.cycle_count, "rejected_input_count": rep.rejected_input_count,
                "emergency_stop": bool(reason),
                "planner_heartbeat": self.heartbeats.status(steady)[0].message,
                "odometry_resets": self.gate.reset_count})
            self.pub_diag.publish(rc.planning_diagnostics_to_msg(
                stages, node=NODE_NAME, backend="numpy-ilqr", stamp_ns=self._now_ns(),
                input_stamp_ns=self.plan.stamp_ns if self.plan is not None else 0, total_ms=total_ms,
                end_to_end_ms=e2e if math.isfinite(e2e) else total_ms, deadline_missed=rep.deadline_missed,
                cycle_count=rep.cycle_count, deadline_miss_count=rep.deadline_miss_count,
                rejected_input_count=rep.rejected_input_count, fallback_active=rep.fallback_active,
                fallback_reason=rep.fallback_reason))
        except Exception as exc:  # noqa: BLE001
            self._warn("publish", f"publishing failed: {exc}")


def main(args=None) -> int:
    return run_node(ControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
