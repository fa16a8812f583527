"""Left-right mirror images of clips (rad2_datasets.mirror): geometry reflected consistently, mirroring
twice gives the original back, and the mirrored log is still a collision-free drive of the same length."""

import numpy as np
import pytest
from rad2_core.storage import load_dataset
from rad2_datasets.mirror import mirror_clip, mirror_dataset, mirror_map
from rad2_planner.policy import resolve_path


@pytest.fixture(scope="module")
def clip():
    return load_dataset(resolve_path("data/eval_real"))[0]


def test_mirroring_twice_gives_the_original_back(clip):
    back = mirror_clip(mirror_clip(clip))
    assert back.clip_id == clip.clip_id and back.metadata == clip.metadata
    for name in ("ego_x", "ego_y", "ego_yaw", "agent_x", "agent_y", "agent_yaw", "agent_vx", "agent_vy",
                 "route_polyline"):
        np.testing.assert_allclose(getattr(back, name), getattr(clip, name), atol=1e-12, err_msg=name)
    assert back.map.content_hash() == clip.map.content_hash()


def test_the_mirror_reflects_tracks_lanes_and_sides(clip):
    m = mirror_clip(clip)
    assert m.clip_id == clip.clip_id + "_mirrored" and m.metadata["mirrored"] is True
    np.testing.assert_allclose(m.ego_y, -clip.ego_y)
    np.testing.assert_allclose(np.cos(m.ego_yaw), np.cos(clip.ego_yaw))
    np.testing.assert_allclose(np.sin(m.ego_yaw), -np.sin(clip.ego_yaw), atol=1e-12)
    assert np.all(m.ego_yaw > -np.pi) and np.all(m.ego_yaw <= np.pi)
    valid = clip.agent_valid
    np.testing.assert_allclose(m.agent_vy[valid], -clip.agent_vy[valid])
    assert not m.agent_y[~valid].any()  # invalid entries stay zeros
    lanes = m.map
    assert lanes.map_id != clip.map.map_id
    # a lane's left boundary is the reflection of its right one, and its neighbours swap sides
    np.testing.assert_allclose(lanes.left_boundaries[0], clip.map.right_boundaries[0] * [1.0, -1.0])
    if clip.map.has_adjacency:
        np.testing.assert_array_equal(lanes.left_neighbors, clip.map.right_neighbors)
        np.testing.assert_array_equal(lanes.lane_change_right, clip.map.lane_change_left)
    # the left boundary is on the left of the centreline in the mirrored map too
    c, left = lanes.centerlines[0], lanes.left_boundaries[0]
    d = c[-1] - c[0]
    rel = left.mean(0) - c.mean(0)
    assert d[0] * rel[1] - d[1] * rel[0] > 0.0


def _signed_area(p):
    x, y = p[:, 0], p[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def test_polygons_keep_their_winding(clip):
    areas = clip.map.drivable_areas
    if not areas:
        pytest.skip("the clip's map has no drivable-area polygons")
    mirrored = mirror_map(clip.map).drivable_areas
    for a, b in zip(areas, mirrored):
        assert np.sign(_signed_area(a)) == np.sign(_signed_area(b))
        assert abs(_signed_area(a)) == pytest.approx(abs(_signed_area(b)))


def test_the_mirrored_log_replays_without_collision(tmp_path):
    """The logged drive, mirrored, is still a drive: the simulator accepts every mirrored clip and the
    replayed log neither collides nor leaves the road, with the original's progress."""
    from rad2_core.config import load_merged
    from rad2_evaluation.closed_loop import evaluate_split

    n = mirror_dataset(resolve_path("data/eval_real"), tmp_path / "mirrored")
    assert n == len(load_dataset(resolve_path("data/eval_real")))
    params = load_merged()
    ev = evaluate_split("expert", tmp_path / "mirrored", params, max_clips=3, progress=False)
    assert len(ev.results) == 3
    assert not any(r.collided or r.offroad for r in ev.results)
    assert all(r.rho == pytest.approx(1.0, abs=0.02) for r in ev.results)
