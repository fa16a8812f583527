"""Oriented-box collisions, time to collision (RAD-2 Eq. 12) and at-fault attribution, hand-computed."""

import numpy as np
import pytest
from bev_warp_sim import safety
from rad2_core.config import load_params

PARAMS = load_params("sim")


def box(x, y, yaw=0.0, length=4.0, width=2.0):
    return np.array([x, y, yaw, length, width], dtype=np.float64)


def test_axis_aligned_overlap_and_gap():
    a = box(0, 0)
    assert safety.boxes_overlap(a, box(3.9, 0))
    assert not safety.boxes_overlap(a, box(4.1, 0))
    assert safety.boxes_overlap(a, box(0, 1.95))
    assert not safety.boxes_overlap(a, box(0, 2.05))


def test_rotated_corner_into_face():
    a = box(0, 0, 0, 2, 2)
    # a 2x2 square turned 45 deg reaches sqrt(2) from its centre along x
    assert safety.boxes_overlap(a, box(2.3, 0, np.pi / 4, 2, 2))  # tip at 0.886 < 1
    assert not safety.boxes_overlap(a, box(2.5, 0, np.pi / 4, 2, 2))  # tip at 1.086 > 1


def test_sat_rejects_what_axis_aligned_bounds_accept():
    # two diamonds whose bounding boxes overlap but which are separated along the (1,1) axis
    a = box(0, 0, np.pi / 4, 2, 2)
    b = box(1.5, 1.5, np.pi / 4, 2, 2)
    assert not safety.boxes_overlap(a, b)
    assert safety.boxes_overlap(a, box(1.3, 1.3, np.pi / 4, 2, 2))  # 2.6/sqrt2 = 1.84 < 2


def test_batched_collisions_shape_and_mask():
    agents = np.stack([box(3.0, 0), box(10, 0), box(0, 1.5, np.pi / 2)])
    hit = safety.collisions(box(0, 0), agents)
    assert hit.tolist() == [True, False, True]
    hit = safety.collisions(box(0, 0), agents, agent_valid=[True, True, False])
    assert hit.tolist() == [True, False, False]
    egos = np.stack([box(0, 0), box(10, 0)])  # [B=2, 5]
    batched = safety.collisions(egos, np.broadcast_to(agents, (2, 3, 5)))
    assert batched.shape == (2, 3)
    assert batched[1].tolist() == [False, True, False]


def test_bad_box_shape_names_the_field():
    with pytest.raises(ValueError, match="agent_boxes"):
        safety.collisions(box(0, 0), np.zeros((3, 4)))


def test_ctrv_projection_quarter_circle():
    speed, yaw_rate = 10.0, 0.5  # radius 20 m
    t_quarter = np.pi / 2 / yaw_rate
    poses = safety.project_ego_ctrv(np.array([0.0, 0.0, 0.0]), speed, yaw_rate, 10, t_quarter / 10)
    np.testing.assert_allclose(poses[-1], [20.0, 20.0, np.pi / 2], atol=1e-9)
    straight = safety.project_ego_ctrv(np.array([1.0, 2.0, np.pi / 2]), 5.0, 0.0, 4, 0.5)
    np.testing.assert_allclose(straight[:, 1], 2.0 + 5.0 * 0.5 * np.arange(5), atol=1e-12)
    np.testing.assert_allclose(straight[:, 0], 1.0, atol=1e-12)


def _static_future(agent_box, k1):
    return np.repeat(agent_box[None, None, :], k1, axis=1), np.ones((1, k1), bool)


def _ttc(ego_speed, agent_future, agent_valid, params=PARAMS, ego_pose=(0.0, 0.0, 0.0)):
    return float(
        safety.ttc_at_state(np.array(ego_pose), ego_speed, 0.0, np.array([4.0, 2.0]), agent_future,
                            agent_valid, params)
    )


def test_ttc_static_obstacle_ahead():
    k1 = 31  # t_max 3.0 s at dt 0.1
    fut, val = _static_future(box(21.5, 0), k1)
    # gap between ego front (2) and obstacle rear (19.5) is 17.5 m at 10 m/s -> contact at 1.75 s,
    # first sampled overlap at 1.8 s
    assert _ttc(10.0, fut, val) == pytest.approx(1.8)
    fut, val = _static_future(box(60.0, 0), k1)
    assert _ttc(10.0, fut, val) == pytest.approx(3.0)  # T_max when nothing is hit


def test_ttc_head_on_uses_the_agents_future():
    k1 = 31
    t = np.arange(k1) * 0.1
    fut = np.zeros((1, k1, 5))
    fut[0, :, 0] = 19.5 - 10.0 * t  # oncoming at 10 m/s, gap 15.5 m, closing 20 m/s -> 0.775 s
    fut[0, :, 2] = np.pi
    fut[0, :, 3:] = (4.0, 2.0)
    assert _ttc(10.0, fut, np.ones((1, k1), bool)) == pytest.approx(0.8)
    # invalid (not yet logged) agents are ignored
    assert _ttc(10.0, fut, np.zeros((1, k1), bool)) == pytest.approx(3.0)


def test_ttc_zero_on_overlap_and_rear_exclusion():
    k1 = 31
    fut, val = _static_future(box(3.0, 0), k1)
    assert _ttc(0.0, fut, val) == 0.0  # current overlap counts even for a stopped ego
    t = np.arange(k1) * 0.1
    rear = np.zeros((1, k1, 5))
    rear[0, :, 0] = -10.0 + 20.0 * t  # closing from behind at 10 m/s relative, gap 6 m -> 0.6 s
    rear[0, :, 3:] = (4.0, 2.0)
    assert _ttc(10.0, rear, val) == pytest.approx(3.0)  # behind the rear bumper: excluded
    params = {**PARAMS, "ttc": {**PARAMS["ttc"], "exclude_rear_agents": False}}
    assert _ttc(10.0, rear, val, params) == pytest.approx(0.6)


def test_follower_ttc_sees_only_the_vehicles_behind():
    """``with_rear``: T^rear_t counts the agents T_t leaves out as behind, a stopped ego included."""
    k1 = 31
    t = np.arange(k1) * 0.1
    agents = np.zeros((2, k1, 5))
    agents[0, :, 0] = -10.0 + 20.0 * t  # follower closing at 10 m/s relative, gap 6 m -> 0.6 s
    agents[1, :, 0] = 21.5  # static obstacle ahead: 17.5 m at 10 m/s -> first overlap at 1.8 s
    agents[:, :, 3:] = (4.0, 2.0)
    val = np.ones((2, k1), bool)
    size = np.array([4.0, 2.0])
    front, rear = safety.ttc_at_state(np.zeros(3), 10.0, 0.0, size, agents, val, PARAMS, with_rear=True)
    assert float(front) == pytest.approx(1.8) and float(rear) == pytest.approx(0.6)
    assert float(front) == _ttc(10.0, agents, val)  # T_t itself is unchanged by asking for both
    # a stopped ego: T_t ignores everyone at k >= 1, the follower still reaches it (gap 6 m at 20 m/s)
    front, rear = safety.ttc_at_state(np.zeros(3), 0.0, 0.0, size, agents, val, PARAMS, with_rear=True)
    assert float(front) == pytest.approx(3.0) and float(rear) == pytest.approx(0.3)
    # nothing behind: T_max
    _, rear = safety.ttc_at_state(np.zeros(3), 10.0, 0.0, size, agents[1:], val[1:], PARAMS, with_rear=True)
    assert float(rear) == pytest.approx(3.0)


def test_ttc_stopped_ego_is_not_projected_into_crossing_traffic():
    k1 = 31
    t = np.arange(k1) * 0.1
    cross = np.zeros((1, k1, 5))
    cross[0, :, 0] = 0.0
    cross[0, :, 1] = 8.0 - 10.0 * t  # agent driving through the ego's position
    cross[0, :, 2] = -np.pi / 2
    cross[0, :, 3:] = (4.0, 2.0)
    assert _ttc(0.1, cross, np.ones((1, k1), bool)) == pytest.approx(3.0)
    params = {**PARAMS, "ttc": {**PARAMS["ttc"], "exclude_stopped_ego": False}}
    # front of the agent (y = 8 - 2 - 10 t) reaches the ego's left side (y = 1) at 0.5 s
    assert _ttc(0.1, cross, np.ones((1, k1), bool), params) == pytest.approx(0.5, abs=0.11)


def test_ttc_batched_matches_single():
    rng = np.random.default_rng(0)
    k1 = 31
    poses = np.column_stack([rng.uniform(-5, 5, 6), rng.uniform(-5, 5, 6), rng.uniform(-3, 3, 6)])
    speeds = rng.uniform(0, 15, 6)
    fut = np.zeros((6, 4, k1, 5))
    fut[..., 0] = rng.uniform(-30, 30, (6, 4, 1)) + rng.uniform(-8, 8, (6, 4, 1)) * np.arange(k1) * 0.1
    fut[..., 1] = rng.uniform(-10, 10, (6, 4, 1))
    fut[..., 2] = rng.uniform(-3, 3, (6, 4, 1))
    fut[..., 3:] = (4.5, 1.9)
    val = np.ones((6, 4, k1), bool)
    batched = safety.ttc_at_state(poses, speeds, np.zeros(6), np.array([4.0, 2.0]), fut, val, PARAMS)
    single = [safety.ttc_at_state(poses[i], speeds[i], 0.0, np.array([4.0, 2.0]), fut[i], val[i], PARAMS)
              for i in range(6)]
    np.testing.assert_allclose(batched, np.array(single, dtype=float))


def _classify(ego, ev, agent, av):
    return safety.classify_collision(ego, ev, agent, av, PARAMS)


def test_at_fault_rear_ending_a_leader():
    info = _classify(box(0, 0), (10, 0), box(3.8, 0), (0, 0))
    assert (info.ego_zone, info.agent_zone, info.at_fault) == ("front", "rear", True)


def test_not_at_fault_when_rear_ended_or_stopped():
    info = _classify(box(0, 0), (5, 0), box(-3.8, 0), (12, 0))
    assert info.ego_zone == "rear" and not info.at_fault
    info = _classify(box(0, 0), (0.1, 0), box(3.8, 0), (0, 0))
    assert info.ego_stopped and not info.at_fault


def test_agent_front_into_ego_side_is_not_ego_fault():
    # crossing agent drives its front into the ego's flank
    info = _classify(box(0, 0), (8, 0), box(0.0, 2.8, -np.pi / 2), (0, -8))
    assert (info.ego_zone, info.agent_zone, info.at_fault) == ("side", "front", False)


def test_ego_into_crossing_agent_side_is_ego_fault():
    info = _classify(box(0, 0), (8, 0), box(2.8, 0.0, np.pi / 2), (0, 8))
    assert info.ego_zone == "front" and info.agent_zone == "side" and info.at_fault


def test_head_on_is_ego_fault():
    info = _classify(box(0, 0), (8, 0), box(3.9, 0.3, np.pi), (-8, 0))
    assert info.at_fault


def test_sideswipe_attributed_to_the_vehicle_moving_across_the_road():
    drift = (10 * np.cos(0.2), 10 * np.sin(0.2))
    ego_drifts = safety.classify_collision(box(0, 0, 0.2), drift, box(-0.5, 2.0), (10, 0), PARAMS,
                                           road_heading=0.0)
    assert ego_drifts.at_fault
    agent_drifts = safety.classify_collision(box(0, 0), (10, 0), box(-0.5, 2.0, -0.2),
                                             (drift[0], -drift[1]), PARAMS, road_heading=0.0)
    assert not agent_drifts.at_fault


def test_running_a_red_light_takes_the_right_of_way_away():
    """A crossing car's front entering the ego's side is the car's fault on a green; if the ego entered
    the junction against red, the ego is at fault. Stopped or rear-ended egos stay not at fault."""
    ego, crossing = box(0, 0), box(0.0, 2.6, -np.pi / 2)  # heading south: its front touches the ego's side
    green = safety.classify_collision(ego, (8, 0), crossing, (0, -8), PARAMS)
    red = safety.classify_collision(ego, (8, 0), crossing, (0, -8), PARAMS, ego_ran_red=True)
    assert (green.ego_zone, green.at_fault) == ("side", False)
    assert red.at_fault and red.as_dict()["ego_ran_red"]
    stopped = safety.classify_collision(ego, (0, 0), crossing, (0, -8), PARAMS, ego_ran_red=True)
    assert not stopped.at_fault
