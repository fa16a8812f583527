"""The perception-features node's core (rad2_datasets.live_scene): object lists + odometry streamed
one step at a time give the same BEV and tokens as the offline pipeline on the logged clip."""

from __future__ import annotations

import numpy as np
import pytest
from rad2_core.bev import AgentFrame, snapshot_from_clip
from rad2_core.config import load_merged, load_params
from rad2_core.observation import build_observation
from rad2_core.storage import save_dataset
from rad2_datasets.live_scene import LiveScene, LiveSceneError, load_map_and_route
from synthetic_scenes import make_clip

LOG_PARAMS = load_merged("bev", "sim", "validators")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    clip = make_clip(num_steps=40)
    ds = tmp_path_factory.mktemp("live") / "ds"
    save_dataset([clip], ds)
    params = {**load_params("bev"), **load_params("vehicle")}
    nodes = load_params("nodes")["perception"]
    scene = LiveScene(load_map_and_route(ds, "first", params=LOG_PARAMS), params, step_s=0.1,
                      history_s=nodes["history_s"],
                      odom_max_age_s=nodes["odom_max_age_s"],
                      history_tolerance_s=nodes["history_tolerance_s"])
    return clip, scene, params


def _feed(scene: LiveScene, clip, t: int, t0: float = 100.0) -> float:
    stamp = t0 + t * clip.dt
    yaw_rate = float(np.gradient(np.unwrap(clip.ego_yaw), clip.dt)[t])
    scene.add_odometry(stamp, clip.ego_x[t], clip.ego_y[t], clip.ego_yaw[t], clip.ego_speed[t], yaw_rate)
    a = clip.agents_at(t)
    scene.add_objects(stamp, AgentFrame.from_arrays(a.ids, a.types, a.x, a.y, a.yaw, a.vx, a.vy, a.length,
                                                    a.width))
    return stamp


def test_streamed_scene_matches_offline_observation(setup):
    clip, scene, params = setup
    for t in range(25):
        stamp = _feed(scene, clip, t)
    live = scene.observation(stamp)
    offline = build_observation(snapshot_from_clip(clip, 24, params, params), params=params)
    assert live.bev.shape == offline.bev.shape
    # occupancy history (agents_t-5, agents_t-10) comes from the object lists 0.5 s / 1.0 s ago
    np.testing.assert_allclose(live.bev, offline.bev, atol=1e-4)
    for name in ("map_polylines", "map_mask", "agents", "agents_mask", "route", "route_mask"):
        np.testing.assert_allclose(getattr(live, name), getattr(offline, name), atol=1e-4, err_msg=name)
    assert live.ego_state[0] == pytest.approx(offline.ego_state[0], abs=1e-4)  # speed
    assert live.ego_state[2] == pytest.approx(offline.ego_state[2], abs=1e-3)  # yaw rate


def test_a_resent_step_replaces_its_first_copy(setup):
    # lock-step replay re-publishes a step whose plan never came (a best-effort sample was lost):
    # the copy must leave the history, hence the BEV and the ego state, as if it had come once
    clip, _scene, params = setup
    nodes = load_params("nodes")["perception"]

    def scene_of(copies: int) -> LiveScene:
        scene = LiveScene(_scene.scene, params, step_s=0.1,
                          history_s=nodes["history_s"], odom_max_age_s=nodes["odom_max_age_s"],
                          history_tolerance_s=nodes["history_tolerance_s"])
        for t in range(25):
            for _ in range(copies if t in (14, 19, 24) else 1):
                stamp = _feed(scene, clip, t)
        return scene, stamp

    once, stamp = scene_of(1)
    twice, _ = scene_of(3)
    assert len(twice._odom) == len(once._odom) and len(twice._objects) == len(once._objects)
    a, b = once.observation(stamp), twice.observation(stamp)
    np.testing.assert_array_equal(a.bev, b.bev)
    np.testing.assert_array_equal(a.ego_state, b.ego_state)


def test_stale_or_missing_odometry_is_an_error(setup):
    clip, _scene, params = setup
    nodes = load_params("nodes")["perception"]
    scene = LiveScene(_scene.scene, params, 0.1, nodes["history_s"], nodes["odom_max_age_s"],
                      nodes["history_tolerance_s"])
    with pytest.raises(LiveSceneError, match="no object list"):
        scene.snapshot(1.0)
    a = clip.agents_at(0)
    scene.add_objects(1.0, AgentFrame.from_arrays(a.ids, a.types, a.x, a.y, a.yaw, a.vx, a.vy, a.length,
                                                  a.width))
    with pytest.raises(LiveSceneError, match="no odometry"):
        scene.snapshot(1.0)
    scene.add_odometry(0.0, clip.ego_x[0], clip.ego_y[0], clip.ego_yaw[0], 5.0, 0.0)
    with pytest.raises(LiveSceneError, match="stale"):
        scene.snapshot(1.0)
    with pytest.raises(LiveSceneError, match="non-finite"):
        scene.add_odometry(1.0, float("nan"), 0.0, 0.0, 0.0, 0.0)


def test_map_file_errors(tmp_path):
    with pytest.raises(LiveSceneError, match="does not exist"):
        load_map_and_route(tmp_path / "nope", params=LOG_PARAMS)
    save_dataset([make_clip(num_steps=20)], tmp_path / "ds")
    with pytest.raises(LiveSceneError, match="no clip 'x'"):
        load_map_and_route(tmp_path / "ds", "x", params=LOG_PARAMS)
    m = load_map_and_route(tmp_path / "ds", "synthetic_0", params=LOG_PARAMS)
    assert m.route_polyline.shape[1] == 2 and len(m.lane_map.lane_ids) > 0
