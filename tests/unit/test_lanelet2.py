"""Lanelet2 maps (rad2_datasets.adapters.lanelet2_map) and routes that follow lane changes.

The map is tests/fixtures/lanelet2/two_lane_road.osm, written by hand (its header comment draws it):
a 100 m two-lane one-way road heading east, right lane 1001 -> 1002, left lane 1011 -> 1012, a
dashed centre marking on the first 50 m (lane change allowed) and a solid one on the last 50 m (not
allowed), a traffic light 2001 with a stop line at x = 97 for 1002 and 1012, and a crosswalk.
Variants for the error cases are edited copies written by the tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

lanelet2 = pytest.importorskip(
    "lanelet2", reason="the lanelet2 package is not installed (tools/requirements.txt pins lanelet2==1.2.3)")

from rad2_core.config import load_merged, load_params  # noqa: E402
from rad2_core.lane_map import NO_LANE, LaneMap  # noqa: E402
from rad2_core.route_path import RouteLimits  # noqa: E402
from rad2_core.tokens import project_onto_polyline  # noqa: E402
from rad2_datasets.adapters import build_route  # noqa: E402
from rad2_datasets.adapters.lanelet2_map import (  # noqa: E402
    Lanelet2MapError,
    load_lanelet2,
    load_lanelet2_map,
    mission_route,
)
from rad2_datasets.live_scene import LiveScene, LiveSceneError, load_map_and_route  # noqa: E402

LOG_PARAMS = load_merged("bev", "sim", "validators")

MAP = Path(__file__).parents[1] / "fixtures" / "lanelet2" / "two_lane_road.osm"
KMH = 1 / 3.6


@pytest.fixture(scope="module")
def l2():
    return load_lanelet2(MAP, params=LOG_PARAMS)


def _variant(tmp_path: Path, name: str, edit) -> Path:
    text = MAP.read_text()
    changed = edit(text)
    assert changed != text, "the edit must change the fixture"
    path = tmp_path / name
    path.write_text(changed)
    return path


def _lane(m: LaneMap, lane_id: int) -> int:
    return m.lane_index()[lane_id]


def test_two_lane_road_lanes_successors_neighbours_and_speeds(l2):
    m = l2.lane_map
    m.validate()
    assert l2.projector == "local_xy"  # every node has local_x/local_y
    assert l2.origin == pytest.approx((49.0, 8.4))  # the first node
    assert m.lane_ids.tolist() == [1001, 1002, 1011, 1012]  # the crosswalk lanelet is no lane
    succ = {int(lid): s for lid, s in zip(m.lane_ids, m.successors)}
    assert succ == {1001: [1002], 1002: [], 1011: [1012], 1012: []}
    # centrelines and bounds in the driving direction, metres of the local_x/local_y tags
    np.testing.assert_allclose(m.centerlines[_lane(m, 1001)][[0, -1]], [[0, -1.75], [50, -1.75]], atol=1e-6)
    np.testing.assert_allclose(m.centerlines[_lane(m, 1012)][[0, -1]], [[50, 1.75], [100, 1.75]], atol=1e-6)
    np.testing.assert_allclose(m.left_boundaries[_lane(m, 1011)][:, 1], 3.5)
    np.testing.assert_allclose(m.right_boundaries[_lane(m, 1011)][:, 1], 0.0, atol=1e-9)
    assert m.has_adjacency
    assert m.neighbor(1001, "left") == 1011 and m.neighbor(1011, "right") == 1001
    assert m.neighbor(1002, "left") == 1012 and m.neighbor(1012, "right") == 1002
    assert m.neighbor(1001, "right") is None and m.neighbor(1011, "left") is None
    assert int(m.right_neighbors[_lane(m, 1001)]) == NO_LANE
    # dashed marking (way 111): changes allowed both ways; solid (way 112): neighbours without permission
    assert m.lane_change_left[_lane(m, 1001)] and m.lane_change_right[_lane(m, 1011)]
    assert not m.lane_change_left[_lane(m, 1002)] and not m.lane_change_right[_lane(m, 1012)]
    assert not m.lane_change_right[_lane(m, 1001)] and not m.lane_change_left[_lane(m, 1011)]
    # German urban default 50 km/h; lanelet 1011 is tagged speed_limit=30
    speeds = dict(zip(m.lane_ids.tolist(), m.speed_limits.tolist()))
    assert speeds == pytest.approx({1001: 50 * KMH, 1002: 50 * KMH, 1011: 30 * KMH, 1012: 50 * KMH})
    assert len(m.drivable_areas) == 4
    assert len(m.crosswalks) == 1
    xs = m.crosswalks[0][:, 0]
    assert xs.min() == pytest.approx(102.0) and xs.max() == pytest.approx(106.0)


def test_traffic_light_controls_both_lanes_at_its_stop_line(l2):
    m = l2.lane_map
    assert m.num_signals == 1
    assert m.signal_ids.tolist() == [2001]  # the regulatory element's id
    assert m.signal_lanes == [[1002, 1012]]  # the lanelets that reference it
    np.testing.assert_allclose(m.signal_stop_lines[0], [[97, -3.5], [97, 3.5]], atol=1e-6)  # its ref_line


def test_without_a_ref_line_the_stop_line_crosses_the_lanes_at_the_light(tmp_path):
    path = _variant(tmp_path, "no_ref_line.osm",
                    lambda t: t.replace('<member type="way" ref="131" role="ref_line"/>', ""))
    m = load_lanelet2_map(path, params=LOG_PARAMS)
    assert m.signal_lanes == [[1002, 1012]]
    # the light at x = 110 projects onto both lanes at their end (x = 100); left bound to right bound
    np.testing.assert_allclose(m.signal_stop_lines[0], [[100, 3.5], [100, 0.0], [100, -3.5]], atol=1e-6)


def test_projectors_and_origin(l2, tmp_path):
    ref = l2.lane_map
    local = load_lanelet2(MAP, projector="local", params=LOG_PARAMS)
    assert local.projector == "local"
    for a, b in zip(local.lane_map.centerlines, ref.centerlines):
        np.testing.assert_allclose(a, b, atol=1e-3)  # lat/lon on the tangent plane at node 1 = the tags
    # another origin shifts the frame: node 1 lies 100 m east of (49.0, 8.4 - 100 m of longitude)
    # (WGS84 radius of the parallel at 49 N)
    lat = np.radians(49.0)
    parallel_radius = 6378137.0 / np.sqrt(1 - 0.00669438 * np.sin(lat) ** 2) * np.cos(lat)
    dlon = np.degrees(100.0 / parallel_radius)
    shifted = load_lanelet2_map(MAP, origin=(49.0, 8.4 - dlon), projector="local", params=LOG_PARAMS)
    np.testing.assert_allclose(shifted.centerlines[0][0], [100.0, -1.75], atol=0.05)
    utm = load_lanelet2_map(MAP, projector="utm", params=LOG_PARAMS)
    # UTM with the origin offset: the same road, rotated by the grid convergence and scaled by <0.1 %
    for a, b in zip(utm.centerlines, ref.centerlines):
        assert np.linalg.norm(a[-1] - a[0]) == pytest.approx(np.linalg.norm(b[-1] - b[0]), rel=1e-3)
    width = np.linalg.norm(utm.left_boundaries[0][0] - utm.right_boundaries[0][0])
    assert width == pytest.approx(3.5, abs=0.01)
    # a node without local_x/local_y: "auto" projects lat/lon instead
    no_tags = _variant(tmp_path, "no_local.osm",
                       lambda t: re.sub(r'<tag k="local_[xy]" v="[^"]*"/>', "", t, count=1))
    assert load_lanelet2(no_tags, params=LOG_PARAMS).projector == "local"


def test_a_two_way_lanelet_gives_a_reverse_lane(tmp_path):
    path = _variant(tmp_path, "two_way.osm", lambda t: re.sub(
        r'(<relation id="1012">.*?<tag k="one_way" v=")yes', r"\1no", t, flags=re.S))
    m = load_lanelet2_map(path, params=LOG_PARAMS)
    assert m.lane_ids.tolist() == [1001, 1002, 1011, 1012, -1013]  # reverse of 1012: -id - 1
    np.testing.assert_allclose(m.centerlines[_lane(m, -1013)][[0, -1]], [[100, 1.75], [50, 1.75]], atol=1e-6)
    assert m.successors[_lane(m, 1011)] == [1012]  # the forward direction only
    assert m.signal_lanes == [[1002, 1012]]  # the light governs the direction the lanelet is drawn in
    assert len(m.drivable_areas) == 4  # the two-way lanelet's area once
    m.validate()


@pytest.mark.parametrize("name,edit,expected", [
    ("missing_way.osm", lambda t: t.replace('<member type="way" ref="101" role="right"/>',
                                            '<member type="way" ref="199" role="right"/>'),
     ["missing_way.osm: lanelet 1001:", "nonexistent member 199", "right border"]),
    ("bad_speed.osm", lambda t: t.replace('<tag k="speed_limit" v="30"/>', '<tag k="speed_limit" v="fast"/>'),
     ["bad_speed.osm: lanelet 1011:", "speed_limit 'fast'"]),
    ("short_stop_line.osm", lambda t: t.replace('<nd ref="32"/>', ""),
     ["short_stop_line.osm: regulatory element 2001:", "stop line (ref_line) 131 has 1 usable point"]),
    ("bad_local_x.osm", lambda t: t.replace('<tag k="local_x" v="25"/>', '<tag k="local_x" v="east"/>', 1),
     ["bad_local_x.osm: point 2:", "local_x 'east' is not a number"]),
    ("truncated.osm", lambda t: t[:900], ["truncated.osm:", "not a readable OSM XML file", "line"]),
    ("id_minus_one.osm", lambda t: t.replace('<relation id="1001">', '<relation id="-1">'),
     ["id_minus_one.osm: lanelet -1:", "lane id -1 is reserved"]),
    ("bad_lat.osm", lambda t: t.replace('lat="49.00000000000"', 'lat="north"', 1),
     ["bad_lat.osm: node 1:", "lat 'north' is not a number"]),
])
def test_errors_name_the_file_the_element_and_the_field(tmp_path, name, edit, expected):
    path = _variant(tmp_path, name, edit)
    with pytest.raises(Lanelet2MapError) as err:
        load_lanelet2(path, params=LOG_PARAMS)
    for part in expected:
        assert part in str(err.value)


def test_errors_for_a_missing_file_and_an_unknown_projector(tmp_path):
    with pytest.raises(Lanelet2MapError, match="nope.osm does not exist"):
        load_lanelet2(tmp_path / "nope.osm", params=LOG_PARAMS)
    with pytest.raises(Lanelet2MapError, match="projector 'mercator' is not one of"):
        load_lanelet2(MAP, projector="mercator", params=LOG_PARAMS)
    with pytest.raises(Lanelet2MapError, match="origin: lat 95.0 is outside"):
        load_lanelet2(MAP, origin=(95.0, 8.4), projector="local", params=LOG_PARAMS)


def _lane_change_log(dt=0.1, speed=10.0):
    """A logged ego path at 10 m/s from x = 2 in the right lane, changing to the left lane between
    x = 12 and x = 42 (a cosine over 30 m, inside the dashed stretch), on to x = 92."""
    x = np.arange(2.0, 92.0, speed * dt)
    t = np.clip((x - 12.0) / 30.0, 0.0, 1.0)
    y = -1.75 + 3.5 * (0.5 - 0.5 * np.cos(np.pi * t))
    yaw = np.arctan2(np.gradient(y, x), 1.0)
    return np.stack([x, y], axis=1), yaw


def _route(m: LaneMap, xy, yaw):
    a = load_params("bev")["adapters"]
    return build_route(m, xy, yaw, extension_m=a["route_extension_m"],
                       heading_weight=a["lane_match_heading_weight_m_per_rad"],
                       change_penalty=a["lane_change_penalty_m"],
                       limits=RouteLimits.from_params(load_params("sim")))


def test_the_route_follows_a_lane_change_and_projects_monotonically(l2):
    m = l2.lane_map
    xy, yaw = _lane_change_log()
    ids, poly = _route(m, xy, yaw)
    assert ids.tolist() == [1001, 1011, 1012]  # both lanes of the change, then on along successors
    idx = m.lane_index()
    for a, b in zip(ids[:-1], ids[1:]):  # every step is a successor or a neighbour
        k = idx[int(a)]
        assert int(b) in m.successors[k] or int(b) in (m.left_neighbors[k], m.right_neighbors[k])
    proj = np.array([project_onto_polyline(poly, p) for p in xy])
    s, dist = proj[:, 0], proj[:, 1]
    assert np.all(np.diff(s) > 0.5), "each ego pose projects further along the route than the last"
    assert dist.max() < 1.2, "the route stays with the ego through the lane change"
    # no doubling back and no zigzag: the polyline always heads east and turns gently
    seg = np.diff(poly, axis=0)
    assert np.all(seg[:, 0] > 0)
    heading = np.arctan2(seg[:, 1], seg[:, 0])
    assert np.abs(np.diff(heading)).max() < 0.1 and np.abs(heading).max() < 0.3
    assert poly[0, 1] == pytest.approx(-1.75) and poly[-1, 1] == pytest.approx(1.75)
    assert poly[-1, 0] == pytest.approx(100.0)  # the route ends where the map does


def test_without_adjacency_the_route_still_follows_the_lane_change(l2):
    """The same log on the map stripped of adjacency: the lanes are the same, and the switch the map
    does not explain is joined sideways where the ego crossed (the route once appended the whole next
    lane there, from its start behind the ego, and doubled back)."""
    m = l2.lane_map
    bare = LaneMap.build(m.lane_ids, m.centerlines, m.left_boundaries, m.right_boundaries, m.speed_limits,
                         m.successors, m.drivable_areas, m.crosswalks)
    assert not bare.has_adjacency
    xy, yaw = _lane_change_log()
    ids, poly = _route(bare, xy, yaw)
    assert ids.tolist() == [1001, 1011, 1012]
    s = np.array([project_onto_polyline(poly, p)[0] for p in xy])
    assert np.all(np.diff(s) > 0)


def test_a_route_that_changes_lanes_at_a_lanelet_end_is_bridged(l2):
    """A log crossing the lane boundary right where the lanelets end (x = 50): its match jumps from
    lane 1001 straight to 1012. The route inserts the lane that connects them through the permitted
    change (1011 beside the dashed marking, not 1002 beside the solid one) and still projects
    monotonically."""
    m = l2.lane_map
    x = np.arange(2.0, 95.0, 1.0)
    t = np.clip((x - 40.0) / 20.0, 0.0, 1.0)  # crosses the boundary right at x = 50
    y = -1.75 + 3.5 * (0.5 - 0.5 * np.cos(np.pi * t))
    yaw = np.arctan2(np.gradient(y, x), 1.0)
    ids, poly = _route(m, np.stack([x, y], 1), yaw)
    assert ids.tolist() == [1001, 1011, 1012]
    s = np.array([project_onto_polyline(poly, p)[0] for p in np.stack([x, y], 1)])
    assert np.all(np.diff(s) > 0)


def test_mission_routes_from_lanelet_ids_and_positions(l2):
    ids, poly = mission_route(l2, lanelet_ids=[1001, 1012])
    assert ids.tolist() == [1001, 1011, 1012]  # the routing graph changes lanes on the dashed stretch
    assert np.all(np.diff(poly[:, 0]) > 0)
    assert poly[0] == pytest.approx([0.0, -1.75]) and poly[-1] == pytest.approx([100.0, 1.75])
    ids2, _ = mission_route(l2, start_xy=(5.0, -1.5), goal_xy=(90.0, 1.5))
    assert ids2.tolist() == ids.tolist()
    with pytest.raises(Lanelet2MapError, match="no route from lanelet 1002 to lanelet 1011"):
        mission_route(l2, lanelet_ids=[1002, 1011])
    with pytest.raises(Lanelet2MapError, match="lanelet 1020 is not a lane"):  # the crosswalk
        mission_route(l2, lanelet_ids=[1001, 1020])


def test_the_perception_node_loads_a_lanelet2_map_with_its_mission():
    scene = load_map_and_route(MAP, route="1001 1012", params=LOG_PARAMS)
    assert scene.route_lane_ids.tolist() == [1001, 1011, 1012]
    assert scene.lane_map.num_signals == 1 and "two_lane_road.osm#route 1001 1012" in scene.source
    by_pos = load_map_and_route(MAP, route="5,-1.5  90,1.5", params=LOG_PARAMS)
    assert by_pos.route_lane_ids.tolist() == [1001, 1011, 1012]
    params = {**load_params("bev"), **load_params("vehicle")}
    live = LiveScene(scene, params, step_s=0.1, history_s=1.0, odom_max_age_s=0.3, history_tolerance_s=0.06)
    assert live.scene.lane_map is scene.lane_map
    for route, message in (("", "needs a mission route"), ("1001 x", "neither lanelet ids"),
                           ("1,2", "has 1 position"), ("1,2 3,nan", "not a finite 'x,y' pair"),
                           ("1001 999", "lanelet 999 is not a lane")):
        with pytest.raises(LiveSceneError, match=message):
            load_map_and_route(MAP, route=route, params=LOG_PARAMS)
