"""State estimation and prediction between odometry messages: what the controller node knows of the ego.

Odometry arrives late (its stamp is before the cycle time ``now`` at which a command applies) and
carries no steering angle, so the node keeps two histories:

- ``OdometryHistory``: recent odometry by receive time, to place ego-frame trajectories with the pose
  nearest their stamp (``pose_at``);
- ``CommandHistory``: the commands the node issued, from which it estimates the steering angle at any
  time (``steer_at``) and predicts the latest odometry forward to ``now`` with the core bicycle model
  (``predict``, ``control.bicycle.propagate``).

``SteeringRamp`` is the one model of how a command moves the steering angle (a command ramps the angle
at its rate, limited by the vehicle's steering-rate limit, for one controller step, then holds it); the
controller node's estimate and the simulator node's actuation both use it, so the two cannot disagree.
``odometry_jump`` tells a localization reset (or the simulator starting the next clip) from motion.
``StateEstimator`` ties these together for the node. Nothing here imports ROS: motions are any object
with the fields of ``rad2_ros.conversions.EgoMotion``, times are integer nanoseconds, and every
value comes from the parameters the caller passes (``params/controller.yaml``, ``params/vehicle.yaml``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from rad2_core.bicycle import VehicleParams, propagate, steer_for_curvature


class Motion(Protocol):
    """The odometry fields used here (``ros_conversions.EgoMotion`` has them)."""

    x: float
    y: float
    yaw: float
    speed: float
    yaw_rate: float
    stamp_ns: int


def bicycle_state(motion: Motion, steer: float) -> np.ndarray:
    """Bicycle state ``(x, y, yaw, v, delta)`` of an odometry sample with an estimated steering angle.

    The speed is floored at 0: the model does not reverse, and a slightly negative measured speed
    (noise at standstill) must not make the prediction drive backwards.
    """
    return np.array([motion.x, motion.y, motion.yaw, max(motion.speed, 0.0), steer])


def steps_advance(last_ns: int, now_ns: int, dt: float) -> bool:
    """Whether at least one controller step passed since the warm start was stored.

    The warm start is shifted by whole steps; replacing it more often (the node runs faster than
    1 / dt) would shift it by zero steps each cycle and lose the previous solution's tail.
    """
    return (now_ns - last_ns) / 1e9 >= dt


# --------------------------------------------------------------------------------------------------
# steering model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SteeringRamp:
    """How one command moves the steering angle: from ``steer0`` at ``start_ns`` at ``rate`` for one
    step (``step_s``), then held; always within +-``max_steer``.

    A command is computed for one controller step, so its rate is meant to act for that step only:
    when cycles are missed the angle holds instead of winding up, and an estimate taken over real
    elapsed time stays right whatever the cycle timing.
    """

    start_ns: int
    steer0: float
    rate: float  # rad/s, within the vehicle's steering-rate limit
    step_s: float
    max_steer: float

    @classmethod
    def at_rate(cls, start_ns: int, steer0: float, rate: float, step_s: float,
                vehicle: VehicleParams) -> SteeringRamp:
        """A command given as a steering rate (the controller's output), limited by the vehicle."""
        rate = float(np.clip(rate, -vehicle.max_steer_rate, vehicle.max_steer_rate))
        return cls(int(start_ns), float(steer0), rate, float(step_s), float(vehicle.max_steer))

    @classmethod
    def towards(cls, start_ns: int, steer0: float, target: float, step_s: float,
                vehicle: VehicleParams) -> SteeringRamp:
        """A command given as a target angle: the rate that reaches it in one step, limited by the
        vehicle (a far target is approached at the limit and reached by later commands)."""
        return cls.at_rate(start_ns, steer0, (float(target) - float(steer0)) / step_s, step_s, vehicle)

    @property
    def end_ns(self) -> int:
        """When the ramp ends and the angle starts to hold."""
        return self.start_ns + int(round(self.step_s * 1e9))

    def angle_at(self, t_ns: int) -> float:
        """Steering angle at ``t_ns`` (before ``start_ns``: ``steer0``)."""
        held = min(max(t_ns - self.start_ns, 0) / 1e9, self.step_s)
        return float(np.clip(self.steer0 + self.rate * held, -self.max_steer, self.max_steer))


# --------------------------------------------------------------------------------------------------
# issued commands: steering estimate and prediction
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedCommand:
    """A command the controller issued: its acceleration and its steering ramp (which holds its time)."""

    accel: float
    steering: SteeringRamp

    @property
    def stamp_ns(self) -> int:
        return self.steering.start_ns


class CommandHistory:
    """The commands issued over the last ``keep_ns``, oldest first, and the steering estimate they imply.

    ``keep_ns`` must cover the oldest odometry the node may still predict from (the larger of the
    odometry history and the stale timeout); the command in force at that odometry's stamp is kept too.
    """

    def __init__(self, vehicle: VehicleParams, step_s: float, keep_ns: int, min_heading_speed: float):
        self.vehicle = vehicle
        self.step_s = float(step_s)
        self.keep_ns = int(keep_ns)
        self.min_heading_speed = float(min_heading_speed)
        self.commands: deque[IssuedCommand] = deque()
        self.steer0 = 0.0  # steering estimate before the first remembered command

    def __len__(self) -> int:
        return len(self.commands)

    def reset(self, motion: Motion) -> None:
        """Forget the issued commands; estimate the steering angle from the odometry yaw rate.

        Used at the first odometry and after a localization reset, when the commands no longer
        describe the vehicle. Below ``min_heading_speed`` the yaw rate says nothing about the
        steering (the curvature ``yaw_rate / speed`` blows up), so the wheels are assumed straight.
        """
        self.commands.clear()
        speed = max(motion.speed, 0.0)
        if speed > self.min_heading_speed and math.isfinite(motion.yaw_rate):
            self.steer0 = float(steer_for_curvature(motion.yaw_rate / speed, self.vehicle))
        else:
            self.steer0 = 0.0

    def _in_force(self, t_ns: int) -> IssuedCommand | None:
        """The last command issued at or before ``t_ns`` (None: none yet)."""
        found = None
        for cmd in self.commands:
            if cmd.stamp_ns > t_ns:
                break
            found = cmd
        return found

    def steer_at(self, t_ns: int) -> float:
        """Steering angle at ``t_ns`` implied by the issued commands (each ramps for one step, then holds)."""
        cmd = self._in_force(t_ns)
        return self.steer0 if cmd is None else cmd.steering.angle_at(t_ns)

    def issue(self, now_ns: int, accel: float, rate: float, steer_now: float) -> None:
        """Record a command that applies from ``now_ns``, its ramp starting at ``steer_now``."""
        self.commands.append(IssuedCommand(float(accel), SteeringRamp.at_rate(
            now_ns, steer_now, rate, self.step_s, self.vehicle)))
        # drop what no prediction can need any more; the estimate before the new first command
        # becomes the angle the dropped ones left
        horizon = now_ns - self.keep_ns
        while len(self.commands) > 1 and self.commands[1].stamp_ns <= horizon:
            self.steer0 = self.steer_at(self.commands[1].stamp_ns)
            self.commands.popleft()

    def predict(self, motion: Motion, now_ns: int) -> np.ndarray:
        """Bicycle state at ``now_ns`` from the odometry ``motion`` and the commands issued since.

        The interval from the odometry stamp to ``now_ns`` is split where commands start and where
        their steering ramps end; each piece is integrated with ``propagate`` under (accel, rate),
        then (accel, 0) once the ramp is over. Before the first command the ego coasts.
        """
        t0 = motion.stamp_ns
        x0 = bicycle_state(motion, self.steer_at(t0))
        if now_ns <= t0:
            return x0
        active = self._in_force(t0)
        later = [cmd for cmd in self.commands if t0 < cmd.stamp_ns < now_ns]
        bounds = [t0] + [cmd.stamp_ns for cmd in later] + [now_ns]
        controls, durations = [], []
        for cmd, start, end in zip([active, *later], bounds[:-1], bounds[1:]):
            if cmd is None:  # before the first command: coast
                controls.append((0.0, 0.0))
                durations.append((end - start) / 1e9)
                continue
            cut = min(max(cmd.steering.end_ns, start), end)
            controls += [(cmd.accel, cmd.steering.rate), (cmd.accel, 0.0)]
            durations += [(cut - start) / 1e9, (end - cut) / 1e9]
        return propagate(x0, np.asarray(controls), np.asarray(durations), self.vehicle, self.step_s)


# --------------------------------------------------------------------------------------------------
# odometry: resets and poses by stamp
# --------------------------------------------------------------------------------------------------


def odometry_jump(prev: Motion | None, motion: Motion, vehicle: VehicleParams) -> str:
    """Why ``motion`` cannot follow ``prev`` (a localization reset), or ``""``.

    The bound is the farthest the vehicle can travel between the stamps (``max_speed`` times their
    difference) plus one vehicle length, a margin for localization noise and stamp jitter that still
    catches a relocalisation or the simulator starting the next clip elsewhere.
    """
    if prev is None:
        return ""
    dist = math.hypot(motion.x - prev.x, motion.y - prev.y)
    dt = abs(motion.stamp_ns - prev.stamp_ns) / 1e9
    if dist > vehicle.max_speed * dt + vehicle.length:
        return f"odometry moved {dist:.1f} m in {dt:.2f} s"
    return ""


@dataclass(frozen=True)
class OdometrySample:
    motion: Motion
    received_ns: int


class OdometryHistory:
    """Odometry received over the last ``keep_ns`` (by receive time, so a clock jump cannot pin old
    samples), to place ego-frame trajectories with the pose nearest their stamp."""

    def __init__(self, keep_ns: int):
        self.keep_ns = int(keep_ns)
        self.samples: deque[OdometrySample] = deque()

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def latest(self) -> Motion | None:
        return self.samples[-1].motion if self.samples else None

    def clear(self) -> None:
        self.samples.clear()

    def add(self, motion: Motion, received_ns: int) -> None:
        self.samples.append(OdometrySample(motion, int(received_ns)))
        while self.samples and received_ns - self.samples[0].received_ns > self.keep_ns:
            self.samples.popleft()

    def age_ns(self, now_ns: int) -> int:
        """Time since the latest sample was received (a very large number when there is none)."""
        return int(now_ns - self.samples[-1].received_ns) if self.samples else 2**62

    def motion_at(self, stamp_ns: int) -> Motion | None:
        """The sample stamped nearest ``stamp_ns``; None when none lies within ``keep_ns`` of it (a pose
        that far off would misplace the trajectory)."""
        if not self.samples:
            return None
        best = min(self.samples, key=lambda s: abs(s.motion.stamp_ns - stamp_ns)).motion
        return None if abs(best.stamp_ns - stamp_ns) > self.keep_ns else best

    def pose_at(self, stamp_ns: int) -> np.ndarray | None:
        """``(x, y, yaw)`` of :meth:`motion_at`."""
        best = self.motion_at(stamp_ns)
        return None if best is None else np.array([best.x, best.y, best.yaw])


# --------------------------------------------------------------------------------------------------
# the controller's estimator
# --------------------------------------------------------------------------------------------------


class StateEstimator:
    """The controller's view of the ego: odometry history, issued commands and the state at a cycle.

    ``history_ns`` is how long odometry is kept (``controller.node.odom_history_s``), ``stale_ns`` the
    largest odometry age still predicted forward (``controller.node.stale_timeout_s``), ``step_s`` the
    controller step (``controller.dt``).
    """

    def __init__(self, vehicle: VehicleParams, step_s: float, history_ns: int, stale_ns: int,
                 min_heading_speed: float):
        self.vehicle = vehicle
        self.stale_ns = int(stale_ns)
        self.odometry = OdometryHistory(history_ns)
        self.commands = CommandHistory(vehicle, step_s, max(int(history_ns), self.stale_ns),
                                       min_heading_speed)

    def add_odometry(self, motion: Motion, received_ns: int) -> str:
        """Take an odometry sample; returns why it is a localization reset, or ``""``.

        After a reset the odometry and command histories describe another place (or clip): both are
        dropped and the steering estimate restarts from the yaw rate, as at the first sample.
        """
        jump = odometry_jump(self.odometry.latest, motion, self.vehicle)
        if jump or not self.odometry:
            self.commands.reset(motion)
        if jump:
            self.odometry.clear()
        self.odometry.add(motion, received_ns)
        return jump

    def state(self, now_ns: int) -> tuple[np.ndarray | None, int]:
        """(bicycle state, its time): predicted to ``now_ns`` when the clocks agree, else at the stamp.

        The clocks disagree when the latest odometry is stamped after ``now_ns`` or more than
        ``stale_ns`` before it; predicting across such a gap would invent motion, so the state is
        taken at the stamp (and the caller takes the reference there too). None before any odometry.
        """
        m = self.odometry.latest
        if m is None:
            return None, now_ns
        if 0 <= now_ns - m.stamp_ns <= self.stale_ns:
            return self.commands.predict(m, now_ns), now_ns
        return bicycle_state(m, self.commands.steer_at(m.stamp_ns)), m.stamp_ns
