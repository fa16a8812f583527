"""The bound on a tracking command's braking (rad2_control.braking): the plan's own demand, the
minimal-risk stop's after a fault, and a reason that names the plan truthfully."""

from __future__ import annotations

import numpy as np
import pytest
from rad2_control.braking import BrakingLimits, bound_braking, plan_acceleration
from rad2_core.config import load_params

LIMITS = BrakingLimits(comfort_decel=3.0, emergency_decel=4.05, stop_decel=2.5, demand_window_s=1.0)
DT = 0.1


def test_the_shipped_parameters_build_the_limits():
    limits = BrakingLimits.from_params(load_params("controller")["controller"]["node"])
    assert limits.stop_decel < limits.comfort_decel < limits.emergency_decel


@pytest.mark.parametrize("field", ["comfort_decel", "emergency_decel", "stop_decel", "demand_window_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_impossible_limits_are_refused_naming_the_field(field, value):
    kwargs = dict(comfort_decel=3.0, emergency_decel=4.05, stop_decel=2.5, demand_window_s=1.0)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        BrakingLimits(**kwargs)


def test_plan_acceleration_reads_the_plans_own_speeds():
    constant = np.full(40, 10.0)
    assert plan_acceleration(constant, DT, 1.0) == 0.0
    speeding_up = 10.0 + 1.0 * DT * np.arange(40)
    assert plan_acceleration(speeding_up, DT, 1.0) == 0.0
    stopping = np.maximum(10.0 - 6.0 * DT * np.arange(1, 41), 0.0)
    assert plan_acceleration(stopping, DT, 1.0) == pytest.approx(-6.0)
    # braking that starts after the window is not this command's business
    late = np.concatenate([np.full(15, 10.0), np.maximum(10.0 - 6.0 * DT * np.arange(1, 26), 0.0)])
    assert plan_acceleration(late, DT, 1.0) == 0.0
    assert plan_acceleration(late, DT, 2.0) == pytest.approx(-6.0)
    # a reference it cannot read asks for nothing (the tracker's own checks refuse it elsewhere)
    assert plan_acceleration(np.array([10.0]), DT, 1.0) == 0.0
    assert plan_acceleration(np.array([10.0, np.nan, 3.0]), DT, 1.0) == 0.0
    with pytest.raises(ValueError, match="dt"):
        plan_acceleration(constant, 0.0, 1.0)


@pytest.mark.parametrize("tracker_accel", [-8.0, -6.0, -3.5, -3.0001])
def test_a_constant_speed_plan_never_brakes_beyond_comfort(tracker_accel):
    d = bound_braking(tracker_accel, 0.0, LIMITS, plan_label="the plan stamped 1.000 s")
    assert d.accel == pytest.approx(-3.0) and d.bounded
    assert d.reason == "" and not d.emergency  # nothing is blamed on a plan that asks for no braking


def test_within_comfort_the_tracker_is_left_alone():
    for accel in (-2.9, -1.0, 0.0, 2.0):
        d = bound_braking(accel, 0.0, LIMITS, plan_label="p")
        assert d.accel == accel and d.reason == "" and not d.emergency and not d.bounded


def test_a_plan_that_brakes_hard_is_followed_and_named():
    d = bound_braking(-8.0, -6.0, LIMITS, plan_label="the plan stamped 12.300 s")
    assert d.accel == pytest.approx(-6.0) and d.bounded  # as hard as the plan itself, no harder
    assert "the plan stamped 12.300 s brakes at -6.00 m/s^2 itself" in d.reason
    assert d.emergency  # beyond emergency_decel: flagged
    mild = bound_braking(-3.8, -3.6, LIMITS, plan_label="p")
    assert mild.accel == pytest.approx(-3.6) and "itself" in mild.reason and not mild.emergency


def test_recovery_brakes_no_harder_than_the_minimal_risk_stop_on_an_old_plan():
    fault = "odometry lost: 0.50 s since the last accepted sample"
    for plan_accel in (0.0, -2.5, -6.0):  # a fallback made during the fault asks nothing of now
        d = bound_braking(-8.0, plan_accel, LIMITS, plan_label="p", recovering=fault, plan_after_fault=False)
        assert d.accel == pytest.approx(-2.5) and d.reason == "" and not d.emergency


def test_recovery_on_a_plan_made_since_names_the_hazard():
    fault = "odometry lost: 0.50 s since the last accepted sample"
    d = bound_braking(-8.0, -5.0, LIMITS, plan_label="the plan stamped 3.100 s", recovering=fault,
                      plan_after_fault=True)
    assert d.accel == pytest.approx(-5.0) and d.emergency
    assert "made after the fault cleared" in d.reason and "odometry lost" in d.reason
    assert "brakes at -5.00 m/s^2 itself" in d.reason
    # a fresh plan that asks for no braking: the minimal-risk stop's bound holds
    calm = bound_braking(-8.0, 0.0, LIMITS, plan_label="p", recovering=fault, plan_after_fault=True)
    assert calm.accel == pytest.approx(-2.5) and calm.reason == ""
    # between the stop's and the comfort deceleration, still named (harder than the stop did)
    between = bound_braking(-2.8, -2.8, LIMITS, plan_label="p", recovering=fault, plan_after_fault=True)
    assert between.accel == pytest.approx(-2.8) and "harder than the minimal-risk stop" in between.reason
    assert not between.emergency


def test_non_finite_inputs():
    with pytest.raises(ValueError, match="accel"):
        bound_braking(float("nan"), 0.0, LIMITS, plan_label="p")
    d = bound_braking(-8.0, float("nan"), LIMITS, plan_label="p")  # an unreadable demand is none
    assert d.accel == pytest.approx(-3.0) and d.reason == ""
