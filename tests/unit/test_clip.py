"""Clip data model: validation messages, save/load round trips, shared maps, version checks."""

import json
from dataclasses import replace

import numpy as np
import pytest
from rad2_core.field_checks import ClipValidationError
from rad2_core.storage import (
    FORMAT_VERSION,
    ClipFormatError,
    iter_dataset,
    load_clip,
    load_dataset,
    read_index,
    save_clip,
    save_dataset,
)
from synthetic_scenes import make_clip


def _assert_clips_close(a, b, atol=1e-3):
    assert a.clip_id == b.clip_id and a.num_steps == b.num_steps and a.dt == pytest.approx(b.dt)
    for name in ("ego_x", "ego_y", "ego_yaw", "ego_speed"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=atol, err_msg=name)
    np.testing.assert_array_equal(a.agent_valid, b.agent_valid)
    np.testing.assert_array_equal(a.agent_ids, b.agent_ids)
    np.testing.assert_array_equal(a.agent_types, b.agent_types)
    v = a.agent_valid
    for name in ("agent_x", "agent_y", "agent_yaw", "agent_vx", "agent_vy"):
        np.testing.assert_allclose(getattr(a, name)[v], getattr(b, name)[v], atol=atol, err_msg=name)
    np.testing.assert_allclose(a.route_polyline, b.route_polyline, atol=atol)
    np.testing.assert_array_equal(a.route_lane_ids, b.route_lane_ids)
    assert a.map.map_id == b.map.map_id
    assert a.map.num_lanes == b.map.num_lanes
    for pa, pb in zip(a.map.centerlines, b.map.centerlines):
        np.testing.assert_allclose(pa, pb, atol=atol)
    assert a.map.successors == b.map.successors
    assert len(a.map.drivable_areas) == len(b.map.drivable_areas)
    assert len(a.map.crosswalks) == len(b.map.crosswalks)
    assert a.metadata == b.metadata


def test_synthetic_clip_validates_and_helpers():
    clip = make_clip().validate()
    assert clip.num_steps == 121 and clip.duration_s == pytest.approx(12.0)
    pose = clip.ego_pose(0)
    assert pose.shape == (3,) and pose[0] == pytest.approx(20.0)
    now = clip.agents_at(0)
    assert len(now) == 3  # the late car is not valid yet
    assert len(clip.agents_at(120)) == 4
    sub = clip.slice(0, 40).validate()
    assert sub.num_steps == 40 and sub.num_agents == 3  # the late car never appears in [0, 40)
    with pytest.raises(IndexError):
        clip.ego_pose(121)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (
            lambda c: setattr(c, "agent_x", c.agent_x[:, :-1]),
            "agent_x: shape (4, 120) does not match (N=4, T=121)",
        ),
        (lambda c: setattr(c, "ego_speed", c.ego_speed[:-1]), "ego_speed: shape (120,)"),
        (lambda c: setattr(c, "dt", 0.0), "dt:"),
        (lambda c: c.ego_yaw.__setitem__(3, 4.0), "ego_yaw:"),
        (lambda c: c.agent_y.__setitem__((0, 5), np.nan), "agent_y: non-finite"),
        (lambda c: setattr(c, "route_lane_ids", np.array([], np.int64)), "route_lane_ids:"),
        (lambda c: setattr(c, "route_lane_ids", np.array([99], np.int64)), "route_lane_ids: lane id 99"),
        (lambda c: setattr(c.map, "lane_ids", np.array([], np.int64)), "map.lane_ids"),
        (lambda c: c.map.successors.__setitem__(0, [42]), "map.successors[0]"),
        (lambda c: setattr(c, "agent_types", np.array([0, 0, 0, 7], np.int8)), "agent_types"),
        (lambda c: setattr(c, "agent_width", -c.agent_width), "agent_width"),
        (lambda c: c.metadata.pop("source"), "metadata"),
    ],
)
def test_validation_names_the_field(mutate, field):
    clip = make_clip()
    mutate(clip)
    with pytest.raises(ClipValidationError) as err:
        clip.validate()
    assert str(err.value).startswith(field.split(":")[0])
    assert field in str(err.value)


def test_invalid_entries_need_not_be_finite():
    clip = make_clip()
    late = 2
    assert not clip.agent_valid[late, 0]
    clip.agent_x[late, 0] = np.nan
    clip.validate()


def test_clip_round_trip_embedded_map(tmp_path):
    clip = make_clip()
    path = save_clip(clip, tmp_path / "one.npz")
    back = load_clip(path).validate()
    _assert_clips_close(clip, back)


def test_dataset_round_trip_shares_maps(tmp_path):
    base = make_clip(clip_id="a")
    clips = [base] + [make_clip(clip_id=f"c{i}", ego_speed=8.0 + i, lane_map=base.map) for i in range(3)]
    clips[2].metadata["scenario_kind"] = "cut_in"
    index = save_dataset(clips, tmp_path / "ds")
    assert index["format_version"] == FORMAT_VERSION and index["num_clips"] == 4
    assert index["kinds"] == {"slow_leader": 3, "cut_in": 1}
    assert len(list((tmp_path / "ds" / "maps").glob("*.npz"))) == 1
    assert all(e["steps"] == 121 for e in read_index(tmp_path / "ds")["clips"])
    loaded = load_dataset(tmp_path / "ds")
    for a, b in zip(clips, loaded):
        _assert_clips_close(a, b)
    assert loaded[0].map is loaded[3].map  # one map object shared by the lazy loader
    only = list(iter_dataset(tmp_path / "ds", kinds=["cut_in"]))
    assert [c.clip_id for c in only] == ["c1"]
    # appending keeps the earlier clips
    save_dataset([make_clip(clip_id="z", lane_map=base.map)], tmp_path / "ds", append=True)
    assert read_index(tmp_path / "ds")["num_clips"] == 5


def test_compact_on_disk(tmp_path):
    clip = make_clip()
    save_dataset([clip], tmp_path / "ds")
    size = (tmp_path / "ds" / "clips" / "synthetic_0.npz").stat().st_size
    assert size < 30_000


def test_unknown_versions_are_rejected(tmp_path):
    clip = make_clip()
    save_dataset([clip], tmp_path / "ds")
    index_path = tmp_path / "ds" / "index.json"
    index = json.loads(index_path.read_text())
    index["format_version"] = 99
    index_path.write_text(json.dumps(index))
    with pytest.raises(ClipFormatError, match="format_version 99"):
        load_dataset(tmp_path / "ds")
    # a clip file with a future version
    path = save_clip(clip, tmp_path / "x.npz")
    with np.load(path) as z:
        arrays = dict(z)
    arrays["format_version"] = np.int64(FORMAT_VERSION + 1)
    np.savez_compressed(tmp_path / "future.npz", **arrays)
    with pytest.raises(ClipFormatError, match="format_version"):
        load_clip(tmp_path / "future.npz")
    with pytest.raises(ClipFormatError, match="does not exist"):
        load_clip(tmp_path / "missing.npz")


def test_resample_interpolates_tracks_headings_and_validity():
    clip = make_clip()
    yaw = clip.agent_yaw.copy()
    yaw[0, 10], yaw[0, 11] = np.pi - 0.05, -np.pi + 0.05  # crosses +-pi between steps 10 and 11
    valid = clip.agent_valid.copy()
    valid[1, 21] = False  # agent 1 misses log step 21
    clip = replace(clip, agent_yaw=yaw, agent_valid=valid)
    half = clip.resample(clip.dt / 2)
    assert half.dt == pytest.approx(clip.dt / 2) and half.num_steps == 2 * clip.num_steps - 1
    np.testing.assert_allclose(half.ego_x[::2], clip.ego_x)
    np.testing.assert_allclose(half.ego_x[1::2], 0.5 * (clip.ego_x[:-1] + clip.ego_x[1:]))
    assert abs(abs(half.agent_yaw[0, 21]) - np.pi) < 1e-9  # the shorter arc through +-pi, not through 0
    assert not half.agent_valid[1, 41] and not half.agent_valid[1, 42] and not half.agent_valid[1, 43]
    assert half.agent_valid[1, 40] and half.agent_valid[1, 44]
    double = clip.resample(clip.dt * 2)
    assert double.num_steps == (clip.num_steps - 1) // 2 + 1
    np.testing.assert_allclose(double.ego_y, clip.ego_y[::2][: double.num_steps])
    assert clip.resample(clip.dt) is clip
    with pytest.raises(ClipValidationError, match="resample dt"):
        clip.resample(0.0)
    with pytest.raises(ClipValidationError, match="fewer than 2 steps"):
        clip.resample(1e6)


def test_corrupted_files_are_errors_naming_the_file(tmp_path):
    clip = make_clip()
    path = save_clip(clip, tmp_path / "c.npz")
    path.write_bytes(path.read_bytes()[:200])  # a truncated write
    with pytest.raises(ClipFormatError, match=r"c\.npz: unreadable clip file"):
        load_clip(path)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "index.json").write_text('{"format_version": 1, "clips": [')
    with pytest.raises(ClipFormatError, match=r"index\.json: unreadable dataset index"):
        read_index(tmp_path / "ds")


def _two_lane_map_with_signal():
    """Two parallel eastbound lanes (ids 10 left, 11 right) with a signal at x = 30 on both."""
    from rad2_core.lane_map import LaneMap

    xs = np.linspace(0.0, 60.0, 13)
    lanes = {10: 3.5, 11: 0.0}
    return LaneMap.build(
        lane_ids=list(lanes), centerlines=[np.c_[xs, np.full_like(xs, y)] for y in lanes.values()],
        left_boundaries=[np.c_[xs, np.full_like(xs, y + 1.75)] for y in lanes.values()],
        right_boundaries=[np.c_[xs, np.full_like(xs, y - 1.75)] for y in lanes.values()],
        speed_limits=[13.9, 13.9], successors=[[], []],
        left_neighbors=[None, 10], right_neighbors=[11, None], lane_change_left=[False, True],
        lane_change_right=[True, False], signal_ids=[7], signal_lanes=[[10, 11]],
        signal_stop_lines=[[[30.0, -1.75], [30.0, 5.25]]])


def test_adjacency_and_signals_round_trip_and_validate(tmp_path):
    from rad2_core.field_checks import ClipValidationError
    from rad2_core.lane_map import NO_LANE, SIGNAL_GREEN, SIGNAL_RED
    from rad2_core.storage import load_clip, save_clip

    m = _two_lane_map_with_signal()
    m.validate()
    assert m.neighbor(11, "left") == 10 and m.neighbor(10, "left") is None
    assert m.right_neighbors[1] == NO_LANE
    clip = make_clip(num_steps=20)
    clip = replace(clip, map=m, route_lane_ids=np.array([11]), route_polyline=m.centerlines[1].copy(),
                   signal_states=np.array([[SIGNAL_RED] * 10 + [SIGNAL_GREEN] * 10], np.int8))
    clip.validate()
    back = load_clip(save_clip(clip, tmp_path / "c.npz"))
    assert back.map.map_id == m.map_id and back.map.content_hash() == m.map_id
    np.testing.assert_array_equal(back.map.left_neighbors, m.left_neighbors)
    np.testing.assert_array_equal(back.map.lane_change_left, m.lane_change_left)
    assert back.map.signal_lanes == [[10, 11]]
    np.testing.assert_allclose(back.map.signal_stop_lines[0], m.signal_stop_lines[0])
    np.testing.assert_array_equal(back.signal_states, clip.signal_states)
    assert back.signals_at(9)[0] == SIGNAL_RED and back.signals_at(10)[0] == SIGNAL_GREEN
    # slicing and resampling keep the states in step with the tracks (a light is held, not blended)
    assert back.slice(8, 12).signal_states.tolist() == [[1, 1, 3, 3]]
    half = back.resample(back.dt / 2)
    assert half.signal_states.shape == (1, half.num_steps) and half.signal_states[0, 19] == SIGNAL_RED
    # errors name the field
    with pytest.raises(ClipValidationError, match="signal_states"):
        replace(clip, signal_states=np.full((1, 20), 9, np.int8)).validate()
    with pytest.raises(ClipValidationError, match="signal_states"):
        replace(clip, signal_states=np.zeros((2, 20), np.int8)).validate()
    with pytest.raises(ClipValidationError, match=r"map.lane_change_right\[1\]"):
        replace(m, lane_change_right=np.array([True, True])).validate()
    with pytest.raises(ClipValidationError, match=r"map.signal_lanes\[0\]"):
        replace(m, signal_lanes=[[99]]).validate()


def test_maps_without_the_new_parts_keep_their_ids():
    """Adjacency and signals are hashed only when present: the ids of every bundled map stay valid."""
    from pathlib import Path

    from rad2_core.storage import iter_dataset

    clip = next(iter_dataset(Path(__file__).resolve().parents[2] / "data" / "eval_safety"))
    assert not clip.map.has_adjacency and clip.map.num_signals == 0 and clip.signal_states is None
    assert clip.map.content_hash() == clip.map.map_id
    assert clip.signals_at(0).shape == (0,)
