"""The controller's state estimation (rad2_control.estimation), checked against hand computations.

No ROS: odometry samples are a small stand-in with the fields of ``ros_conversions.EgoMotion``, and
the vehicle is spelled out here so every expectation can be computed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from rad2_control.estimation import (
    CommandHistory,
    OdometryHistory,
    StateEstimator,
    SteeringRamp,
    odometry_jump,
    steps_advance,
)
from rad2_core.bicycle import VehicleParams, propagate, slip_and_curvature

MS = 1_000_000  # ns per ms
STEP = 0.1  # controller step (s)
VEH = VehicleParams(length=4.5, width=1.9, wheelbase=2.8, rear_axle_to_center=1.4, max_accel=3.0,
                    min_accel=-8.0, max_steer=0.6, max_steer_rate=0.5, max_speed=20.0)


@dataclass(frozen=True)
class Motion:
    x: float
    y: float
    yaw: float
    speed: float
    yaw_rate: float = 0.0
    stamp_ns: int = 0


# -- steering model ---------------------------------------------------------------------------------


def test_ramp_partial_step_then_hold():
    ramp = SteeringRamp.at_rate(1000 * MS, 0.1, 0.3, STEP, VEH)
    assert ramp.angle_at(900 * MS) == pytest.approx(0.1)  # not started yet
    assert ramp.angle_at(1050 * MS) == pytest.approx(0.1 + 0.3 * 0.05)  # half a step: 0.115
    assert ramp.end_ns == 1100 * MS
    assert ramp.angle_at(1100 * MS) == pytest.approx(0.13)  # one step: 0.1 + 0.3 * 0.1
    assert ramp.angle_at(5000 * MS) == pytest.approx(0.13)  # then held, however long


def test_ramp_rate_is_clamped_at_the_vehicle_limit():
    # a 0.3 rad target in one 0.1 s step would need 3 rad/s: the ramp runs at 0.5 rad/s instead
    ramp = SteeringRamp.towards(0, 0.0, 0.3, STEP, VEH)
    assert ramp.rate == pytest.approx(0.5)
    assert ramp.angle_at(50 * MS) == pytest.approx(0.025)
    assert ramp.angle_at(300 * MS) == pytest.approx(0.05)
    assert SteeringRamp.at_rate(0, 0.0, -2.0, STEP, VEH).rate == pytest.approx(-0.5)
    # a reachable target is met exactly at the end of the step
    near = SteeringRamp.towards(0, 0.1, 0.07, STEP, VEH)
    assert near.rate == pytest.approx(-0.3)
    assert near.angle_at(100 * MS) == pytest.approx(0.07) and near.angle_at(400 * MS) == pytest.approx(0.07)


def test_ramp_stays_within_the_steering_limit():
    ramp = SteeringRamp.at_rate(0, 0.58, 0.5, STEP, VEH)  # would reach 0.63
    assert ramp.angle_at(20 * MS) == pytest.approx(0.59)
    assert ramp.angle_at(100 * MS) == pytest.approx(0.6)


# -- issued commands ----------------------------------------------------------------------------------


def test_steering_estimate_integrates_real_elapsed_time():
    hist = CommandHistory(VEH, STEP, 1000 * MS, min_heading_speed=0.5)
    assert hist.steer_at(0) == 0.0  # nothing issued yet
    hist.issue(0, 0.0, 0.3, 0.0)
    assert hist.steer_at(50 * MS) == pytest.approx(0.015)
    # missed cycles: the command's ramp ends after one controller step, then the angle holds
    assert hist.steer_at(100 * MS) == pytest.approx(0.03)
    assert hist.steer_at(400 * MS) == pytest.approx(0.03)
    hist.issue(400 * MS, 0.0, -0.1, hist.steer_at(400 * MS))
    assert hist.steer_at(450 * MS) == pytest.approx(0.025)
    assert hist.steer_at(300 * MS) == pytest.approx(0.03)  # the first command still answers its time


def test_reset_estimates_steering_from_the_yaw_rate():
    hist = CommandHistory(VEH, STEP, 1000 * MS, min_heading_speed=0.5)
    hist.issue(0, 1.0, 0.3, 0.0)
    kappa = 0.02  # 1/m: 10 m/s at 0.2 rad/s
    hist.reset(Motion(0.0, 0.0, 0.0, 10.0, yaw_rate=0.2))
    assert len(hist) == 0
    assert float(slip_and_curvature(hist.steer_at(0), VEH)[1]) == pytest.approx(kappa)
    hist.reset(Motion(0.0, 0.0, 0.0, 0.4, yaw_rate=0.2))  # below min_heading_speed: straight
    assert hist.steer_at(0) == 0.0
    hist.reset(Motion(0.0, 0.0, 0.0, 10.0, yaw_rate=float("nan")))
    assert hist.steer_at(0) == 0.0


def test_history_window_keeps_the_command_in_force_at_its_start():
    hist = CommandHistory(VEH, STEP, 1000 * MS, min_heading_speed=0.5)
    hist.issue(0, 0.0, 0.3, 0.0)
    hist.issue(500 * MS, 0.0, -0.1, hist.steer_at(500 * MS))  # 0.03 -> 0.02
    hist.issue(1400 * MS, 0.0, 0.0, hist.steer_at(1400 * MS))  # window starts at 0.4 s: all kept
    assert [c.stamp_ns for c in hist.commands] == [0, 500 * MS, 1400 * MS]
    hist.issue(1500 * MS, 0.0, 0.0, hist.steer_at(1500 * MS))  # window starts at 0.5 s
    # the command at 0 s is no longer needed: the one at 0.5 s is in force at the window start
    assert [c.stamp_ns for c in hist.commands] == [500 * MS, 1400 * MS, 1500 * MS]
    # before the oldest kept command the estimate is the angle the dropped one left
    assert hist.steer_at(200 * MS) == pytest.approx(0.03)
    assert hist.steer_at(1450 * MS) == pytest.approx(0.02)


def test_prediction_equals_propagate_under_the_issued_commands():
    hist = CommandHistory(VEH, STEP, 1000 * MS, min_heading_speed=0.5)
    odom = Motion(1.0, 2.0, 0.3, 8.0, stamp_ns=0)
    hist.reset(odom)
    hist.issue(20 * MS, 1.0, 0.2, 0.0)  # 20 ms: accel 1, steering ramps at 0.2 rad/s
    hist.issue(70 * MS, -2.0, 0.0, hist.steer_at(70 * MS))
    x = hist.predict(odom, 200 * MS)
    # by hand: coast 20 ms, (1, 0.2) for 50 ms, (-2, 0) for 130 ms (split where its ramp ends, 170 ms)
    want = propagate(np.array([1.0, 2.0, 0.3, 8.0, 0.0]),
                     np.array([[0, 0], [1.0, 0.2], [-2.0, 0.0], [-2.0, 0.0]]),
                     np.array([0.02, 0.05, 0.1, 0.03]), VEH, STEP)
    np.testing.assert_allclose(x, want, atol=1e-12)
    assert x[4] == pytest.approx(0.2 * 0.05, abs=1e-12) and x[3] == pytest.approx(8.0 + 0.05 - 0.26)
    # odometry stamped inside a ramp: the ramp goes on from the estimate at the stamp
    odom2 = Motion(1.0, 2.0, 0.3, 8.0, stamp_ns=40 * MS)
    want2 = propagate(np.array([1.0, 2.0, 0.3, 8.0, 0.2 * 0.02]), np.array([[1.0, 0.2], [-2.0, 0.0]]),
                      np.array([0.03, 0.03]), VEH, STEP)
    np.testing.assert_allclose(hist.predict(odom2, 100 * MS), want2, atol=1e-12)
    # nothing to predict: the odometry state itself, with the steering estimate at its stamp
    np.testing.assert_allclose(hist.predict(odom2, 40 * MS), [1.0, 2.0, 0.3, 8.0, 0.004], atol=1e-15)


def test_prediction_without_commands_coasts_straight():
    hist = CommandHistory(VEH, STEP, 1000 * MS, min_heading_speed=0.5)
    odom = Motion(0.0, 0.0, 0.0, 8.0)
    hist.reset(odom)
    np.testing.assert_allclose(hist.predict(odom, 250 * MS), [2.0, 0.0, 0.0, 8.0, 0.0], atol=1e-12)


# -- odometry -----------------------------------------------------------------------------------------


def test_odometry_jump_bound():
    prev = Motion(0.0, 0.0, 0.0, 5.0, stamp_ns=0)
    # 0.1 s at max_speed 20 m/s plus one 4.5 m vehicle length: 6.5 m
    assert odometry_jump(prev, Motion(6.49, 0.0, 0.0, 5.0, stamp_ns=100 * MS), VEH) == ""
    why = odometry_jump(prev, Motion(6.51, 0.0, 0.0, 5.0, stamp_ns=100 * MS), VEH)
    assert why == "odometry moved 6.5 m in 0.10 s"
    # the stamp difference counts either way; a first sample cannot jump
    assert odometry_jump(prev, Motion(3.0, 4.0, 0.0, 5.0, stamp_ns=-100 * MS), VEH) == ""
    assert odometry_jump(None, Motion(400.0, 0.0, 0.0, 5.0), VEH) == ""


def test_pose_lookup_by_stamp_and_window():
    hist = OdometryHistory(1000 * MS)
    assert hist.pose_at(0) is None and hist.latest is None
    for k in range(3):  # stamped and received at 0, 100, 200 ms, slowing down
        hist.add(Motion(float(k), 10.0 * k, 0.1 * k, 5.0 - k, stamp_ns=k * 100 * MS), k * 100 * MS)
    np.testing.assert_allclose(hist.pose_at(140 * MS), [1.0, 10.0, 0.1])
    # the whole sample too: a plan's start is judged at the speed of its stamp, not the latest
    assert hist.motion_at(40 * MS).speed == 5.0 and hist.latest.speed == 3.0
    assert hist.motion_at(1201 * MS) is None
    np.testing.assert_allclose(hist.pose_at(160 * MS), [2.0, 20.0, 0.2])
    np.testing.assert_allclose(hist.pose_at(1200 * MS), [2.0, 20.0, 0.2])  # exactly the window away
    assert hist.pose_at(1201 * MS) is None
    # the window is by receive time: at 1.15 s the samples received at 0 and 0.1 s are dropped
    hist.add(Motion(9.0, 0.0, 0.0, 5.0, stamp_ns=150 * MS), 1150 * MS)
    assert [s.motion.stamp_ns for s in hist.samples] == [200 * MS, 150 * MS]
    assert hist.latest.x == 9.0
    np.testing.assert_allclose(hist.pose_at(0), [9.0, 0.0, 0.0])


# -- the estimator ------------------------------------------------------------------------------------


def test_estimator_resets_on_a_jump_and_aligns_the_state_in_time():
    est = StateEstimator(VEH, STEP, history_ns=1000 * MS, stale_ns=500 * MS, min_heading_speed=0.5)
    assert est.state(0) == (None, 0)
    assert est.add_odometry(Motion(0.0, 0.0, 0.0, 8.0, stamp_ns=0), 0) == ""
    est.commands.issue(10 * MS, 0.0, 0.3, 0.0)
    assert est.add_odometry(Motion(0.8, 0.0, 0.0, 8.0, stamp_ns=100 * MS), 100 * MS) == ""
    assert len(est.odometry) == 2 and len(est.commands) == 1
    # clocks agree: predicted to `now` under the issued command
    x, t = est.state(150 * MS)
    assert t == 150 * MS
    np.testing.assert_allclose(x, est.commands.predict(est.odometry.latest, 150 * MS))
    # odometry after `now`, or older than the stale timeout: taken at its stamp
    for now in (90 * MS, 601 * MS):
        x, t = est.state(now)
        assert t == 100 * MS
        np.testing.assert_allclose(x, [0.8, 0.0, 0.0, 8.0, 0.3 * 0.09], atol=1e-15)  # 90 ms of ramp
    # a jump drops both histories and restarts the steering estimate from the yaw rate
    assert est.add_odometry(Motion(400.0, 50.0, 1.0, 8.0, stamp_ns=200 * MS), 200 * MS)
    assert len(est.odometry) == 1 and len(est.commands) == 0
    assert est.commands.steer_at(200 * MS) == 0.0


def test_warm_start_is_replaced_once_a_step_has_passed():
    assert not steps_advance(0, 99 * MS, STEP)
    assert steps_advance(0, 100 * MS, STEP)
