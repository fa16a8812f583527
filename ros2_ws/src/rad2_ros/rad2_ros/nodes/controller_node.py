"""Controller node: tracks the selected trajectory with the iLQR tracker and publishes commands.

Subscribes ``planning/trajectory`` (rad2_msgs/Trajectory, reliable keep-last-1) and
``localization/odometry`` (nav_msgs/Odometry, best effort keep-last-``POLLED_DEPTH``, polled); publishes
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
(receive time), or a planner heartbeat (``/heartbeat/<planner_name>``, once seen; after that
a received trajectory counts as one too) overdue by ``planner_heartbeat_timeout_s`` on the steady
clock (liveness of a process is a wall-clock matter: on simulated time, /clock advancing in bursts
under load made beats that arrived every 40 ms look 0.2 s apart) makes the cycle a
minimal-risk stop with the reason (field and value named) in the command, in ``control/diagnostics`` and on
``/diagnostics``; a rejection that good input replaced before the next cycle still stops and is
reported for that one cycle
(``supervision.FaultLatch``). Normal tracking resumes with the next valid input. A thread publishes
this node's own ``/heartbeat/controller``.

Time: every odometry stamp and every trajectory stamp goes through the clock model
(``supervision.StampClock``, ``validators.clock``): odometry stamped further behind the node's clock
than ``max_age_s`` or ahead of it by more than ``max_future_s`` (``max_future_sim_s`` on /clock), or
not after the previous accepted stamp, is rejected with the field, the offset and the tolerance named
(a stop, like any impossible value); a trajectory stamped in the future likewise. Clock faults never
count towards a relocalisation; the node clock itself going back (the simulator restarting time) is
the one signal that restarts the odometry history. Odometry arriving faster than
``validators.odometry.max_rate_hz`` by its stamps is read at most once per period (``RateGate``): a
flood is dropped unread, counted and reported, never queued. Odometry is polled
(``common.PolledCallbackGroup``): the executor never wakes for a sample; each cycle, each trajectory
and the watchdog take what waits in the reader (newest ``POLLED_DEPTH`` samples), so a 1 kHz flood
costs this process no wake-ups and the cycle keeps its rate.

Braking (``rad2_control.braking``): a tracking command brakes harder than ``comfort_decel`` only as
hard as the plan it tracks brakes itself over ``plan_demand_window_s`` (read from the plan's speeds,
not from how far the vehicle is from them), and its reason names that plan; beyond
``emergency_decel`` it is flagged emergency_stop. Within ``recovery_window_s`` of a fault stop it
brakes no harder than the minimal-risk stop (``stop_decel``) unless a plan made after the stop asks
for more (the reason says so): a pose that jumped when odometry resumed, or a fallback stop timed
while the vehicle did something else, is tracking error, and the planner's next plan starts from the
true state. A constant-speed plan never produces a command below ``-comfort_decel``.
While tracking, the commanded acceleration changes from the last command at most at the jerk limits
of ``controller.command`` (``TrackingController.limit_jerk``, as the simulator applies them); the
minimal-risk stop is not limited.

Transport: the node runs on UDP only (``common.use_udp_transport``): with Fast DDS's shared memory, a
process killed while pushing into a reader's port leaves that port locked for a second, and any other
writer into it (this node's commands and diagnostics to a monitor, say) would stand still with it.

Watchdog: a timer on the steady clock (``watchdog_period_s``) checks that the cycle ran. While it does
not (simulated time paused between clips, or the cycle held), an overdue planner heartbeat, trajectory
or odometry, judged by steady receive times, still produces a minimal-risk stop command with its
reason, so the stop never waits for the simulated clock to move.

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
from rad2_control.braking import BrakingLimits, bound_braking, plan_acceleration
from rad2_control.estimation import StateEstimator, bicycle_state, steps_advance
from rad2_control.reference import plan_to_world
from rad2_core.geometry import world_to_ego
from rad2_core.supervision import (
    ClockLimits,
    FaultLatch,
    HeartbeatMonitor,
    OdometryGate,
    RateGate,
    StampClock,
    describe_violations,
)
from rad2_msgs.msg import ControlCommand, PlanningDiagnostics, Trajectory
from rad2_planner.planner_guard import check_plan_kinematics
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from std_msgs.msg import Header

from rad2_ros import conversions as rc
from rad2_ros.nodes.common import (
    POLLED_DEPTH,
    CycleStats,
    DiagnosticsReporter,
    Heartbeat,
    PolledCallbackGroup,
    Throttle,
    cdr_header_stamp_ns,
    command_qos,
    heartbeat_qos,
    heartbeat_topic,
    report_qos,
    run_node,
    sensor_qos,
    stop_heartbeat,
    take_waiting,
    use_udp_transport,
)
from rad2_ros.nodes.parameters import declare_parameters

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
        use_sim_time = bool(self.get_parameter("use_sim_time").value)
        clock = self.limits["clock"]
        odom_clock = StampClock("odometry.header.stamp", ClockLimits.from_params(clock, use_sim_time))
        confirm = int(self.limits["odometry"]["reset_confirm_samples"])
        self.gate = OdometryGate(self.limits, confirm, odom_clock)
        # trajectories: a fallback keeps its predecessor's stamp (neither increasing nor young), but no
        # plan is stamped in the future
        self.traj_clock = StampClock("trajectory.header.stamp",
                                     ClockLimits.from_params(clock, use_sim_time, monotonic=False, age=False))
        self.odom_rate = RateGate(float(self.limits["odometry"]["max_rate_hz"]))
        self.odom_timeout_ns = int(float(cfg["odom_timeout_s"]) * 1e9)
        self.planner_name = str(cfg["planner_name"])
        self.heartbeats = HeartbeatMonitor({self.planner_name: float(cfg["planner_heartbeat_timeout_s"])})
        self.latch = FaultLatch()
        self.braking = BrakingLimits.from_params(cfg)
        self.recovery_window_ns = int(float(cfg["recovery_window_s"]) * 1e9)
        self.watchdog_period_ns = int(float(cfg["watchdog_period_s"]) * 1e9)
        self._fault_steady_ns: int | None = None  # steady time of the last cycle that stopped for a fault
        self._fault_text = ""  # and its reason
        self._tracked = False  # whether a cycle has tracked a plan yet
        self._fault_now_ns = 0  # node clock of the last cycle that stopped for a fault
        self.hard_brake_count = 0  # commands braking beyond comfort_decel (each with its reason)
        self.bounded_brake_count = 0  # commands whose tracker braking was bounded by the plan's own demand
        self._last_cmd_steady_ns: int | None = None  # steady time of the last command published
        self._last_accel: float | None = None  # acceleration of the last command (the jerk limit's start)
        self._last_accel_ns = 0  # and its node-clock time
        self._last_watchdog_ns: int | None = None
        self._odom_rx_steady_ns: int | None = None  # steady receive time of the last accepted odometry
        self._traj_rx_steady_ns: int | None = None  # ... and of the last accepted trajectory
        self.watchdog_stops = 0
        self.diagnostics = DiagnosticsReporter(self)
        # Both inputs are validated message by message and taken in order: a rejected one is reported
        # and stopped for even when a good one follows before this process runs (a loaded host).
        self.sub_trajectory = self.create_subscription(Trajectory, "planning/trajectory", self.on_trajectory,
                                                       command_qos(depth=4))
        # polled: read where it is used (each cycle, each trajectory), never an executor wake-up per
        # sample, so a flood costs the middleware's copy and the newest POLLED_DEPTH win
        self.sub_odometry = self.create_subscription(Odometry, "localization/odometry", self.on_odometry,
                                                     sensor_qos(POLLED_DEPTH), raw=True,
                                                     callback_group=PolledCallbackGroup())
        self.pub_cmd = self.create_publisher(ControlCommand, "control/command", command_qos())
        self.pub_diag = self.create_publisher(PlanningDiagnostics, "control/diagnostics", report_qos())
        # the planner's beats only (their own topic): no other node writes into this process's port
        self.sub_heartbeat = self.create_subscription(Header, heartbeat_topic(self.planner_name),
                                                      self.on_heartbeat, heartbeat_qos())
        self.create_timer(1.0 / self.rate_hz, self.on_timer)
        # the watchdog runs on the steady clock: it must run while simulated time stands still
        self.create_timer(self.watchdog_period_ns / 1e9, self.on_watchdog,
                          clock=Clock(clock_type=ClockType.STEADY_TIME))
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
    def on_odometry(self, data: bytes | Odometry) -> None:
        """Odometry arrives serialized: a flood is dropped here on its stamp alone, unread (one stamp
        comparison per surplus message), and only an admitted sample is deserialized."""
        stamp = cdr_header_stamp_ns(data) if isinstance(data, bytes) else rc.time_to_ns(data.header.stamp)
        if not self.odom_rate.admit(stamp, self._steady_ns()):
            return
        try:
            msg = deserialize_message(data, Odometry) if isinstance(data, bytes) else data
            motion = rc.odometry_from_msg(msg)
        except Exception as exc:  # noqa: BLE001 -- bad input must never kill the node
            self.stats.reject()
            self.latch.raise_fault("odometry", f"odometry rejected: {exc}")
            self._warn("odom", f"odometry rejected: {exc}")
            return
        now = self._now_ns()
        gate = self.gate.offer(motion, now)
        if not gate.accepted:
            self.stats.reject()
            what = "clock fault" if gate.violations[0].field.endswith("header.stamp") else "implausible"
            self.latch.raise_fault("odometry", f"odometry rejected: {what} {gate.reason}")
            self._warn("odom", f"odometry rejected: {what} {gate.reason}")
            return
        self.latch.clear("odometry")
        self._odom_rx_steady_ns = self._steady_ns()
        jump = self.estimator.add_odometry(motion, now)
        if jump or gate.reset:
            self.plan = None
            self.warm = None
            self.reset_ns = motion.stamp_ns
            why = self.gate.last_reset if gate.reset else jump
            self.fault = f"localization reset: {why}; waiting for a trajectory planned after it"
            self._warn("jump", self.fault)

    def _take_odometry(self) -> None:
        take_waiting(self.sub_odometry, self.on_odometry, POLLED_DEPTH)

    def on_trajectory(self, msg: Trajectory) -> None:
        self._take_odometry()  # the poses up to now, to place the plan at its stamp
        now = self._now_ns()
        self.heartbeats.refresh(self.planner_name, self._steady_ns())  # a trajectory shows it alive too
        try:
            # before any conversion: a 10,000-point plan would cost the cycle its rate
            count, most = len(msg.points), int(self.limits["trajectory"]["max_points"])
            if count > most:
                raise ValueError(f"implausible trajectory.points = {count} violates <= {most} points "
                                 f"(validators.trajectory.max_points)")
            traj = rc.trajectory_from_msg(msg)
            if self.reset_ns is not None and traj.stamp_ns < self.reset_ns:
                raise ValueError(f"stamp {traj.stamp_ns / 1e9:.3f} s predates the localization reset at "
                                 f"{self.reset_ns / 1e9:.3f} s")
            if traj.points.shape[0] < self.min_points:
                raise ValueError(f"Trajectory.points: has {traj.points.shape[0]} points, "
                                 f"need at least {self.min_points}")
            verdict = self.traj_clock.check(traj.stamp_ns, now)
            if not verdict.accepted:
                raise ValueError(f"clock fault {verdict.reason}")
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
            # the ego's speed at the plan's start (its stamp: a fallback keeps an older plan's stamp, and
            # the speed of now against it would invent an acceleration), unknown while a jump awaits
            # confirmation
            at_stamp = None if self.gate.pending else self.estimator.odometry.motion_at(traj.stamp_ns)
            bad = check_plan_kinematics(world_to_ego(pts, origin), traj.dt, self.limits, self.tracker.vehicle,
                                        None if at_stamp is None else max(at_stamp.speed, 0.0))
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
        self.traj_clock.accept(traj.stamp_ns)
        self.plan = _Plan(pts, traj.dt, origin, traj.stamp_ns, now)
        self._traj_rx_steady_ns = self._steady_ns()
        self.fault = ""
        self.latch.clear("trajectory")

    def on_heartbeat(self, msg: Header) -> None:
        self.heartbeats.beat(msg.frame_id, self._steady_ns())

    def _drain_heartbeats(self, now: int) -> None:
        """Take the heartbeats that arrived but wait behind this timer in the executor (after a stall the
        executor runs ready timers before ready subscriptions): they were received, not lost."""
        take_waiting(self.sub_heartbeat, lambda msg: self.heartbeats.beat(msg.frame_id, now))

    # -- cycle ----------------------------------------------------------------------------------------
    def _stop(self, state: np.ndarray | None, steer_now: float) -> tuple[float, float, float, float]:
        """(accel, steering rate, steering angle, speed) one step into the minimal-risk stop."""
        u = self.tracker.stop_controls(state if state is not None else np.zeros(5), self.stop_decel)
        accel, rate = float(u[0, 0, 0]), float(u[0, 0, 1])
        speed = max(0.0, (state[3] if state is not None else 0.0) + accel * self.tracker.dt)
        return accel, rate, steer_now, speed

    def on_timer(self) -> None:
        t0 = time.perf_counter()
        steady = self._steady_ns()
        last_watchdog = self._last_watchdog_ns
        if last_watchdog is None or steady - last_watchdog > 5 * self.watchdog_period_ns:
            # not even the steady-clock watchdog ran for 5 of its periods: this process was not scheduled,
            # and a planner beat missed meanwhile is not evidence of its loss
            self.heartbeats.rebase(steady)
        self._drain_heartbeats(steady)
        self._take_odometry()  # the freshest state (polled: see the module's docstring)
        take_waiting(self.sub_trajectory, self.on_trajectory)  # and the newest plan, even if starved
        # the cycle's time once its inputs are in: a plan taken by the drains above is received at or
        # before it (taken first, a plan received during a slow drain was "received after now", and
        # its age came out negative: the ReferenceError "age must be >= 0" of a loaded host)
        now = self._now_ns()
        steady = self._steady_ns()
        stages: dict[str, float] = {}
        reason = ""
        emergency = fault_stop = False  # flagged; and a stop for a fault (opens the recovery window)
        accel = rate = 0.0
        steer_now = self.estimator.commands.steer_at(now)
        try:
            ta = time.perf_counter()
            state, t_state = self.estimator.state(now)
            stages["predict"] = (time.perf_counter() - ta) * 1e3
            if state is not None:
                steer_now = float(state[4])
            reason = self._stop_reason(now, steady, state)
            if reason:
                emergency = fault_stop = True
                self.warm = None
                accel, rate, steer_next, speed_next = self._stop(state, steer_now)
            else:
                plan = self.plan
                # the reference at the state's time (both at `now`, or both at the odometry stamp)
                age = (t_state - plan.stamp_ns) / 1e9
                if not (0.0 <= age <= plan.dt * len(plan.points)):
                    age = (now - plan.received_ns) / 1e9  # clocks disagree: fall back to receive time
                if age < 0.0:
                    # received "after now": the node's clock went back since (a restarted simulation)
                    raise ValueError(f"trajectory received {-age:.3f} s after the node clock's now "
                                     f"(the node clock went back)")
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
                if self._last_accel is not None:  # the command's jerk limits (controller.command)
                    elapsed = max(0.0, (now - self._last_accel_ns) / 1e9)
                    # the inputs of the emergency test are passed too (the first one alone would
                    # never count as an emergency stop the way the simulator judges it)
                    window = sol.controls[0, : self.tracker.emergency_window]
                    accel = float(self.tracker.limit_jerk(window, self._last_accel, elapsed_s=elapsed)[0, 0])
                # braking beyond comfort only as the plan brakes itself; after a fault no harder than the
                # minimal-risk stop unless a plan made since asks for it (rad2_control/braking.py)
                decision = self._bound_braking(accel, ref.states[0, :, 3], plan, steady)
                accel, reason, emergency = decision.accel, decision.reason, decision.emergency
                if accel != float(sol.controls[0, 0, 0]):
                    speed_next = max(0.0, float(state[3]) + accel * self.tracker.dt)
        except Exception as exc:  # noqa: BLE001 -- any failure ends in the stop manoeuvre
            reason = f"controller failure: {type(exc).__name__}: {exc}"
            emergency = fault_stop = True
            self._warn("solve", reason)
            self.warm = None
            latest = self.estimator.odometry.latest
            state = None if latest is None else bicycle_state(latest, steer_now)
            accel, rate, steer_next, speed_next = self._stop(state, steer_now)
        if fault_stop and self._tracked:  # a stop before any tracking is the start-up wait, no fault
            self._fault_steady_ns, self._fault_now_ns, self._fault_text = steady, now, reason
        self._tracked = self._tracked or not fault_stop
        self._publish_command(t0, now, steady, accel, rate, steer_now, steer_next, speed_next, reason,
                              emergency, stages)

    def _stop_reason(self, now: int, steady: int, state) -> str:
        """Why this cycle must be the minimal-risk stop ("" to track the plan)."""
        latched = self.latch.reason()
        odom_age = self.estimator.odometry.age_ns(now)
        lost = self.heartbeats.lost(steady)
        if state is None:
            return latched or "no odometry received"
        if odom_age > self.odom_timeout_ns:
            return (f"odometry lost: {odom_age / 1e9:.2f} s since the last accepted sample "
                    f"(timeout {self.odom_timeout_ns / 1e9:g} s)" + (f"; {latched}" if latched else ""))
        if latched:
            return latched
        if lost:
            return lost[0].message
        if self.plan is None:
            return self.fault or "no trajectory received"
        if now - self.plan.received_ns > self.stale_ns:
            return f"stale trajectory: {(now - self.plan.received_ns) / 1e9:.2f} s since reception"
        return ""

    def _bound_braking(self, accel: float, ref_speed: np.ndarray, plan: _Plan, steady: int):
        """The tracking command's braking bounded by what demands it (``braking.bound_braking``): the plan's
        own braking over ``plan_demand_window_s``; within ``recovery_window_s`` of a fault stop, the
        minimal-risk stop's unless the plan was made after that stop."""
        plan_accel = plan_acceleration(ref_speed, self.tracker.dt, self.braking.demand_window_s)
        recovering = ""
        if self._fault_steady_ns is not None and steady - self._fault_steady_ns <= self.recovery_window_ns:
            since = (steady - self._fault_steady_ns) / 1e9
            recovering = f"{since:.2f} s after: {self._fault_text}"
        decision = bound_braking(accel, plan_accel, self.braking, plan_label=f"the plan stamped "
                                 f"{plan.stamp_ns / 1e9:.3f} s", recovering=recovering,
                                 plan_after_fault=plan.stamp_ns > self._fault_now_ns)
        if decision.bounded:
            self.bounded_brake_count += 1
        if decision.reason:
            self.hard_brake_count += 1
        return decision

    def on_watchdog(self) -> None:
        """Steady-clock check: while the cycle timer does not run (simulated time paused between clips, a
        held executor), an overdue input still gets a minimal-risk stop command, judged on the steady
        clock alone (the node clock may stand still)."""
        steady = self._steady_ns()
        last, self._last_watchdog_ns = self._last_watchdog_ns, steady
        if last is None or steady - last > 5 * self.watchdog_period_ns:
            self.heartbeats.rebase(steady)  # this process was not scheduled: beats missed are not lost
            return
        period_ns = int(1e9 / self.rate_hz)
        if self._last_cmd_steady_ns is not None and steady - self._last_cmd_steady_ns <= 2 * period_ns:
            return  # the cycle runs: it judges the inputs itself
        self._drain_heartbeats(steady)
        self._take_odometry()  # held cycle or not, odometry that arrived is not lost
        why = []
        lost = self.heartbeats.lost(steady)
        if lost:
            why.append(lost[0].message)
        stale_s, odom_s = self.stale_ns / 1e9, self.odom_timeout_ns / 1e9
        for name, rx, limit in (("trajectory", self._traj_rx_steady_ns, stale_s),
                                ("odometry", self._odom_rx_steady_ns, odom_s)):
            if rx is not None and (steady - rx) / 1e9 > limit:
                why.append(f"no {name} for {(steady - rx) / 1e9:.2f} s (timeout {limit:g} s)")
        if not why:
            return  # time stands still and nothing is overdue: nothing to command
        held = (steady - (self._last_cmd_steady_ns or steady)) / 1e9
        reason = f"watchdog: control cycle held {held:.2f} s; " + "; ".join(why)
        latest = self.estimator.odometry.latest
        steer_now = self.estimator.commands.steer_at(self._now_ns())
        state = None if latest is None else bicycle_state(latest, steer_now)
        accel, rate, steer_next, speed_next = self._stop(state, steer_now)
        self.warm = None
        self.watchdog_stops += 1
        if self._tracked:
            self._fault_steady_ns, self._fault_text = steady, reason
        self._publish_command(time.perf_counter(), self._now_ns(), steady, accel, rate, steer_now, steer_next,
                              speed_next, reason, True, {})

    def _publish_command(self, t0: float, now: int, steady: int, accel: float, rate: float, steer_now: float,
                         steer_next: float, speed_next: float, reason: str, emergency: bool,
                         stages: dict[str, float]) -> None:
        # The command applies from `now`: the steering estimate ramps from here (SteeringRamp).
        self.estimator.commands.issue(now, accel, rate, steer_now)
        self._last_accel, self._last_accel_ns = float(accel), now
        if reason:
            kind = "hard braking" if reason.startswith("braking") else "minimal-risk stop"
            self._warn(f"{kind}:" + reason.split(":")[0], f"{kind}: {reason}")
        try:
            cmd = rc.ControlCommandValues(
                acceleration=accel, steering_angle=float(steer_next), steering_rate=rate,
                target_speed=float(speed_next), emergency_stop=bool(emergency), reason=reason[:500],
                stamp_ns=now, frame_id=self.ego_frame,
            )
            self.pub_cmd.publish(rc.control_command_to_msg(cmd))
            self._last_cmd_steady_ns = steady
            total_ms = (time.perf_counter() - t0) * 1e3
            latest = self.estimator.odometry.latest
            odom_stamp = latest.stamp_ns if latest is not None else 0
            e2e = (now - odom_stamp) / 1e6 + total_ms if odom_stamp else math.nan
            fallback = reason[:500] if emergency else ""
            rep = self.stats.record(stages, total_ms, total_ms, fallback_reason=fallback)
            level = "error" if emergency else ("warn" if reason else "ok")
            flood = self.odom_rate.flooding(steady)
            if flood and level == "ok":
                level = "warn"
            message = reason or ("tracking" if not flood else
                                 f"odometry flood: {self.odom_rate.rate_hz(steady):.0f} messages/s > "
                                 f"{self.odom_rate.max_rate_hz:g} Hz, one per "
                                 f"{self.odom_rate.min_period_ns / 1e6:g} ms of stamps read")
            self.diagnostics.publish(level, message, {
                "cycle_count": rep.cycle_count, "rejected_input_count": rep.rejected_input_count,
                "emergency_stop": bool(emergency), "acceleration": f"{accel:.3f}",
                "planner_heartbeat": self.heartbeats.status(steady)[0].message,
                "odometry_resets": self.gate.reset_count,
                "odometry_clock_faults": sum(self.gate.clock.faults.values()),
                "hard_brake_count": self.hard_brake_count, "bounded_brake_count": self.bounded_brake_count,
                "watchdog_stops": self.watchdog_stops,
                "odometry_rate_hz": f"{self.odom_rate.rate_hz(steady):.0f}",
                "odometry_flood_dropped": self.odom_rate.dropped})
            self.pub_diag.publish(rc.planning_diagnostics_to_msg(
                stages, node=NODE_NAME, backend="numpy-ilqr", stamp_ns=self._now_ns(),
                input_stamp_ns=self.plan.stamp_ns if self.plan is not None else 0, total_ms=total_ms,
                end_to_end_ms=e2e if math.isfinite(e2e) else total_ms, deadline_missed=rep.deadline_missed,
                cycle_count=rep.cycle_count, deadline_miss_count=rep.deadline_miss_count,
                rejected_input_count=rep.rejected_input_count, fallback_active=bool(emergency),
                fallback_reason=reason[:500]))
        except Exception as exc:  # noqa: BLE001
            self._warn("publish", f"publishing failed: {exc}")


def main(args=None) -> int:
    use_udp_transport()  # before the participant exists (rclpy.init in run_node): see its docstring
    return run_node(ControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
