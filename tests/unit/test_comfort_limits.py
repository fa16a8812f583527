"""The executed plan's longitudinal comfort limits (rad2_planner/comfort_limits.py)."""

from __future__ import annotations

import numpy as np
import pytest
from rad2_core.config import load_params
from rad2_planner.comfort_limits import ComfortLimitParams, limit_acceleration

DT = 0.5
LIMITS = ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05)


def _plan_from_speeds(v0: float, accels: list[float]) -> np.ndarray:
    """A straight plan along x: constant acceleration per interval from speed v0 (clipped at 0)."""
    s, v, pts = 0.0, v0, []
    for a in accels:
        v_next = max(v + a * DT, 0.0)
        s += 0.5 * (v + v_next) * DT
        v = v_next
        pts.append((s, 0.0))
    return np.array(pts)


def _progress(plan: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(np.vstack([[0.0, 0.0], plan]), axis=0).T))])


def test_a_hard_start_is_re_timed_within_the_limits_and_never_ahead_of_the_plan():
    plan = _plan_from_speeds(0.0, [4.0] * 8)  # 4 m/s^2 from standstill
    out = limit_acceleration(plan, DT, ego_speed=0.0, ego_accel=0.0, p=LIMITS)
    s_plan, s_out = _progress(plan), _progress(out)
    assert np.all(s_out <= s_plan + 1e-9) and s_out[-1] < s_plan[-1]
    speed = np.diff(s_out) / DT  # interval mean speeds
    accel = np.diff(np.concatenate([[0.0], speed])) / DT
    assert accel.max() <= LIMITS.max_accel + 1e-6, accel
    # the acceleration builds up at the jerk limit: the first interval's mean is at most j*dt^2/6 ...
    assert speed[0] <= LIMITS.max_jerk * DT**2 / 2 + 1e-6
    # ... and the path is kept (points stay on the x axis, in order)
    assert np.allclose(out[:, 1], 0.0) and np.all(np.diff(out[:, 0]) > 0)


def test_cruising_and_braking_plans_are_left_as_they_are():
    cruise = _plan_from_speeds(10.0, [0.0] * 8)
    assert np.array_equal(limit_acceleration(cruise, DT, 10.0, 0.0, LIMITS), cruise)
    brake = _plan_from_speeds(10.0, [-6.0] * 8)  # hard braking to a stop: never limited
    assert np.array_equal(limit_acceleration(brake, DT, 10.0, -2.0, LIMITS), brake)


def test_a_stop_in_the_plan_is_kept_and_braking_is_not_prolonged():
    # speed up hard, then stop 0.5 s later: the re-timed plan never passes the plan's stop point
    plan = _plan_from_speeds(2.0, [4.0, 4.0, -8.0, -8.0, 0.0, 0.0, 0.0, 0.0])
    out = limit_acceleration(plan, DT, 2.0, 0.0, LIMITS)
    assert _progress(out)[-1] <= _progress(plan)[-1] + 1e-9
    # an ego that is braking now may accelerate again at once (the build-up starts from zero)
    gentle = _plan_from_speeds(8.0, [1.0] * 8)
    out = limit_acceleration(gentle, DT, 8.0, -3.0, LIMITS)
    assert _progress(out)[1] > 8.0 * DT  # it did not keep braking


def test_an_even_acceleration_within_the_limits_is_followed_not_lagged():
    """A plan accelerating at 1.5 m/s^2 (within max_accel) is executed at that acceleration: the
    limiter follows the plan's speed between the intervals' means instead of chasing a step at every
    knot, which rebuilt the acceleration from zero each 0.5 s and lost about 1.9 m over these 4 s."""
    for v0, a0 in ((2.0, 1.5), (0.0, 0.0), (5.0, 0.0)):
        plan = _plan_from_speeds(v0, [1.5] * 8)
        s_plan = _progress(plan)
        s_out = _progress(limit_acceleration(plan, DT, v0, a0, LIMITS))
        assert np.all(s_out <= s_plan + 1e-9)
        # only the first interval's catch-up (and the jerk build-up from rest) is lost, never more
        assert s_plan[-1] - s_out[-1] < 0.4, (v0, a0, s_plan[-1] - s_out[-1])
        # from the second interval on, each interval's speed is within 0.35 m/s of the plan's
        lag = np.diff(s_plan)[1:] / DT - np.diff(s_out)[1:] / DT
        assert lag.max() < 0.35, (v0, a0, lag)


def test_params_come_from_the_planner_file_and_bad_values_are_named():
    p = ComfortLimitParams.from_params(load_params("planner"))
    assert p.max_accel > 0 and p.max_jerk > 0
    with pytest.raises(ValueError, match="comfort_limits.max_jerk: must be a positive number, got -1.0"):
        ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=-1.0, step_s=0.05)


def test_impossible_ego_values_cannot_push_the_plan_further():
    """An ego speed of 1e6 m/s or an acceleration of 1e7 m/s^2 (rejected upstream by the validators)
    still never moves a point past the plan's own: the stage only ever slows a plan."""
    plan = _plan_from_speeds(5.0, [1.0] * 8)
    for speed, accel in ((1e6, 0.0), (5.0, 1e7), (0.0, -1e7), (1e6, 1e7)):
        out = limit_acceleration(plan, DT, speed, accel, LIMITS)
        assert np.all(np.isfinite(out))
        assert np.all(_progress(out) <= _progress(plan) + 1e-9), (speed, accel)


# -- the lateral limit (limit_curve_speed) ---------------------------------------------------------------
CURVES = ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05, max_lateral_accel=3.0,
                            curve_decel=2.0, curvature_chord_m=2.0, min_curve_speed=2.0)


def _turn_plan(speed: float, straight_m: float, radius: float, turn_rad: float) -> tuple[np.ndarray, object]:
    """A constant-speed plan: ``straight_m`` along +x, then a right turn of ``radius``; and the path as a
    function of arc length."""
    arc = radius * turn_rad

    def at(s):
        s = np.asarray(s, np.float64)
        on_arc = np.clip(s - straight_m, 0.0, arc) / radius
        beyond = np.maximum(s - straight_m - arc, 0.0)
        x = np.minimum(s, straight_m) + radius * np.sin(on_arc) + beyond * np.cos(turn_rad)
        y = -radius * (1.0 - np.cos(on_arc)) - beyond * np.sin(turn_rad)
        return np.stack([x, y], axis=-1)

    return at(speed * DT * np.arange(1, 9)), at


def test_a_sharp_junction_turn_is_slowed_to_the_lateral_limit_on_the_same_path():
    plan, _ = _turn_plan(speed=8.0, straight_m=10.0, radius=5.0, turn_rad=np.pi / 2)
    from rad2_planner.comfort_limits import limit_curve_speed

    out = limit_curve_speed(plan, DT, CURVES)
    s_out = _progress(out)
    assert np.all(s_out <= _progress(plan) + 1e-9) and s_out[-1] < _progress(plan)[-1]
    # the points lie on the plan's own path: the polyline through its points (what the tracker follows)
    knots = np.vstack([[0.0, 0.0], plan])
    cum = _progress(plan)
    fine = np.linspace(0.0, cum[-1], 4001)
    dense = np.stack([np.interp(fine, cum, knots[:, 0]), np.interp(fine, cum, knots[:, 1])], axis=-1)
    gap = np.min(np.linalg.norm(out[:, None, :] - dense[None], axis=-1), axis=1)
    assert gap.max() < 0.05, gap
    # inside the turn (stations 11-17 m) the interval speeds respect v^2 / R <= 3 m/s^2, with a slack
    # for the chord-based curvature and the interval mean
    speed = np.diff(s_out) / DT
    mid = 0.5 * (s_out[1:] + s_out[:-1])
    in_turn = (mid > 11.0) & (mid < 17.0)
    assert in_turn.any() and np.all(speed[in_turn] <= np.sqrt(3.0 * 5.0) * 1.15), speed
    # and it brakes into the curve no harder than curve_decel (plus the integration slack)
    assert np.all(np.diff(np.concatenate([[8.0], speed])) / DT >= -CURVES.curve_decel * 1.6), speed


def test_straight_plans_gentle_curves_and_the_switched_off_limit_leave_the_plan_as_it_is():
    from rad2_planner.comfort_limits import limit_curve_speed

    straight = _plan_from_speeds(25.0, [0.0] * 8)
    assert np.array_equal(limit_curve_speed(straight, DT, CURVES), straight)
    # a motorway bend of 400 m radius at 25 m/s: 1.6 m/s^2, within the limit
    bend, _ = _turn_plan(speed=25.0, straight_m=5.0, radius=400.0, turn_rad=0.5)
    assert np.array_equal(limit_curve_speed(bend, DT, CURVES), bend)
    sharp, _ = _turn_plan(speed=8.0, straight_m=10.0, radius=5.0, turn_rad=np.pi / 2)
    off = ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05)  # max_lateral_accel 0
    assert np.array_equal(limit_curve_speed(sharp, DT, off), sharp)
    # a standing plan (all points at the origin) is left alone
    assert np.array_equal(limit_curve_speed(np.zeros((8, 2)), DT, CURVES), np.zeros((8, 2)))


def test_a_negative_lateral_limit_is_named():
    with pytest.raises(ValueError, match="comfort_limits.max_lateral_accel: must be >= 0"):
        ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05, max_lateral_accel=-1.0)


def test_the_plans_own_hard_braking_is_held_to_the_limit_along_its_path_extended():
    from rad2_planner.comfort_limits import limit_plan_braking

    plan = _plan_from_speeds(15.0, [-6.0] * 8)  # 6 m/s^2 to a stop within 2.5 s
    out = limit_plan_braking(plan, DT, 15.0, 3.0)
    s_plan, s_out = _progress(plan), _progress(out)
    speed = np.diff(s_out) / DT  # interval means
    assert speed[0] == pytest.approx(15.0 - 0.5 * 3.0 * DT)  # braking at 3 m/s^2 from now
    assert np.all(-np.diff(speed) / DT <= 3.0 + 1e-6)
    assert np.all(s_out >= s_plan - 1e-9) and s_out[-1] > s_plan[-1] + 10.0  # never behind the plan
    assert np.allclose(out[:, 1], 0.0)  # beyond the plan's stop: straight along its direction
    # a plan braking within the limit, and one that accelerates, are kept as they are
    for v0, accels in ((15.0, [-2.5] * 8), (5.0, [1.0] * 8)):
        gentle = _plan_from_speeds(v0, accels)
        np.testing.assert_array_equal(limit_plan_braking(gentle, DT, v0, 3.0), gentle)
    with pytest.raises(ValueError, match="comfort_limits.max_plan_decel"):
        limit_plan_braking(plan, DT, 15.0, 0.0)
    with pytest.raises(ValueError, match="comfort_limits.max_plan_decel: must be >= 0"):
        ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05, max_plan_decel=-1.0)


def test_the_safety_envelope_after_the_plan_braking_limit_still_stops_before_a_car():
    from rad2_planner.comfort_limits import limit_plan_braking
    from rad2_planner.safety_envelope import SafetyEnvelopeParams, apply_envelope

    # the plan stops 30 m ahead at 6 m/s^2; held to 3 m/s^2 it would run on past a stopped car at 40 m,
    # and the envelope brings the stop back before it (up to the vehicle's limit)
    plan = _plan_from_speeds(18.0, [-6.0] * 8)
    limited = limit_plan_braking(plan, DT, 18.0, 3.0)
    car = np.array([[40.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.5, 1.8, 0.0, 0.0]])
    p = SafetyEnvelopeParams(True, 0.5, 4.0, 4.0, 2.0, 0.2, 1.0, 45.0, 20.0, 1.0, 2.0, 1.0, 2.5, 1.0)
    res = apply_envelope(limited, DT, 18.0, car, np.ones(1, bool), (4.8, 1.9), 8.0, p)
    assert res.fired
    assert _progress(res.plan)[-1] + 0.5 * 4.8 <= 40.0 - 0.5 * 4.5 - 2.0 + 1e-6


def test_the_plan_braking_stage_keeps_the_hard_braking_that_avoids_a_crossing_car():
    from rad2_planner.comfort_limits import limit_plan_braking
    from rad2_planner.stages import CycleContext, PlanBrakingStage

    stage = PlanBrakingStage(ComfortLimitParams(enabled=True, max_accel=2.0, max_jerk=3.0, step_s=0.05,
                                                max_plan_decel=3.0), DT, (4.8, 1.9), 0.2)
    plan = _plan_from_speeds(15.0, [-6.0] * 8)  # stops after 18.75 m
    ego_state = np.array([[15.0, 0.0, 0.0, 0.0]])
    # a car crossing the path 28 m ahead: the plan stops short of it, the plan braking at 3 m/s^2
    # would be there when it crosses
    crossing = np.array([[[28.0, -13.0, 0.0, 1.0, 0.0, 5.0, 4.5, 1.8, 0.0, 0.0]]])
    # the same car driving away from the path
    leaving = crossing.copy()
    leaving[..., 5] = -5.0
    route = np.array([[[0.0, 0.0], [200.0, 0.0]]])
    limited = limit_plan_braking(plan, DT, 15.0, 3.0, route[0])
    for agents, expected in ((crossing, None), (leaving, limited)):
        context = CycleContext(inputs={"ego_state": ego_state, "agents": agents,
                                       "agents_mask": np.ones((1, 1), bool), "route": route,
                                       "route_mask": np.ones((1, 2), bool)})
        out, note = stage.retime(plan, context, 0)
        if expected is None:
            assert out is None and note == ""
        else:
            np.testing.assert_allclose(out, expected)
            assert "3 m/s^2" in note


def test_past_its_end_the_softer_plan_follows_the_route_and_keeps_its_braking_for_a_curve():
    from rad2_planner.comfort_limits import limit_plan_braking

    plan = _plan_from_speeds(15.0, [-6.0] * 8)  # straight, stops after 18.75 m
    # the route turns left (radius 20 m) from x = 20 m
    theta = np.linspace(0.0, np.pi / 2, 40)
    arc = np.stack([20.0 + 20.0 * np.sin(theta), 20.0 - 20.0 * np.cos(theta)], -1)
    route = np.vstack([[[0.0, 0.0]], arc])
    along = limit_plan_braking(plan, DT, 15.0, 3.0, route)
    assert _progress(along)[-1] > 30.0 and along[-1, 1] > 3.0  # on into the curve, not straight on
    straight = limit_plan_braking(plan, DT, 15.0, 3.0)
    assert np.allclose(straight[:, 1], 0.0)
    # cornering at 3 m/s^2 on a 20 m radius allows 7.7 m/s: the softer plan is no faster in the curve
    careful = limit_plan_braking(plan, DT, 15.0, 3.0, route, curve_accel=3.0)
    speed = np.diff(_progress(careful)) / DT
    in_curve = np.nonzero(_progress(careful)[1:] > 24.0)[0]
    assert len(in_curve) and np.all(speed[in_curve] <= np.sqrt(3.0 * 20.0) + 0.5)
    assert _progress(careful)[-1] < _progress(along)[-1]


def test_a_plan_braking_through_a_turn_of_its_own_is_kept():
    from rad2_planner.comfort_limits import limit_plan_braking

    # from 10 m/s, braking hard into a left turn of 12 m radius that it takes at 5 m/s (2 m/s^2 lateral)
    speeds = [8.5, 6.5, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    s = np.cumsum(np.array(speeds) * DT)
    turn = np.maximum(s - 8.0, 0.0) / 12.0
    plan = np.stack([np.minimum(s, 8.0) + 12.0 * np.sin(turn), 12.0 * (1.0 - np.cos(turn))], -1)
    np.testing.assert_array_equal(limit_plan_braking(plan, DT, 10.0, 2.5, curve_accel=1.5), plan)
    assert not np.array_equal(limit_plan_braking(plan, DT, 10.0, 2.5), plan)  # unchecked: softened


def test_a_route_that_gives_no_direction_continues_the_softer_plan_straight_on():
    from rad2_planner.comfort_limits import limit_plan_braking

    plan = _plan_from_speeds(15.0, [-6.0] * 8)
    straight = limit_plan_braking(plan, DT, 15.0, 3.0)
    for route in (np.zeros((3, 2)), np.array([[0.0, 0.0], [np.nan, 1.0]])):
        np.testing.assert_allclose(limit_plan_braking(plan, DT, 15.0, 3.0, route), straight)
