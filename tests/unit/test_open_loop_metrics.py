"""Hand-made cases for rad2_core.open_loop_metrics (ego box headings, offroad, collisions)."""

import numpy as np
import pytest
from rad2_core.config import load_params
from rad2_core.open_loop_metrics import (
    LoggedFuture,
    OpenLoopAccumulator,
    offroad,
    plan_collisions,
    plan_headings,
    vehicle_max_curvature,
)

RES = 0.5
ORIGIN = (-16.0, -32.0)
EGO = (4.8, 1.9)
KAPPA = 0.22  # about the vehicle's (tan(0.6) cos(beta) / 2.9)
SIM, VEHICLE = load_params("sim"), load_params("vehicle")
VEHICLE_KAPPA = vehicle_max_curvature(VEHICLE)
STATIC_SPEED = float(SIM["metrics"]["open_loop_static_speed"])


def straight_road(half_width: float) -> np.ndarray:
    """BEV drivable channel (128 x 128, params/bev.yaml geometry) of a straight road along +x."""
    y = ORIGIN[1] + (np.arange(128) + 0.5) * RES  # row centres
    return np.repeat((np.abs(y) < half_width)[:, None], 128, axis=1).astype(np.float32)


def standstill_jitter() -> np.ndarray:
    """What a diffusion plan of a stopped ego looks like: decimetre jitter, creeping backwards."""
    return np.array(
        [[0.05, 0.01], [-0.16, 0.02], [-0.28, 0.03], [-0.49, -0.03],
         [-0.45, 0.01], [-0.74, -0.05], [-0.74, -0.02], [-0.86, -0.14]]
    )  # selected plan of eval_efficiency sumo_slow_leader_20350104 at t = 70 (ego speed 0)


def future(ego_xy: np.ndarray, agent_pose=None, agent_speed=5.0) -> LoggedFuture:
    t = len(ego_xy)
    if agent_pose is None:
        pose, size = np.zeros((0, t, 3)), np.zeros((0, 2))
        spd, valid = np.zeros((0, t + 1)), np.zeros((0, t), bool)
    else:
        pose = np.broadcast_to(np.asarray(agent_pose, float), (1, t, 3)).copy()
        size, spd, valid = np.array([[4.5, 1.9]]), np.full((1, t + 1), agent_speed), np.ones((1, t), bool)
    return LoggedFuture(ego_xy, np.ones(t, bool), pose, size, spd, valid, EGO)


def test_vehicle_max_curvature_from_params():
    assert VEHICLE_KAPPA == pytest.approx(KAPPA, abs=0.02)


def test_standstill_jitter_does_not_spin_the_box():
    plan = standstill_jitter()
    raw = np.degrees(plan_headings(plan))  # the old metric: swings to 44 deg, -134 deg ...
    assert np.abs(((raw + 90) % 180) - 90).max() > 40
    yaw = np.degrees(plan_headings(plan, max_curvature=KAPPA))
    assert np.abs(yaw).max() < 10.0  # reversing along the axis, small turns only
    road = straight_road(1.6)  # one 3.2 m lane, the ego centred in it
    assert offroad(plan, EGO, road, ORIGIN, RES, max_curvature=np.inf)  # the false alarm
    assert not offroad(plan, EGO, road, ORIGIN, RES, VEHICLE_KAPPA)  # the vehicle's curvature
    # and no phantom collision with a car passing in the next lane (3.2 m to the left)
    fut = future(np.zeros((8, 2)), agent_pose=[2.5, 3.2, 0.0])
    assert plan_collisions(plan[None], fut, STATIC_SPEED, max_curvature=np.inf)["collision"][0]
    assert not plan_collisions(plan[None], fut, STATIC_SPEED, VEHICLE_KAPPA)["collision"][0]


def test_heading_is_the_tangent_on_an_arc():
    r, dphi = 20.0, 0.15  # 3 m steps on a 20 m left turn
    phi = dphi * (np.arange(8) + 1)
    plan = np.stack([r * np.sin(phi), r * (1 - np.cos(phi))], -1)
    yaw = plan_headings(plan, max_curvature=KAPPA)
    assert yaw[:-1] == pytest.approx(phi[:-1], abs=1e-6)  # chord k-1 -> k+1 is parallel to the tangent
    assert yaw[-1] == pytest.approx(phi[-1] - dphi / 2, abs=1e-6)  # last point: arriving segment
    lagging = plan_headings(plan)  # the arriving segment: half a step behind
    assert lagging[:-1] == pytest.approx(phi[:-1] - dphi / 2, abs=1e-6)


def test_turn_rate_is_limited_by_distance_moved():
    # 0.5 m to the side after 8 m ahead: a 45 deg segment; 0.7 m may turn the box by 0.7 * KAPPA
    plan = np.array([[2.0, 0], [4, 0], [6, 0], [8, 0], [8.5, 0.5], [8.5, 0.5], [8.5, 0.5], [8.5, 0.5]])
    yaw = plan_headings(plan, max_curvature=KAPPA)
    assert yaw[:3] == pytest.approx(0.0, abs=1e-9)
    assert abs(yaw[4] - yaw[3]) <= KAPPA * np.hypot(0.5, 0.5) + 1e-9
    assert abs(yaw[4]) < np.radians(30)  # the segment points at 45 deg
    assert yaw[5:] == pytest.approx(yaw[4])  # standing still keeps the heading


def test_offroad_known_answers():
    road = straight_road(1.75)  # 3.5 m road
    t = np.arange(1, 9) * 0.5
    centred = np.stack([10 * t, np.zeros(8)], -1)
    assert not offroad(centred, EGO, road, ORIGIN, RES, VEHICLE_KAPPA)
    drifting = np.stack([10 * t, -0.25 * np.arange(1, 9)], -1)  # 2 m to the right after 4 s
    assert offroad(drifting, EGO, road, ORIGIN, RES, VEHICLE_KAPPA)
    beyond = np.stack([30 * t, np.zeros(8)], -1)  # past the raster's front edge: not judged
    assert not offroad(beyond, EGO, road, ORIGIN, RES, VEHICLE_KAPPA)


def test_collision_with_a_leader_the_plan_runs_into():
    t = np.arange(1, 9) * 0.5
    plan = np.stack([8 * t, np.zeros(8)], -1)  # 32 m in 4 s
    fut = future(plan * 0.5, agent_pose=[25.0, 0.0, 0.0], agent_speed=1.0)  # slow leader 25 m ahead
    col = plan_collisions(plan[None], fut, STATIC_SPEED, VEHICLE_KAPPA)
    assert col["collision"][0] and col["dynamic"][0] and not col["static"][0]
    acc = OpenLoopAccumulator.from_params(SIM, VEHICLE)
    acc.add(plan[None], 0, fut, straight_road(1.75), ORIGIN, RES)
    s = acc.summary()
    assert s["CR"] == 100.0 and s["DCR"] == 100.0 and s["offroad"] == 0.0
