"""Mission pace (rad2_planner/mission_pace.py): the speed a mission with a goal window asks for, the
plan re-timed towards it (faster only along a clear road ahead, slower along its own path), the stage
through the policy, and plan_batch's refusal of impossible mission speeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rad2_core.config import load_merged, load_params
from rad2_planner.mission_pace import MissionPaceParams, arrival_speed
from rad2_planner.stall_recovery import retime_towards

PARAMS = load_merged()
BEV = load_params("bev")
P = MissionPaceParams.from_params(load_params("planner"))
DT = 0.5


def _straight(speed: float, n: int = 8) -> np.ndarray:
    return np.stack([np.arange(1, n + 1) * DT * speed, np.zeros(n)], axis=-1)


def _progress(plan: np.ndarray) -> np.ndarray:
    return np.cumsum(np.hypot(*np.diff(np.vstack([[0.0, 0.0], plan]), axis=0).T))


def test_the_pace_covers_the_distance_left_in_the_time_left():
    assert arrival_speed(150.0, 10.0, (12.0, 18.0), 35.0, 1.0) == pytest.approx(15.0)
    assert arrival_speed(-5.0, 10.0, None, 35.0, 1.0) == 0.0  # past the goal's centre: no hurry
    assert arrival_speed(1000.0, 10.0, None, 35.0, 1.0) == 35.0  # never beyond the vehicle's top speed
    # at the window: the goal's own speed, or none without one
    assert arrival_speed(3.0, 0.5, (12.0, 18.0), 35.0, 1.0) == pytest.approx(15.0)
    assert math.isnan(arrival_speed(3.0, 0.5, None, 35.0, 1.0))
    assert math.isnan(arrival_speed(float("nan"), 5.0, None, 35.0, 1.0))


def test_faster_along_the_route_never_behind_the_plan_and_slower_never_ahead():
    route = np.stack([np.arange(60) * 2.5, np.zeros(60)], axis=-1)
    plan = _straight(10.0)
    faster = retime_towards(plan, 10.0, DT, route, 15.0, P.accel, P.decel, P.horizon_s, P.curve_accel,
                            P.min_gain_m, P.join_margin_m)
    assert faster is not None and len(faster) >= len(plan)
    assert np.all(_progress(faster[: len(plan)]) >= _progress(plan) - 1e-9)
    speeds = np.diff(np.concatenate([[0.0], _progress(faster)])) / DT
    assert speeds.max() <= 15.0 + 1e-6 and speeds[-1] == pytest.approx(15.0)
    assert np.all(np.diff(speeds[1:]) <= P.accel * DT + 1e-6)  # at most accel
    slower = retime_towards(plan, 10.0, DT, route, 5.0, P.accel, P.decel, P.horizon_s, P.curve_accel,
                            P.min_gain_m, P.join_margin_m)
    assert slower is not None and len(slower) == len(plan)
    assert np.all(_progress(slower) <= _progress(plan) + 1e-9)
    assert np.all(np.abs(slower[:, 1]) < 1e-9)  # along the plan's own path
    # at the pace already: nothing to change
    assert retime_towards(plan, 10.0, DT, route, 10.1, P.accel, P.decel, P.horizon_s, P.curve_accel,
                          P.min_gain_m, P.join_margin_m) is None


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="mission_pace.accel"):
        MissionPaceParams(True, 0.0, 1.5, 2.0, 6.0, 0.5, 0.5, 1.0, 6.0)
    with pytest.raises(ValueError, match="mission_pace.join_margin_m"):
        MissionPaceParams(True, 1.5, 1.5, 2.0, 6.0, 0.5, 0.5, 1.0, float("nan"))


@pytest.fixture(scope="module")
def policy_and_inputs():
    from rad2_planner.policy import Rad2Policy
    from synthetic_scenes import empty_road_inputs

    policy = Rad2Policy.from_params(PARAMS, backend="pytorch")
    return policy, empty_road_inputs(policy, BEV, speed=10.0)


def test_the_stage_paces_a_plan_only_on_a_clear_road_and_only_with_a_mission(policy_and_inputs):
    """Through the policy's stage: a 10 m/s plan with a 15 m/s mission speed on an empty road goes
    faster and says so; a car standing in the lane 30 m ahead, or no mission speed (NaN, None), leaves
    it as it is; a car behind does not hold it back; a slower mission speed slows it."""
    from rad2_planner.stages import CycleContext, CyclePlans

    policy, inputs = policy_and_inputs
    candidates = np.stack([_straight(10.0)] * 4)[None].astype(np.float32)

    def run(inp, target):
        ctx = CycleContext(inp, target_speeds=None if target is None else np.array([target]))
        out = policy.pipeline.stage("mission_pace").apply(CyclePlans.of(candidates, [0]), ctx)
        return out.executed[0], out.notes("mission_pace")[0]

    executed, note = run(inputs, 15.0)
    assert note.startswith("towards the mission's pace 15.0 m/s (faster)")
    assert executed.shape == (8, 2) and executed[-1, 0] > candidates[0, 0, -1, 0] + P.min_gain_m
    assert run(inputs, float("nan"))[1] == "" and run(inputs, None)[1] == ""
    ahead = {k: v.copy() for k, v in inputs.items()}
    ahead["agents"][0, 0, :8] = [30.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.5, 1.9]  # standing in the lane
    ahead["agents_mask"][0, 0] = True
    assert run(ahead, 15.0)[1] == ""
    behind = {k: v.copy() for k, v in ahead.items()}
    behind["agents"][0, 0, :8] = [-12.0, 0.0, 1.0, 0.0, 14.0, 0.0, 4.5, 1.9]  # closing from behind
    assert run(behind, 15.0)[1].startswith("towards the mission's pace 15.0 m/s (faster)")
    crossing = {k: v.copy() for k, v in ahead.items()}  # behind the ego's centre, crossing its path
    crossing["agents"][0, 0, :8] = [-1.0, -10.0, 0.766, 0.643, 12.0, 10.0, 4.5, 1.9]
    assert run(crossing, 15.0)[1] == ""
    slow, note = run(inputs, 6.0)
    assert note.startswith("towards the mission's pace 6.0 m/s (slower)")
    assert slow[-1, 0] < candidates[0, 0, -1, 0]


def test_plan_batch_refuses_impossible_mission_speeds(policy_and_inputs):
    from rad2_planner.policy import _target_speeds

    assert _target_speeds(None, 2) is None
    assert np.isnan(_target_speeds([float("nan"), 3.0], 2)[0])
    with pytest.raises(ValueError, match="target_speeds: 1 values for 2 rows"):
        _target_speeds([3.0], 2)
    with pytest.raises(ValueError, match="target_speeds: value -1.0"):
        _target_speeds([-1.0, 3.0], 2)
    with pytest.raises(ValueError, match="target_speeds: value inf"):
        _target_speeds([float("inf"), 3.0], 2)
    with pytest.raises(ValueError, match="target_speeds: value 1000000.0 is above the vehicle's top speed"):
        _target_speeds([1e6, 3.0], 2, 35.0)
    policy, inputs = policy_and_inputs
    assert policy.max_speed == pytest.approx(float(PARAMS["vehicle"]["max_speed"]))


def test_a_mission_speed_is_refused_naming_the_value():
    from rad2_planner.mission_pace import mission_speed_fault

    assert mission_speed_fault(float("nan")) is None and mission_speed_fault(12.0, 35.0) is None
    assert mission_speed_fault(-0.5) == "value -0.5 is not a speed >= 0 (NaN: none)"
    assert "value inf" in mission_speed_fault(float("inf"))
    assert mission_speed_fault(40.0, 35.0) == "value 40.0 is above the vehicle's top speed 35 m/s"
