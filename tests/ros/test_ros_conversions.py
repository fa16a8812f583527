"""rad2_ros.conversions: round trips of every converter and rejection of malformed messages
with errors that name the message, the field and the offending sizes/values."""

from __future__ import annotations

import array
import math

import numpy as np
import pytest
from ros_process import import_ros_messages, ros_build_missing_reason

_missing = ros_build_missing_reason()
if _missing is not None:
    pytest.skip(_missing, allow_module_level=True)
import_ros_messages()

from geometry_msgs.msg import Point  # noqa: E402
from rad2_core.config import load_params  # noqa: E402
from rad2_msgs.msg import AgentState, MapPolyline, PlanningDiagnostics, SceneTokens, StageLatency  # noqa: E402
from rad2_ros import conversions as rc  # noqa: E402
from rad2_ros import msg_roundtrip  # noqa: E402

BEV_PARAMS = load_params("bev")
GRID = rc.BevGrid.from_params(BEV_PARAMS["bev"])
CHANNELS = list(BEV_PARAMS["bev"]["channels"])
SIZES = rc.TokenSizes.from_params(BEV_PARAMS["tokens"])
STAMP = 1_700_000_123_456_789_012


@pytest.fixture(scope="module")
def arrays():
    return msg_roundtrip.sample_arrays(BEV_PARAMS, seed=11)


# --------------------------------------------------------------------------------------------------
# BEV
# --------------------------------------------------------------------------------------------------


def test_bev_round_trip_is_exact_and_uses_a_flat_float32_buffer(arrays):
    features = arrays["bev"]["features"]
    assert features.shape == (len(CHANNELS), GRID.height, GRID.width) and len(CHANNELS) >= 10
    msg = rc.bev_to_msg(features, GRID, CHANNELS, STAMP)
    assert isinstance(msg.data, array.array) and msg.data.typecode == "f"
    frame = rc.bev_from_msg(msg, expected_channels=CHANNELS, expected_grid=GRID)
    np.testing.assert_array_equal(frame.features, features)
    assert frame.features.dtype == np.float32
    assert frame.grid == GRID and frame.channel_names == tuple(CHANNELS)
    assert frame.stamp_ns == STAMP and frame.frame_id == "base_link"
    # A list-valued data field (another publisher's style) decodes to the same tensor.
    msg.data = features.ravel().tolist()
    np.testing.assert_array_equal(rc.bev_from_msg(msg).features, features)


def test_bev_wrong_tensor_size_for_declared_grid_is_rejected(arrays):
    msg = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS)
    msg.data = array.array("f", [0.0] * 100)
    c, h, w = len(CHANNELS), GRID.height, GRID.width
    with pytest.raises(rc.MessageValidationError) as err:
        rc.bev_from_msg(msg)
    text = str(err.value)
    assert f"BevFeatures.data has 100 values, expected {c}*{h}*{w}={c * h * w}" in text
    # A grid declared larger than the tensor is the same error, named with the declared sizes.
    msg = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS)
    msg.height = GRID.height + 2
    with pytest.raises(
        rc.MessageValidationError, match=rf"{c}\*{h + 2}\*{w}={c * (h + 2) * w} for the declared"
    ):
        rc.bev_from_msg(msg)


def test_bev_wrong_channel_count_is_rejected(arrays):
    msg = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS)
    msg.channel_names = CHANNELS[:-1]
    total = len(CHANNELS) * GRID.height * GRID.width
    with pytest.raises(
        rc.MessageValidationError,
        match=rf"BevFeatures.data has {total} values, expected "
        rf"{len(CHANNELS) - 1}\*{GRID.height}\*{GRID.width}",
    ):
        rc.bev_from_msg(msg)
    with pytest.raises(
        rc.MessageValidationError,
        match=rf"BevFeatures.channel_names has {len(CHANNELS) - 1} "
        rf"channels .* expected {len(CHANNELS)}",
    ):
        rc.bev_from_msg(msg, expected_channels=CHANNELS)
    # Same count, different order: still not what the planner was configured for.
    good = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS[::-1])
    with pytest.raises(rc.MessageValidationError, match="channel_names"):
        rc.bev_from_msg(good, expected_channels=CHANNELS)
    with pytest.raises(
        rc.MessageValidationError,
        match=r"BevFeatures.data has shape \[3, 128, 128\], expected "
        rf"\[{len(CHANNELS)}, 128, 128\]",
    ):
        rc.bev_to_msg(arrays["bev"]["features"][:3], GRID, CHANNELS)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_bev_non_finite_values_are_rejected_with_their_location(arrays, bad):
    features = arrays["bev"]["features"].copy()
    msg = rc.bev_to_msg(features, GRID, CHANNELS)
    route = CHANNELS.index("route")
    msg.data[route * GRID.height * GRID.width + 4 * GRID.width + 7] = bad
    with pytest.raises(
        rc.MessageValidationError,
        match=r"BevFeatures.data has 1 non-finite values .* channel "
        r"'route' at row 4, column 7",
    ):
        rc.bev_from_msg(msg)
    features[0, 0, 0] = bad
    with pytest.raises(rc.MessageValidationError, match="BevFeatures.data has 1 non-finite"):
        rc.bev_to_msg(features, GRID, CHANNELS)


def test_bev_bad_grid_geometry_is_rejected(arrays):
    msg = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS)
    msg.resolution = 0.0
    with pytest.raises(rc.MessageValidationError, match="BevFeatures.resolution is 0.0"):
        rc.bev_from_msg(msg)
    msg = rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS)
    msg.origin_x = float("nan")
    with pytest.raises(rc.MessageValidationError, match="BevFeatures.origin_x is nan"):
        rc.bev_from_msg(msg)
    other = rc.BevGrid(GRID.resolution, GRID.height, GRID.width, GRID.origin_x + 1.0, GRID.origin_y)
    with pytest.raises(rc.MessageValidationError, match="BevFeatures.grid"):
        rc.bev_from_msg(rc.bev_to_msg(arrays["bev"]["features"], GRID, CHANNELS), expected_grid=other)


# --------------------------------------------------------------------------------------------------
# Scene tokens
# --------------------------------------------------------------------------------------------------


def _tokens(arrays) -> rc.SceneTokenArrays:
    t = arrays["tokens"]
    return rc.SceneTokenArrays(
        t["map_polylines"],
        t["map_mask"],
        t["agents"],
        t["agents_mask"],
        t["route"],
        t["route_mask"],
        t["ego_state"],
        STAMP,
        "base_link",
        t["lane_ids"],
        t["agent_ids"],
        t["agent_types"],
    )


def test_scene_tokens_round_trip(arrays):
    tokens = _tokens(arrays)
    assert tokens.sizes == SIZES
    msg = rc.scene_tokens_to_msg(tokens)
    assert len(msg.map_polylines) == int(tokens.map_mask.sum()) < SIZES.num_map_polylines
    assert len(msg.agents) == int(tokens.agents_mask.sum()) < SIZES.num_agents
    back = rc.scene_tokens_from_msg(msg, SIZES)
    for name in (
        "map_mask",
        "agents_mask",
        "route_mask",
        "ego_state",
        "lane_ids",
        "agent_ids",
        "agent_types",
    ):
        np.testing.assert_array_equal(getattr(back, name), getattr(tokens, name), err_msg=name)
    # Positions, speed limits, flags, signal states, velocities and box sizes are exact; cos/sin of
    # headings pass through atan2 and float32.
    exact_map_cols, exact_agent_cols = [0, 1, 4, 5, 6, 7], [0, 1, 4, 5, 6, 7, 8, 9]
    np.testing.assert_array_equal(
        back.map_polylines[..., exact_map_cols], tokens.map_polylines[..., exact_map_cols]
    )
    np.testing.assert_allclose(back.map_polylines, tokens.map_polylines, atol=2e-6)
    np.testing.assert_array_equal(back.agents[:, exact_agent_cols], tokens.agents[:, exact_agent_cols])
    np.testing.assert_allclose(back.agents, tokens.agents, atol=2e-6)
    np.testing.assert_array_equal(back.route[:, :2], tokens.route[:, :2])
    np.testing.assert_allclose(back.route, tokens.route, atol=2e-6)
    assert back.stamp_ns == STAMP and back.frame_id == "base_link"
    # Agent types map onto the is_vehicle / is_vru flags.
    valid = back.agents_mask
    assert np.array_equal(back.agents[valid, 8] > 0.5, back.agent_types[valid] == AgentState.TYPE_VEHICLE)


def test_scene_tokens_without_identities_derive_types_from_flags(arrays):
    tokens = _tokens(arrays)
    tokens.lane_ids = tokens.agent_ids = tokens.agent_types = None
    back = rc.scene_tokens_from_msg(rc.scene_tokens_to_msg(tokens), SIZES)
    valid = back.agents_mask
    np.testing.assert_array_equal(back.agents[valid, 8:], tokens.agents[valid, 8:])
    assert set(back.agent_types[valid]) <= {AgentState.TYPE_VEHICLE, AgentState.TYPE_PEDESTRIAN}
    assert np.all(back.lane_ids[back.map_mask] == -1)


def test_scene_tokens_decoding_rejects_oversized_and_malformed_content(arrays):
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    small = rc.TokenSizes(SIZES.num_map_polylines, SIZES.points_per_polyline, 4, SIZES.num_route_points)
    with pytest.raises(
        rc.MessageValidationError,
        match=rf"SceneTokens.agents has {len(msg.agents)} entries, "
        "more than the 4",
    ):
        rc.scene_tokens_from_msg(msg, small)
    msg.map_polylines[2].points = msg.map_polylines[2].points[:-3]
    with pytest.raises(
        rc.MessageValidationError,
        match=rf"SceneTokens.map_polylines\[2\].points has "
        rf"{SIZES.points_per_polyline - 3} points, expected {SIZES.points_per_polyline}",
    ):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.agents[1].length = 0.0
    with pytest.raises(rc.MessageValidationError, match=r"SceneTokens.agents\[1\] has box 0.0x"):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.agents[0].type = 9
    with pytest.raises(rc.MessageValidationError, match=r"SceneTokens.agents.type has unknown values \[9\]"):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    assert {p.signal_state for p in msg.map_polylines} == {0, 1, 2, 3}  # sample_arrays has every state
    msg.map_polylines[3].signal_state = 7
    with pytest.raises(rc.MessageValidationError, match=r"SceneTokens.map_polylines\[3\].signal_state is 7"):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.ego_speed = float("nan")
    with pytest.raises(rc.MessageValidationError, match="SceneTokens.ego_speed is nan"):
        rc.scene_tokens_from_msg(msg, SIZES)


def test_scene_tokens_encoding_validates_shapes_and_per_lane_values(arrays):
    tokens = _tokens(arrays)
    tokens.agents = tokens.agents[:, :9]
    with pytest.raises(
        rc.MessageValidationError, match=r"SceneTokens.agents has shape \[32, 9\], expected \[\*, 10\]"
    ):
        rc.scene_tokens_to_msg(tokens)
    tokens = _tokens(arrays)
    tokens.map_polylines = tokens.map_polylines.copy()
    tokens.map_polylines[0, 5:, 4] += 5.0
    with pytest.raises(rc.MessageValidationError, match=r"map_polylines\[0\] has speed limit varying"):
        rc.scene_tokens_to_msg(tokens)


def test_map_polyline_headings_may_be_omitted():
    xy = np.stack(
        [np.linspace(0, 19, SIZES.points_per_polyline), np.zeros(SIZES.points_per_polyline)], axis=1
    )
    poly = MapPolyline(
        type=MapPolyline.TYPE_CENTERLINE,
        lane_id=4,
        speed_limit=10.0,
        on_route=True,
        points=[Point(x=float(x), y=float(y), z=0.0) for x, y in xy],
    )
    back = rc.scene_tokens_from_msg(SceneTokens(map_polylines=[poly]), SIZES)
    np.testing.assert_allclose(
        back.map_polylines[0, :, 2:4], np.tile([1.0, 0.0], (SIZES.points_per_polyline, 1))
    )
    assert back.map_polylines[0, 0, 5] == 1.0 and back.lane_ids[0] == 4


# --------------------------------------------------------------------------------------------------
# Trajectories, candidates, Path
# --------------------------------------------------------------------------------------------------


def test_candidate_set_round_trip_and_validation(arrays):
    c = arrays["candidates"]
    msg = rc.candidate_set_to_msg(
        c["candidates"], c["scores"], c["selected"], c["dt"], STAMP, denoising_steps=10
    )
    back = rc.candidate_set_from_msg(msg)
    np.testing.assert_array_equal(back.candidates, c["candidates"])
    np.testing.assert_array_equal(back.scores, c["scores"].astype(np.float32))
    assert (back.selected, back.dt, back.stamp_ns, back.denoising_steps) == (c["selected"], 0.5, STAMP, 10)

    with pytest.raises(
        rc.MessageValidationError, match=r"CandidateSet.selected_index is 32, expected -1..31"
    ):
        rc.candidate_set_to_msg(c["candidates"], c["scores"], 32, 0.5)
    with pytest.raises(
        rc.MessageValidationError, match=r"CandidateSet.scores has shape \[31\], expected \[32\]"
    ):
        rc.candidate_set_to_msg(c["candidates"], c["scores"][:-1], 0, 0.5)
    msg.candidates[3].points = msg.candidates[3].points[:5]
    with pytest.raises(
        rc.MessageValidationError, match=r"CandidateSet.candidates have different point counts \[5, 8\]"
    ):
        rc.candidate_set_from_msg(msg)
    msg = rc.candidate_set_to_msg(c["candidates"], c["scores"], 0, 0.5)
    msg.candidates[7].score = 1.5
    with pytest.raises(rc.MessageValidationError, match=r"CandidateSet.candidates\[7\].score is 1.5"):
        rc.candidate_set_from_msg(msg)
    msg = rc.candidate_set_to_msg(c["candidates"], np.full(32, np.nan), -1, 0.5)
    fallback = rc.candidate_set_from_msg(msg)
    assert fallback.selected == -1 and np.all(np.isnan(fallback.scores))


@pytest.mark.parametrize(("num", "length", "frame", "selected"),
                         [(32, 8, "base_link", 3), (1, 1, "a", -1), (0, 8, "odd", -1), (5, 0, "xy", 2),
                          (3, 17, "", 0)])
def test_candidate_set_cdr_decodes_to_the_message_it_replaces(num, length, frame, selected):
    """The planner publishes candidate_set_to_cdr's bytes: any subscriber must decode exactly the
    message candidate_set_to_msg builds (alignment after strings of every length, empty sets)."""
    from rad2_msgs.msg import CandidateSet
    from rclpy.serialization import deserialize_message, serialize_message

    rng = np.random.default_rng(num * 100 + length)
    cands = rng.normal(size=(num, length, 2)) * 40.0
    scores = rng.random(num)
    scores[: min(num, 1)] = np.nan  # unscored candidates travel as NaN
    args = (cands, scores, selected, 0.5, STAMP, frame, 4)
    packed = rc.candidate_set_to_cdr(*args)
    expected = rc.candidate_set_to_msg(*args)
    assert len(packed) == len(serialize_message(expected))
    got = deserialize_message(packed, CandidateSet)
    assert [(len(t.yaw), len(t.speed), t.header) for t in got.candidates] == \
        [(len(t.yaw), len(t.speed), t.header) for t in expected.candidates]
    back, ref = rc.candidate_set_from_msg(got), rc.candidate_set_from_msg(expected)
    shape = (num, length, 2)
    np.testing.assert_array_equal(back.candidates.reshape(shape), ref.candidates.reshape(shape))
    np.testing.assert_array_equal(back.scores, ref.scores)  # NaN where NaN
    np.testing.assert_array_equal(back.dt, ref.dt)  # NaN when there is no candidate to carry dt
    fields = ("selected", "stamp_ns", "frame_id", "denoising_steps")
    assert [getattr(back, f) for f in fields] == [getattr(ref, f) for f in fields]
    assert [getattr(back, f) for f in fields] == [selected, STAMP, frame, 4]
    with pytest.raises(rc.MessageValidationError, match=r"CandidateSet.selected_index is 40"):
        rc.candidate_set_to_cdr(cands, scores, 40, 0.5)
    if num:
        bad = scores.copy()
        bad[-1] = 1.5
        name = rf"CandidateSet.candidates\[{num - 1}\].score"
        with pytest.raises(rc.MessageValidationError, match=rf"{name} is 1.5"):
            rc.candidate_set_to_cdr(cands, bad, 0, 0.5)


def test_scene_tokens_non_finite_polyline_values_name_the_polyline(arrays):
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.map_polylines[3].points[5].y = float("inf")
    name = r"SceneTokens.map_polylines\[3\].points"
    with pytest.raises(rc.MessageValidationError, match=rf"{name} has 1 non-finite values .* index \(5, 1\)"):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.map_polylines[2].speed_limit = float("nan")
    with pytest.raises(rc.MessageValidationError, match=r"map_polylines\[2\].speed_limit is nan"):
        rc.scene_tokens_from_msg(msg, SIZES)
    msg = rc.scene_tokens_to_msg(_tokens(arrays))
    msg.map_polylines[1].headings = msg.map_polylines[1].headings[:4]
    with pytest.raises(rc.MessageValidationError, match=r"map_polylines\[1\].headings has 4 values"):
        rc.scene_tokens_from_msg(msg, SIZES)


def test_trajectory_round_trip_and_validation(arrays):
    t = arrays["trajectory"]
    back = rc.trajectory_from_msg(
        rc.trajectory_to_msg(t["points"], t["dt"], STAMP, "map", t["yaw"], t["speed"], t["score"])
    )
    np.testing.assert_array_equal(back.points, t["points"])
    np.testing.assert_array_equal(back.yaw, t["yaw"])
    np.testing.assert_array_equal(back.speed, t["speed"])
    assert (back.dt, back.score, back.stamp_ns, back.frame_id) == (0.5, 0.8125, STAMP, "map")
    bare = rc.trajectory_from_msg(rc.trajectory_to_msg(t["points"], 0.5))
    assert bare.yaw is None and bare.speed is None and math.isnan(bare.score)
    msg = rc.trajectory_to_msg(t["points"], 0.5, yaw=t["yaw"])
    msg.yaw = msg.yaw[:3]
    with pytest.raises(rc.MessageValidationError, match="Trajectory.yaw has 3 values for 8 points"):
        rc.trajectory_from_msg(msg)
    with pytest.raises(rc.MessageValidationError, match="Trajectory.dt is 0.0, expected > 0"):
        rc.trajectory_to_msg(t["points"], 0.0)
    with pytest.raises(rc.MessageValidationError, match=r"Trajectory.points has shape \[8, 3\]"):
        rc.trajectory_to_msg(np.zeros((8, 3)), 0.5)


@pytest.mark.parametrize(("length", "frame"), [(8, "base_link"), (1, "a"), (0, "odd"), (17, ""), (5, "xy")])
def test_path_cdr_decodes_to_the_message_it_replaces(length, frame):
    """The planner publishes trajectory_to_path_cdr's bytes on planning/path: a subscriber decodes the
    Path that trajectory_to_path builds (every pose's stamp, position and orientation; alignment after
    frame ids of every length; no pose). The padding is not compared: rclpy leaves it unset."""
    from nav_msgs.msg import Path
    from rclpy.serialization import deserialize_message, serialize_message

    rng = np.random.default_rng(length)
    points = np.cumsum(rng.normal(size=(length, 2)) * 3.0, axis=0)
    packed = rc.trajectory_to_path_cdr(points, 0.5, STAMP, frame)
    expected = rc.trajectory_to_path(points, 0.5, STAMP, frame)
    assert len(packed) == len(serialize_message(expected))
    assert deserialize_message(packed, Path) == expected
    with pytest.raises(rc.MessageValidationError, match=r"Path.dt is 0.0"):
        rc.trajectory_to_path_cdr(points, 0.0, STAMP, frame)
    with pytest.raises(rc.MessageValidationError, match="stamp_ns -5 is negative"):
        rc.trajectory_to_path_cdr(points, 0.5, -5, frame)


@pytest.mark.parametrize(("num", "length", "frame", "selected"),
                         [(32, 8, "base_link", 3), (1, 1, "a", 0), (0, 8, "odd", -1), (5, 0, "xy", -1),
                          (3, 17, "", 2)])
def test_candidate_markers_cdr_decodes_to_what_the_messages_deliver(num, length, frame, selected):
    """planning/markers goes out as candidate_markers_to_cdr's bytes: a subscriber decodes what it
    would have received from the MarkerArray candidate_markers_to_msg builds (colours by score, grey
    when unscored, the selected line blue and wider, the DELETEALL first), on this install's Marker."""
    from rclpy.serialization import deserialize_message, serialize_message
    from visualization_msgs.msg import Marker, MarkerArray

    assert rc.markers_cdr_matches_this_distro()
    rng = np.random.default_rng(num + length)
    cands = rng.normal(size=(num, length, 2)) * 20.0
    scores = rng.random(num)
    scores[: min(num, 2) // 2] = np.nan
    args = (cands, scores, selected, STAMP, frame)
    got = deserialize_message(rc.candidate_markers_to_cdr(*args), MarkerArray)
    sent = deserialize_message(serialize_message(rc.candidate_markers_to_msg(*args)), MarkerArray)
    assert got == sent
    assert got.markers[0].action == Marker.DELETEALL and len(got.markers) == num + 1
    if num:
        lines = got.markers[1:]
        assert [len(mk.points) for mk in lines] == [length + 1] * num
        assert [mk.ns for mk in lines].count("selected") == int(selected >= 0)
    with pytest.raises(rc.MessageValidationError, match=r"MarkerArray.scores has shape"):
        rc.candidate_markers_to_cdr(cands, np.zeros(num + 1), selected, STAMP, frame)
    if num and length:
        bad = cands.copy()
        bad[0, 0, 0] = np.inf
        with pytest.raises(rc.MessageValidationError, match="MarkerArray.candidates"):
            rc.candidate_markers_to_cdr(bad, scores, selected, STAMP, frame)


def test_path_round_trip_with_finite_difference_headings():
    radius, dt = 20.0, 0.5
    angles = np.linspace(0.1, 1.2, 8)
    arc = np.stack([radius * np.sin(angles), radius * (1 - np.cos(angles))], axis=1)  # left turn from origin
    path = rc.trajectory_to_path(arc, dt, STAMP, "base_link")
    assert len(path.poses) == 8
    assert rc.time_to_ns(path.poses[2].header.stamp) == STAMP + 1_500_000_000
    back = rc.path_to_trajectory(path)
    np.testing.assert_array_equal(back.points, arc)
    assert back.dt == pytest.approx(dt) and back.stamp_ns == STAMP
    # The tangent of the arc at angle a is a; central differences are within the chord error.
    np.testing.assert_allclose(back.yaw[1:-1], angles[1:-1], atol=0.02)
    # A stop (repeated points) keeps the previous heading instead of snapping to 0.
    stop = np.array([[1.0, 1.0], [2.0, 2.0], [2.0, 2.0], [2.0, 2.0]])
    yaw = rc.path_to_trajectory(rc.trajectory_to_path(stop, dt)).yaw
    np.testing.assert_allclose(yaw, [math.pi / 4] * 4, atol=1e-6)
    bad = rc.trajectory_to_path(arc, dt)
    bad.poses[1].pose.orientation.w = 3.0
    with pytest.raises(rc.MessageValidationError, match=r"Path.poses\[1\].pose.orientation has norm"):
        rc.path_to_trajectory(bad)
    bad = rc.trajectory_to_path(arc, dt)
    bad.poses[4].header.stamp = rc.ns_to_time(STAMP + 9_000_000_000)
    with pytest.raises(rc.MessageValidationError, match=r"Path.poses\[\].header.stamp"):
        rc.path_to_trajectory(bad)


# --------------------------------------------------------------------------------------------------
# Control command, diagnostics, odometry, perception inputs, time
# --------------------------------------------------------------------------------------------------


def test_control_command_round_trip_and_nan_rejection():
    cmd = rc.ControlCommandValues(-2.5, 0.125, -0.25, 7.75, True, "stale plan", STAMP)
    assert rc.control_command_from_msg(rc.control_command_to_msg(cmd)) == cmd
    msg = rc.control_command_to_msg(cmd)
    msg.acceleration = float("nan")
    with pytest.raises(rc.MessageValidationError, match="ControlCommand.acceleration is nan"):
        rc.control_command_from_msg(msg)
    with pytest.raises(rc.MessageValidationError, match="ControlCommand.steering_rate is inf"):
        rc.control_command_to_msg(rc.ControlCommandValues(0.0, 0.0, float("inf"), 0.0))


def test_planning_diagnostics_round_trip_and_validation():
    stages = {"preprocess": 1.5, "encode": 6.25, "denoise_0": 3.125}
    msg = rc.planning_diagnostics_to_msg(
        stages,
        node="planner_node",
        backend="pytorch",
        stamp_ns=STAMP,
        input_stamp_ns=STAMP - 10,
        end_to_end_ms=12.5,
        deadline_missed=True,
        cycle_count=9,
        deadline_miss_count=2,
        rejected_input_count=1,
        fallback_active=True,
        fallback_reason="no plan",
    )
    back = rc.planning_diagnostics_from_msg(msg)
    assert back["stages"] == stages and list(back["stages"]) == list(stages)
    assert back["total_ms"] == pytest.approx(10.875)
    assert (back["node"], back["backend"], back["fallback_reason"]) == ("planner_node", "pytorch", "no plan")
    assert (back["cycle_count"], back["deadline_miss_count"], back["rejected_input_count"]) == (9, 2, 1)
    assert back["deadline_missed"] and back["fallback_active"] and back["input_stamp_ns"] == STAMP - 10
    with pytest.raises(rc.MessageValidationError, match=r"stages\['encode'\].milliseconds is -1.0"):
        rc.planning_diagnostics_to_msg({"encode": -1.0}, node="n", backend="b")
    dup = PlanningDiagnostics(
        stages=[StageLatency(name="a", milliseconds=1.0), StageLatency(name="a", milliseconds=2.0)]
    )
    with pytest.raises(
        rc.MessageValidationError, match=r"PlanningDiagnostics.stages\[1\].name repeats stage 'a'"
    ):
        rc.planning_diagnostics_from_msg(dup)


def test_odometry_round_trip_and_validation():
    motion = rc.EgoMotion(x=105.25, y=-42.5, yaw=-2.9, speed=11.5, yaw_rate=0.08, stamp_ns=STAMP)
    back = rc.odometry_from_msg(rc.odometry_to_msg(motion))
    assert (back.x, back.y, back.speed, back.yaw_rate, back.stamp_ns) == (105.25, -42.5, 11.5, 0.08, STAMP)
    assert back.yaw == pytest.approx(-2.9, abs=1e-12)
    assert (back.frame_id, back.child_frame_id) == ("map", "base_link")
    msg = rc.odometry_to_msg(motion)
    msg.pose.pose.orientation.w = 0.0
    msg.pose.pose.orientation.z = 0.0
    with pytest.raises(rc.MessageValidationError, match="Odometry.pose.pose.orientation has norm 0.000000"):
        rc.odometry_from_msg(msg)
    msg = rc.odometry_to_msg(motion)
    msg.twist.twist.linear.x = float("nan")
    with pytest.raises(rc.MessageValidationError, match="Odometry.twist.twist.linear.x is nan"):
        rc.odometry_from_msg(msg)


def test_perception_inputs_round_trip_and_validation():
    agents = rc.AgentList(
        ids=np.array([4, 9, 12]),
        types=np.array([0, 1, 2], np.uint8),
        x=np.array([1.5, -20.25, 300.125]),
        y=np.array([0.0, 3.5, -7.0]),
        yaw=np.array([0.1, -3.0, 1.5]),
        length=np.array([4.5, 0.6, 1.8]),
        width=np.array([1.9, 0.6, 0.7]),
        vx=np.array([10.0, 0.5, 4.0]),
        vy=np.array([0.25, -1.0, 0.0]),
    )
    msg = rc.perception_inputs_to_msg(agents, STAMP)
    back, stamp, frame = rc.perception_inputs_from_msg(msg)
    assert (stamp, frame) == (STAMP, "map")
    for name in ("ids", "types", "x", "y", "yaw"):
        np.testing.assert_array_equal(getattr(back, name), getattr(agents, name), err_msg=name)
    for name in ("length", "width", "vx", "vy"):  # float32 fields
        np.testing.assert_array_equal(
            getattr(back, name), getattr(agents, name).astype(np.float32), err_msg=name
        )
    msg.agents[2].id = 4
    with pytest.raises(
        rc.MessageValidationError, match=r"PerceptionInputs.agents.id has duplicate ids \[4, 4, 9\]"
    ):
        rc.perception_inputs_from_msg(msg)
    agents.types = np.array([0, 1, 7], np.uint8)
    with pytest.raises(
        rc.MessageValidationError, match=r"PerceptionInputs.agents.type has unknown values \[7\]"
    ):
        rc.perception_inputs_to_msg(agents)


@pytest.mark.parametrize("theta", [1e9, -7.0, float("nan")])
def test_a_heading_far_outside_one_turn_is_refused_naming_the_field(arrays, theta):
    """float32 has no fraction of a turn left at 1e9 rad: such a heading (agents in object lists and
    scene tokens, lane headings, route poses) is refused naming the field, like NaN; +-2 pi (a wrapped
    or unwrapped heading) is read."""
    agents = rc.AgentList(ids=np.array([4, 9]), types=np.array([0, 0], np.uint8), x=np.array([1.0, 5.0]),
                          y=np.zeros(2), yaw=np.array([0.1, 2 * math.pi]), length=np.full(2, 4.5),
                          width=np.full(2, 1.9), vx=np.zeros(2), vy=np.zeros(2))
    msg = rc.perception_inputs_to_msg(agents, STAMP)
    assert rc.perception_inputs_from_msg(msg)[0].yaw[1] == pytest.approx(2 * math.pi)
    msg.agents[1].pose.theta = theta
    with pytest.raises(rc.MessageValidationError, match=r"PerceptionInputs.agents\[1\].pose.theta is"):
        rc.perception_inputs_from_msg(msg)
    tokens = rc.scene_tokens_to_msg(_tokens(arrays))
    tokens.agents[0].pose.theta = theta
    with pytest.raises(rc.MessageValidationError, match=r"SceneTokens.agents\[0\].pose.theta is"):
        rc.scene_tokens_from_msg(tokens, SIZES)
    tokens = rc.scene_tokens_to_msg(_tokens(arrays))
    tokens.map_polylines[2].headings[3] = theta
    with pytest.raises(rc.MessageValidationError, match=r"SceneTokens.map_polylines\[2\].headings (is|has) "
                                                        r".* at index \(3,\)"):
        rc.scene_tokens_from_msg(tokens, SIZES)
    tokens = rc.scene_tokens_to_msg(_tokens(arrays))
    tokens.route[1].theta = theta
    with pytest.raises(rc.MessageValidationError,
                       match=r"SceneTokens.route(\[1\].theta is| has 1 non-finite)"):
        rc.scene_tokens_from_msg(tokens, SIZES)


def test_time_conversions():
    assert rc.time_to_ns(rc.ns_to_time(STAMP)) == STAMP
    t = rc.ns_to_time(2_500_000_001)
    assert (t.sec, t.nanosec) == (2, 500_000_001)
    with pytest.raises(rc.MessageValidationError, match="stamp_ns -5 is negative"):
        rc.ns_to_time(-5)
