"""Map tokens on a hand-built map: which lanes, in which order, which window of each, resampled how."""

import numpy as np
import pytest
from rad2_core.lane_map import LaneMap
from rad2_core.tokens import TokenConfig, map_tokens

CFG = TokenConfig(n_map=4, points=5, map_range=30.0, max_length=40.0, n_agents=4, agent_range=50.0,
                  n_route=4, route_spacing=2.0)


def _lane_map(centerlines, speeds):
    offset = [np.array([0.0, 1.75])] * len(centerlines)
    return LaneMap.build(
        lane_ids=np.arange(10, 10 + len(centerlines)),
        centerlines=centerlines,
        left_boundaries=[c + o for c, o in zip(centerlines, offset)],
        right_boundaries=[c - o for c, o in zip(centerlines, offset)],
        speed_limits=np.asarray(speeds, float),
        successors=[[] for _ in centerlines],
        map_id=f"test_tokens_{len(centerlines)}_{np.random.default_rng().integers(1 << 30)}",
    )


@pytest.fixture(scope="module")
def lane_map():
    x = np.linspace(-100.0, 100.0, 41)  # 5 m vertices
    return _lane_map(
        [
            np.column_stack([x, np.full_like(x, 3.5)]),  # 0: long lane 3.5 m left of the ego
            np.array([[0.0, -10.0], [10.0, -10.0], [10.0, 0.0]]),  # 1: short L, 20 m, 10 m right
            np.column_stack([x, np.full_like(x, 80.0)]),  # 2: out of range
            np.column_stack([x, np.zeros_like(x)]),  # 3: the ego's own lane
        ],
        [13.9, 8.3, 20.0, 11.1],
    )


def test_nearest_lanes_in_range_first(lane_map):
    out, mask = map_tokens(lane_map, [0.0, 0.0, 0.0], route_lane_ids=[13], params=CFG)
    assert mask.tolist() == [True, True, True, False]  # lane 2 is 80 m away
    np.testing.assert_allclose(out[:3, 0, 4], [11.1, 13.9, 8.3], rtol=1e-6)  # nearest first
    np.testing.assert_array_equal(out[:3, :, 5], [[1.0] * 5, [0.0] * 5, [0.0] * 5])  # on route
    assert np.all(out[3] == 0)


def test_long_lane_window_and_short_lane_whole(lane_map):
    # ego at x = 50 heading +x: the 40 m window starts 10 m behind the closest point (x = 50)
    out, _ = map_tokens(lane_map, [50.0, 0.0, 0.0], params=CFG)
    own = out[0]
    np.testing.assert_allclose(own[:, 0], [-10.0, 0.0, 10.0, 20.0, 30.0], atol=1e-5)
    np.testing.assert_allclose(own[:, 1], 0.0, atol=1e-5)
    np.testing.assert_allclose(own[:, 2:4], [[1.0, 0.0]] * 5, atol=1e-6)
    # near the lane's end the window is clamped to its last 40 m
    out, _ = map_tokens(lane_map, [99.0, 0.0, 0.0], params=CFG)
    np.testing.assert_allclose(out[0, [0, -1], 0], [-39.0, 1.0], atol=1e-5)
    # the 20 m L-shaped lane is resampled whole: 5 m steps, heading +x then +y after the corner
    out, _ = map_tokens(lane_map, [5.0, -6.0, 0.0], params=CFG)
    short = out[0]
    np.testing.assert_allclose(short[:, :2], [[-5, -4], [0, -4], [5, -4], [5, 1], [5, 6]], atol=1e-5)
    np.testing.assert_allclose(short[:2, 2:4], [[1, 0], [1, 0]], atol=1e-6)
    np.testing.assert_allclose(short[3:, 2:4], [[0, 1], [0, 1]], atol=1e-6)


def test_ego_frame_rotation(lane_map):
    # ego at the origin heading +y: the lane at y = 3.5 (heading +x) is 3.5 m ahead, pointing right
    out, _ = map_tokens(lane_map, [0.0, 0.0, np.pi / 2], params=CFG)
    left = out[1]  # lane 0, the second nearest
    np.testing.assert_allclose(left[:, 0], 3.5, atol=1e-5)
    np.testing.assert_allclose(left[:, 2:4], [[0.0, -1.0]] * 5, atol=1e-6)
    np.testing.assert_allclose(left[:, 1], [10.0, 0.0, -10.0, -20.0, -30.0], atol=1e-5)


def test_no_lane_in_range():
    far = _lane_map([np.array([[500.0, 0.0], [600.0, 0.0]])], [10.0])
    out, mask = map_tokens(far, [0.0, 0.0, 0.0], params=CFG)
    assert not mask.any() and np.all(out == 0)
