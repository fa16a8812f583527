"""Routes that follow the logged driver (rad2_datasets.adapters.build_route) and the one route-validity
check that conversion and the simulator share (rad2_core.route_path.check_route).

Maps are built by hand: straight lanes along x (width 3.5 m), a ramp joining from the south, lanes of
one lanelet each as NGSIM's US-101 maps have them (a lane change then switches between two lanelets that
both start far behind the ego).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from rad2_core.config import load_merged, load_params
from rad2_core.lane_map import NO_LANE, LaneMap
from rad2_core.route_path import ROUTE_REFUSALS, RouteError, RouteLimits, check_route
from rad2_datasets.adapters import build_route

PARAMS = load_merged()

W = 3.5
LIMITS = RouteLimits.from_params(load_params("sim"))


def _lane(points, n: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centreline, left boundary, right boundary) of a lane through ``points`` (resampled to ``n``
    points along each segment when n > 0)."""
    pts = np.asarray(points, np.float64)
    if n:
        pts = np.concatenate([np.linspace(a, b, n, endpoint=False) for a, b in zip(pts[:-1], pts[1:])]
                             + [pts[-1:]])
    d = np.gradient(pts, axis=0)
    normal = np.stack([-d[:, 1], d[:, 0]], 1) / np.linalg.norm(d, axis=1, keepdims=True)
    return pts, pts + 0.5 * W * normal, pts - 0.5 * W * normal


def _map(lanes: dict[int, list], successors: dict[int, list[int]] | None = None,
         neighbours: dict[int, tuple[int, int]] | None = None) -> LaneMap:
    """A LaneMap of ``{lane id: centreline points}``; ``neighbours``: {lane: (left, right)} (None: a map
    without adjacency), every change allowed."""
    ids = sorted(lanes)
    geo = [_lane(lanes[k], 20) for k in ids]
    adj = {}
    if neighbours is not None:
        left = [neighbours.get(k, (NO_LANE, NO_LANE))[0] for k in ids]
        right = [neighbours.get(k, (NO_LANE, NO_LANE))[1] for k in ids]
        adj = dict(left_neighbors=left, right_neighbors=right, lane_change_left=[v != NO_LANE for v in left],
                   lane_change_right=[v != NO_LANE for v in right])
    return LaneMap.build(ids, [g[0] for g in geo], [g[1] for g in geo], [g[2] for g in geo],
                         [15.0] * len(ids), [list((successors or {}).get(k, [])) for k in ids],
                         [np.concatenate([g[2], g[1][::-1]]) for g in geo], [], **adj)


def _log(x, y):
    """A logged path through (x, y) with headings from its own direction."""
    xy = np.stack([np.asarray(x, float), np.asarray(y, float)], 1)
    d = np.gradient(xy, axis=0)
    return xy, np.arctan2(d[:, 1], d[:, 0])


def _route(lane_map, xy, yaw, extension_m=None):
    a = load_params("bev")["adapters"]
    ext = a["route_extension_m"] if extension_m is None else extension_m
    return build_route(lane_map, xy, yaw, extension_m=ext,
                       heading_weight=a["lane_match_heading_weight_m_per_rad"],
                       change_penalty=a["lane_change_penalty_m"], limits=LIMITS)


def _lane_change(x0=150.0, length=60.0, speed=25.0, x_end=350.0, dt=0.1):
    """A freeway lane change from y = 0 to y = 3.5 between x0 and x0 + length (cosine), at 25 m/s."""
    x = np.arange(20.0, x_end, speed * dt)
    t = np.clip((x - x0) / length, 0.0, 1.0)
    return _log(x, W * (0.5 - 0.5 * np.cos(np.pi * t)))


def _follows(poly, xy) -> np.ndarray:
    """The logged path's progress along the route, after asserting the shared check accepts it: it only
    moves forward, and the driver is never more than about a quarter lane beside the route (the blend
    at a change is shorter than a driver's manoeuvre)."""
    route = check_route(poly, xy, LIMITS)
    s, lat, _ = route.project(xy)
    assert np.all(np.diff(s) > 0) and np.abs(lat).max() < 0.35 * W
    return s


# ----------------------------------------------------------------------------------------------------
# the shared check
# ----------------------------------------------------------------------------------------------------
def test_check_route_refuses_with_a_reason_and_the_place():
    xy, _ = _log(np.linspace(0.0, 100.0, 51), np.zeros(51))
    straight = np.array([[0.0, 0.0], [200.0, 0.0]])
    assert check_route(straight, xy, LIMITS).length == pytest.approx(200.0)
    cases = {
        "doubles_back": (np.array([[0.0, 0.0], [120.0, 0.0], [60.0, 0.5], [300.0, 0.5]]),
                         "doubles back at point 1"),
        "off_route": (np.array([[0.0, 0.0], [50.0, 0.0], [60.0, 8.0], [200.0, 8.0]]), "from the route"),
        "runs_backward": (np.array([[100.0, 0.0], [0.0, 0.0]]), "falls back"),
        "malformed": (np.array([[1.0, 1.0], [1.0, 1.0]]), "coincide"),
    }
    assert set(cases) == set(ROUTE_REFUSALS)
    for reason, (poly, where) in cases.items():
        with pytest.raises(RouteError, match=where) as err:
            check_route(poly, xy, LIMITS)
        assert err.value.reason == reason
    # without the logged path only the route's own shape is checked
    assert check_route(cases["off_route"][0], None, LIMITS) is not None


def test_the_simulator_refuses_with_the_same_check():
    from bev_warp_sim.simulator import Simulator
    from bev_warp_sim.state import SimulationError
    from synthetic_scenes import make_clip

    clip = make_clip(num_steps=30, clip_id="beside")
    off = clip.route_polyline + np.array([0.0, 6.0])  # the route 6 m beside everything the ego drove
    with pytest.raises(RouteError) as direct:
        check_route(off, np.stack([clip.ego_x, clip.ego_y], -1), LIMITS)
    with pytest.raises(SimulationError, match=r"'beside'.*from the route > metrics.route_max_offset_m"):
        Simulator(PARAMS).init(replace(clip, route_polyline=off))
    assert direct.value.reason == "off_route"


# ----------------------------------------------------------------------------------------------------
# routes that follow the driver
# ----------------------------------------------------------------------------------------------------
def test_a_lane_change_between_one_lanelet_lanes_does_not_double_back():
    """NGSIM's US-101: each lane one long lanelet, no successor between them. Appending the lane the
    ego changed into (from its start, 150 m behind) doubled back; the route now joins it sideways where
    the ego crossed, with or without the map stating the lanes' adjacency."""
    lanes = {1: [[0.0, 0.0], [500.0, 0.0]], 2: [[0.0, W], [500.0, W]]}
    xy, yaw = _lane_change()
    stitched = np.concatenate([np.array(lanes[1]), np.array(lanes[2])])
    with pytest.raises(RouteError) as err:
        check_route(stitched, xy, LIMITS)
    assert err.value.reason == "doubles_back"
    for lane_map in (_map(lanes), _map(lanes, neighbours={1: (2, NO_LANE), 2: (NO_LANE, 1)})):
        ids, poly = _route(lane_map, xy, yaw)
        assert ids.tolist() == [1, 2]
        _follows(poly, xy)
        assert poly[-1, 0] == pytest.approx(500.0) and poly[-1, 1] == pytest.approx(W)  # on to the map's end


def test_a_merge_from_a_ramp_follows_the_ramp_then_the_freeway():
    """An on-ramp from the south (lanelet 10) leads into an acceleration lane (11) beside the freeway's
    right lane (2); the ego merges into lane 2 from the acceleration lane. The map states the ramp's
    successor and the acceleration lane's neighbour, as CommonRoad's NGSIM maps do."""
    lanes = {1: [[0.0, 0.0], [150.0, 0.0]], 2: [[150.0, 0.0], [450.0, 0.0]],
             10: [[0.0, -40.0], [75.0, -12.0], [150.0, -W]], 11: [[150.0, -W], [260.0, -W]]}
    lane_map = _map(lanes, successors={1: [2], 10: [11]}, neighbours={11: (2, NO_LANE), 2: (NO_LANE, 11)})
    ramp = np.asarray(lanes[10])
    x_ramp = np.arange(5.0, 150.0, 2.0)
    y_ramp = np.interp(x_ramp, ramp[:, 0], ramp[:, 1])
    x_main = np.arange(150.0, 380.0, 2.0)
    t = np.clip((x_main - 180.0) / 50.0, 0.0, 1.0)
    y_main = -W + W * (0.5 - 0.5 * np.cos(np.pi * t))
    xy, yaw = _log(np.concatenate([x_ramp, x_main]), np.concatenate([y_ramp, y_main]))
    ids, poly = _route(lane_map, xy, yaw)
    assert ids.tolist() == [10, 11, 2]
    _follows(poly, xy)
    # the route runs past the clip's end until route_extension_m is covered or, as here, the map ends
    assert poly[-1, 0] == pytest.approx(450.0) and poly[-1, 1] == pytest.approx(0.0, abs=1e-6)


def test_the_route_extends_past_the_last_pose_as_far_as_asked_or_the_map_allows():
    lanes = {k: [[200.0 * (k - 1), 0.0], [200.0 * k, 0.0]] for k in (1, 2, 3, 4)}
    lane_map = _map(lanes, successors={1: [2], 2: [3], 3: [4]})
    xy, yaw = _log(np.arange(10.0, 150.0, 2.0), np.zeros(70))
    ids, poly = _route(lane_map, xy, yaw, extension_m=300.0)
    assert ids.tolist() == [1, 2, 3] and poly[-1, 0] == pytest.approx(600.0)
    ids, poly = _route(lane_map, xy, yaw, extension_m=5000.0)
    assert ids.tolist() == [1, 2, 3, 4] and poly[-1, 0] == pytest.approx(800.0)


def test_where_no_lane_route_follows_the_driver_the_logged_path_is_the_route():
    """A driver who swerves 6 m around something onto the shoulder (beyond any lane): the lane's route
    leaves the driver; the route is then its logged path, continued along the lane past the last pose."""
    lane_map = _map({1: [[0.0, 0.0], [400.0, 0.0]]})
    x = np.arange(0.0, 200.0, 1.5)
    y = 6.0 * np.exp(-(((x - 100.0) / 15.0) ** 2))
    xy, yaw = _log(x, y)
    with pytest.raises(RouteError):
        check_route(np.array([[0.0, 0.0], [400.0, 0.0]]), xy, LIMITS)
    ids, poly = _route(lane_map, xy, yaw)
    assert ids.tolist() == [1]
    _follows(poly, xy)
    assert poly[-1, 0] > xy[-1, 0] + 50.0 and abs(poly[-1, 1]) < 1e-6  # back on the lane ahead


def test_a_route_that_goes_straight_on_past_the_lanes_ends_where_the_road_does():
    """The same swerve with the map ending 4 m after the last pose (a roundabout exit cut off by the
    recording's map): the route is the logged path, and with no lane to join ahead it goes straight on,
    but only as far as the road goes, never into unmapped space where the simulator would count an ego
    ahead of the driver off the road before it reached the route's end."""
    import shapely

    lane_map = _map({1: [[0.0, 0.0], [202.5, 0.0]]})
    x = np.arange(0.0, 200.0, 1.5)
    y = 6.0 * np.exp(-(((x - 100.0) / 15.0) ** 2))
    xy, yaw = _log(x, y)
    ids, poly = _route(lane_map, xy, yaw)
    _follows(poly, xy)
    assert xy[-1, 0] <= poly[-1, 0] <= 202.5 + 1e-6, poly[-3:]
    tail = poly[poly[:, 0] > xy[-1, 0]]  # past the last pose: on the road, all of it
    assert len(tail) and shapely.contains_xy(lane_map.drivable_geometry(0.01), tail[:, 0], tail[:, 1]).all()


def test_a_log_no_route_can_follow_is_refused_with_the_reason():
    """A vehicle that drives 30 m forward then reverses 20 m: progress along any route runs backward."""
    lane_map = _map({1: [[0.0, 0.0], [400.0, 0.0]]})
    x = np.concatenate([np.arange(0.0, 30.0, 1.0), np.arange(30.0, 10.0, -1.0)])
    xy = np.stack([x, np.zeros_like(x)], 1)
    yaw = np.zeros_like(x)  # reversing: the car faces forward
    with pytest.raises(RouteError, match="no route follows the logged ego") as err:
        _route(lane_map, xy, yaw)
    assert err.value.reason in ROUTE_REFUSALS


def test_commonroad_maps_carry_lane_adjacency():
    """CommonRoad lanelets state same-direction neighbours and the marking between them; the adapter
    hands both to the route builder (a dashed line allows the change, a solid one does not)."""
    from pathlib import Path

    from rad2_datasets.adapters.commonroad import lanelet_map, read_commonroad_file

    path = Path(__file__).parents[1] / "fixtures" / "commonroad" / "USA_US101-5_1_T-1.xml"
    scenario, _ = read_commonroad_file(path)
    lane_map = lanelet_map(scenario, load_params("bev"))
    assert lane_map.has_adjacency
    idx = lane_map.lane_index()
    pairs = 0
    for ll in scenario.lanelet_network.lanelets:
        k = idx[int(ll.lanelet_id)]
        if ll.adj_left is not None and ll.adj_left_same_direction:
            assert lane_map.left_neighbors[k] == ll.adj_left
            assert lane_map.lane_change_left[k] == (ll.line_marking_left_vertices.name != "SOLID"
                                                   and ll.line_marking_left_vertices.name != "BROAD_SOLID")
            pairs += 1
        else:
            assert lane_map.left_neighbors[k] == NO_LANE
    assert pairs > 0
