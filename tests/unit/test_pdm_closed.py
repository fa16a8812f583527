"""PDM-Closed (bev_warp_sim.pdm_closed) closed loop on hand-built scenes of the two-lane synthetic road
(tests/synthetic_scenes.py: right lane straight 100 m then a 90 deg left curve of R = 60 m, a left lane
beside it, road edges at the outer lane boundaries)."""

import numpy as np
import pytest
from bev_warp_sim import pdm_closed as pc
from bev_warp_sim.reference_policies import POLICIES, make_policy
from bev_warp_sim.rollout import PerRowPlanners, run_rollouts
from bev_warp_sim.simulator import Simulator
from rad2_core.clip import AGENT_VEHICLE, Clip
from rad2_core.config import load_merged, load_params
from rad2_core.geometry import wrap_angle
from rad2_core.route_path import RoutePath
from synthetic_scenes import _along, make_map

PARAMS = load_merged()

EGO_LENGTH = 4.8


@pytest.fixture(scope="module")
def sim():
    return Simulator(PARAMS)


def _scene(num_steps: int, ego_s0: float, ego_speed: float, agents=(), clip_id="pdm_scene") -> Clip:
    """The logged ego in the right lane from arc length ``ego_s0`` at ``ego_speed``; ``agents``:
    (lane 'right'|'left', arc length at t=0, speed, length, width) vehicles."""
    m = make_map()
    dt = 0.1
    t = np.arange(num_steps) * dt
    paths = {"right": np.concatenate([m.centerlines[0], m.centerlines[1][1:]]),
             "left": np.concatenate([m.centerlines[2], m.centerlines[3][1:]])}
    ex, ey, eyaw = _along(paths["right"], ego_s0 + ego_speed * t)
    n = len(agents)
    arr = {k: np.zeros((n, num_steps)) for k in ("x", "y", "yaw", "vx", "vy")}
    for i, (lane, s0, v, _, _) in enumerate(agents):
        x, y, yaw = _along(paths[lane], s0 + v * t)
        arr["x"][i], arr["y"][i], arr["yaw"][i] = x, y, wrap_angle(yaw)
        arr["vx"][i], arr["vy"][i] = v * np.cos(yaw), v * np.sin(yaw)
    return Clip.build(
        clip_id=clip_id, dt=dt, ego_x=ex, ego_y=ey, ego_yaw=wrap_angle(eyaw),
        ego_speed=np.full(num_steps, ego_speed), ego_accel=np.zeros(num_steps), ego_length=EGO_LENGTH,
        ego_width=1.9,
        agent_ids=np.arange(100, 100 + n), agent_types=[AGENT_VEHICLE] * n,
        agent_length=[a[3] for a in agents], agent_width=[a[4] for a in agents],
        agent_x=arr["x"], agent_y=arr["y"], agent_yaw=arr["yaw"], agent_vx=arr["vx"], agent_vy=arr["vy"],
        agent_valid=np.ones((n, num_steps), bool), map=m, route_lane_ids=[1, 2],
        route_polyline=paths["right"],
        metadata={"source": "synthetic", "scenario_kind": "pdm_test"})


def _drive(sim, clip, policy="pdm_closed"):
    [ro], stats = run_rollouts(sim, PerRowPlanners(lambda: make_policy(policy, PARAMS)), [clip], h_reuse=1)
    return ro, stats


def test_registered_and_configured_from_params():
    assert "pdm_closed" in POLICIES
    cfg = pc.PdmClosedConfig.from_params(load_params("pdm_closed"))
    assert cfg.speed_limit_fractions == (0.2, 0.4, 0.6, 0.8, 1.0)
    assert set(cfg.lateral_offsets_m) == {-1.0, 0.0, 1.0} and cfg.horizon_s == 4.0 and cfg.dt == 0.1
    bad = load_params("pdm_closed")
    bad["pdm_closed"]["lateral_offsets_m"] = [-1.0, 1.0]
    with pytest.raises(ValueError, match="must contain 0"):
        pc.PdmClosedConfig.from_params(bad)


def test_follows_the_centreline_round_the_curve(sim):
    clip = _scene(150, ego_s0=60.0, ego_speed=10.0)  # enters the R = 60 m curve after 4 s
    ro, _ = _drive(sim, clip)
    tr = ro.trace
    assert tr.termination == "clip_end" and not tr.collided and not tr.offroad
    _, lat, _ = RoutePath(clip.route_polyline).project(tr.ego[:, :2])
    assert np.abs(lat).max() < 0.5
    heading_turned = np.unwrap(tr.ego[:, 2])[-1] - tr.ego[0, 2]
    assert heading_turned > 0.5  # well into the curve
    assert ro.result.rho > 0.9  # keeps up with the log (10 m/s under the 13.9 / 11.1 m/s limits)


def test_stops_behind_a_stopped_car(sim):
    car_s, car_len = 60.0, 4.6
    clip = _scene(120, ego_s0=20.0, ego_speed=10.0, agents=[("right", car_s, 0.0, car_len, 1.9)])
    ro, _ = _drive(sim, clip)
    tr = ro.trace
    assert not tr.collided and not tr.offroad
    gap = (car_s - 0.5 * car_len) - (tr.ego[:, 0] + 0.5 * EGO_LENGTH)
    assert gap.min() > 0.0
    assert tr.ego[-1, 3] < 0.3 and gap[-1] < 6.0  # stopped, a car length or so behind
    assert np.abs(tr.ego[:, 1]).max() < 0.5  # stays in its lane (the left lane is free, yet no swerve)


def test_keeps_its_lane_beside_a_car_in_the_next_lane(sim):
    # a car in the left lane slightly ahead at the same speed, for the whole straight
    clip = _scene(70, ego_s0=20.0, ego_speed=10.0, agents=[("left", 23.0, 10.0, 4.6, 1.9)])
    ro, _ = _drive(sim, clip)
    tr = ro.trace
    assert not tr.collided and not tr.offroad
    assert np.abs(tr.ego[:, 1]).max() < 0.3
    assert ro.result.rho > 0.9


def test_proposals_leaving_the_road_score_zero(sim):
    clip = _scene(60, ego_s0=20.0, ego_speed=10.0)
    obs = sim.observation_at(clip, 0, [clip.ego_x[0], clip.ego_y[0], clip.ego_yaw[0], 10.0, 0.0], 0.0)
    params = {**PARAMS, "pdm_closed": {**PARAMS["pdm_closed"], "lateral_offsets_m": [0.0, -2.5, 2.5]}}
    planner = pc.make_pdm_closed(params)
    res = planner.plan(obs)
    offsets = np.asarray(planner.cfg.lateral_offsets_m)[planner.path_of]
    # 2.5 m to the right the right corners end up beyond the road edge (1.75 m right of the
    # centreline): drivable-area multiplier 0 (2.5 m to the left, inside the left lane, is off the
    # route's lane for more than direction_bad_m: 0 as well, as PDM scores a lane off the route)
    assert np.all(res.scores[offsets == -2.5] == 0.0)
    assert np.all(res.scores[offsets == 0.0] > 0.0)
    assert offsets[res.selected] == 0.0 and res.scores[res.selected] == res.scores.max()
    assert res.candidates.shape == (len(offsets), planner.points, 2) and res.plan_dt == planner.plan_dt
    # deterministic: the same observation gives the same plan
    again = pc.make_pdm_closed(params).plan(obs)
    np.testing.assert_array_equal(res.candidates, again.candidates)
    np.testing.assert_array_equal(res.scores, again.scores)


def test_emergency_stop_when_a_collision_is_imminent_at_low_speed(sim):
    # a stopped car 1 m ahead of the ego's front at 4 m/s: IDM's 3 m/s^2 needs 2.7 m, so every proposal
    # runs into it within 2 s
    clip = _scene(30, ego_s0=20.0, ego_speed=4.0,
                  agents=[("right", 20.0 + 0.5 * EGO_LENGTH + 1.0 + 2.3, 0.0, 4.6, 1.9)])
    obs = sim.observation_at(clip, 0, [clip.ego_x[0], clip.ego_y[0], clip.ego_yaw[0], 4.0, 0.0], 0.0)
    res = make_policy("pdm_closed", PARAMS).plan(obs)
    assert res.info["emergency_brake"] and res.executed is not None
    travelled = np.hypot(*res.trajectory[-1])
    assert travelled == pytest.approx(4.0**2 / (2 * 4.05), abs=0.05)  # the stop at brake_decel
