"""Real-data adapters: Argoverse 2 and CommonRoad fixtures -> validated clips with sane units."""

from pathlib import Path

import numpy as np
import pytest
from rad2_core.clip import AGENT_OTHER, AGENT_PEDESTRIAN, AGENT_VEHICLE
from rad2_core.config import load_merged, load_params
from rad2_core.storage import load_clip, save_clip
from rad2_core.tokens import project_onto_polyline
from rad2_datasets.adapters.av2 import load_av2_scenario
from rad2_datasets.adapters.commonroad import (
    CommonRoadAdapterError,
    commonroad_ego_candidates,
    load_commonroad_scenario,
)

LOG_PARAMS = load_merged("bev", "sim", "validators")

FIXTURES = Path(__file__).parents[1] / "fixtures"
AV2_DIR = FIXTURES / "av2" / "0a1e6f0a-1817-4a98-b02e-db8c9327d151"
CR_FILE = FIXTURES / "commonroad" / "USA_US101-5_1_T-1.xml"


@pytest.fixture(scope="module")
def av2_clip():
    return load_av2_scenario(AV2_DIR, LOG_PARAMS)


@pytest.fixture(scope="module")
def cr_clip():
    return load_commonroad_scenario(CR_FILE, params=LOG_PARAMS)


def _check_units(clip, max_speed):
    v = np.hypot(clip.agent_vx, clip.agent_vy)[clip.agent_valid]
    assert np.all(v < max_speed), "agent speeds must be m/s"
    assert np.all(clip.ego_speed >= 0) and clip.ego_speed.max() < max_speed
    yaw = clip.agent_yaw[clip.agent_valid]
    assert np.all(np.abs(yaw) <= np.pi + 1e-6), "yaw must be radians"
    assert np.all(np.abs(clip.ego_yaw) <= np.pi + 1e-6)
    # logged displacement agrees with logged speed (units are consistent)
    step = np.hypot(np.diff(clip.ego_x), np.diff(clip.ego_y)) / clip.dt
    moving = clip.ego_speed[1:] > 2.0
    if moving.any():
        ratio = np.median(step[moving] / clip.ego_speed[1:][moving])
        assert 0.8 < ratio < 1.2
    # the ego heading follows its direction of travel
    fast = np.flatnonzero(step > 2.0)
    if len(fast):
        travel = np.arctan2(np.diff(clip.ego_y), np.diff(clip.ego_x))[fast]
        err = np.abs((clip.ego_yaw[fast] - travel + np.pi) % (2 * np.pi) - np.pi)
        assert np.median(err) < 0.2


def test_av2_counts_and_units(av2_clip):
    c = av2_clip.validate()
    assert c.num_steps == 110 and c.dt == pytest.approx(0.1)
    assert c.duration_s == pytest.approx(10.9)
    assert c.num_agents == 57  # 58 tracks minus the ego "AV"
    assert c.map.num_lanes == 71
    assert len(c.map.crosswalks) > 0 and len(c.map.drivable_areas) > 0
    assert c.metadata["source"] == "av2"
    _check_units(c, max_speed=40.0)
    # box sizes come from the documented per-type defaults
    sizes = load_params("bev")["adapters"]["default_box_sizes"]
    veh = c.agent_types == AGENT_VEHICLE
    assert veh.any() and np.allclose(c.agent_length[veh], sizes["vehicle"][0])
    ped = c.agent_types == AGENT_PEDESTRIAN
    assert ped.any() and np.allclose(c.agent_width[ped], sizes["pedestrian"][1])
    assert (c.agent_types == AGENT_OTHER).any()  # static / background / riderless bicycles
    ego_len, ego_wid = load_params("bev")["adapters"]["ego_box_size"]
    assert c.ego_length == pytest.approx(ego_len) and c.ego_width == pytest.approx(ego_wid)


def test_av2_route_follows_the_ego(av2_clip):
    c = av2_clip
    rp = c.route_polyline
    d = np.array([project_onto_polyline(rp, np.array(p))[1] for p in zip(c.ego_x, c.ego_y)])
    assert d.max() < 1.5, "every logged ego pose lies near the route"
    idx = c.map.lane_index()
    for a, b in zip(c.route_lane_ids[:-1], c.route_lane_ids[1:]):
        assert int(b) in c.map.successors[idx[int(a)]]
    ahead = np.linalg.norm(rp[-1] - [c.ego_x[-1], c.ego_y[-1]])
    assert ahead > 20.0, "the route extends past the log"


def test_commonroad_agent_velocities_follow_their_headings_and_positions(cr_clip):
    """The recorded scenes' obstacle states give a speed along the heading (commonroad-io 2024's
    ExtendedPMState also answers ``velocity_y`` with a world-frame component, which is not a lateral
    speed): every moving agent's velocity points along its heading and matches its positions' rate."""
    c = cr_clip
    speed = np.hypot(c.agent_vx, c.agent_vy)
    moving = c.agent_valid & (speed > 2.0)
    off = np.abs((np.arctan2(c.agent_vy, c.agent_vx) - c.agent_yaw + np.pi) % (2 * np.pi) - np.pi)
    assert moving.sum() > 100 and off[moving].max() < 1e-6
    both = c.agent_valid[:, 1:] & c.agent_valid[:, :-1] & moving[:, 1:]
    rate = np.hypot(np.diff(c.agent_x, axis=1), np.diff(c.agent_y, axis=1)) / c.dt
    assert np.median(np.abs(rate[both] - speed[:, 1:][both])) < 0.5


def test_commonroad_state_kinds_give_world_velocities():
    """Each CommonRoad state kind's velocity in the world frame: a point-mass state's components as they
    are (and its heading from them), a multi-body state's lateral speed turned by its orientation, a
    single-track state's speed along heading plus slip."""
    from commonroad.scenario.state import ExtendedPMState, MBState, PMState, STState
    from rad2_datasets.adapters.commonroad import _velocity, _yaw

    ext = ExtendedPMState(time_step=0, position=np.zeros(2), velocity=10.0, orientation=np.pi / 2,
                          acceleration=0.0)
    assert np.allclose(_velocity(ext), (0.0, 10.0), atol=1e-9)
    pm = PMState(time_step=0, position=np.zeros(2), velocity=3.0, velocity_y=4.0)
    assert np.allclose(_velocity(pm), (3.0, 4.0)) and _yaw(pm) == pytest.approx(np.arctan2(4.0, 3.0))
    mb = MBState(time_step=0, position=np.zeros(2), velocity=10.0, orientation=np.pi / 2, velocity_y=1.0)
    assert np.allclose(_velocity(mb), (-1.0, 10.0), atol=1e-9)
    st = STState(time_step=0, position=np.zeros(2), velocity=10.0, orientation=0.0, slip_angle=0.1,
                 steering_angle=0.0, yaw_rate=0.0)
    assert np.allclose(_velocity(st), (10.0 * np.cos(0.1), 10.0 * np.sin(0.1)))


def test_commonroad_promotes_an_ego(cr_clip):
    c = cr_clip.validate()
    assert c.metadata["source"] == "commonroad" and c.metadata["promoted_ego"]
    assert c.dt == pytest.approx(0.1)
    assert c.num_steps == 101 and c.duration_s == pytest.approx(10.0)
    assert c.num_agents == 24  # 25 obstacles, one promoted
    assert c.map.num_lanes == 5 and len(c.map.drivable_areas) == 5
    assert c.metadata["ego_obstacle_id"] not in set(c.agent_ids.tolist())
    assert 3.0 < c.ego_length < 20.0 and 1.0 < c.ego_width < 3.0  # recorded sizes (NGSIM), not defaults
    assert len(set(np.round(c.agent_length, 3))) > 3
    _check_units(c, max_speed=45.0)
    assert np.all(c.map.speed_limits > 5.0)
    rp = c.route_polyline
    d = np.array([project_onto_polyline(rp, np.array(p))[1] for p in zip(c.ego_x, c.ego_y)])
    assert d.max() < 1.5


def test_commonroad_promoted_ego_is_a_moving_car_of_normal_size(cr_clip):
    """NGSIM scenes have no ego: the promoted one is never the 14.6 m truck (449), a car that barely
    moves, nor one whose logged box overlaps another's (a collision before the planner acts), and the
    choice follows adapters.promoted_ego (a stricter travel bound leaves one candidate, an impossible one
    is an error naming the criterion and each obstacle's reason)."""

    import copy

    params = LOG_PARAMS
    ranked = commonroad_ego_candidates(CR_FILE, params)
    assert cr_clip.metadata["ego_obstacle_id"] == ranked[0]
    assert 449 not in ranked  # CAR 14.6 m x 2.6 m, the longest-travelling obstacle
    assert 438 not in ranked and 439 not in ranked  # their logged boxes overlap at time step 27
    assert 3.0 <= cr_clip.ego_length <= 6.5 and 1.2 <= cr_clip.ego_width <= 2.6
    assert np.hypot(cr_clip.ego_x[-1] - cr_clip.ego_x[0], cr_clip.ego_y[-1] - cr_clip.ego_y[0]) >= 5.0
    strict = copy.deepcopy(params)
    strict["adapters"]["promoted_ego"]["min_travel_m"] = 95.0
    assert commonroad_ego_candidates(CR_FILE, strict) == [457]  # 98 m; the truck (97 m) is still too long
    strict["adapters"]["promoted_ego"]["length_m"] = [3.0, 20.0]
    assert commonroad_ego_candidates(CR_FILE, strict) == [457, 449]  # 101 states before 81
    strict["adapters"]["promoted_ego"]["min_travel_m"] = 1000.0
    with pytest.raises(CommonRoadAdapterError, match=r"promoted_ego.*449: travels 9\d\.\d m < 1000"):
        load_commonroad_scenario(CR_FILE, params=strict)


def test_commonroad_explicit_ego_and_bad_id():
    c = load_commonroad_scenario(CR_FILE, ego_obstacle_id=438, params=LOG_PARAMS)
    assert c.metadata["ego_obstacle_id"] == 438
    assert c.num_steps == 38  # that vehicle's 1 + 37 states
    with pytest.raises(CommonRoadAdapterError, match="ego_obstacle_id"):
        load_commonroad_scenario(CR_FILE, ego_obstacle_id=123456, params=LOG_PARAMS)


def test_adapted_clips_round_trip(av2_clip, cr_clip, tmp_path):
    for clip in (av2_clip, cr_clip):
        back = load_clip(save_clip(clip, tmp_path / f"{clip.clip_id}.npz")).validate()
        assert back.map.map_id == clip.map.map_id
        np.testing.assert_allclose(back.agent_x[clip.agent_valid], clip.agent_x[clip.agent_valid], atol=1e-3)


def test_a_log_at_another_rate_is_resampled_to_the_simulator_step(cr_clip, tmp_path):
    """The same NGSIM drive declared at 0.04 s per step lasts 4 s, not 10: the adapter hands it to the
    simulator at sim.dt (0.1 s) so a replay runs at the logged speed, not 2.5x too slowly."""
    fast = tmp_path / "fast.xml"
    fast.write_text(CR_FILE.read_text().replace('timeStepSize="0.1"', 'timeStepSize="0.04"'))
    c = load_commonroad_scenario(fast, ego_obstacle_id=cr_clip.metadata["ego_obstacle_id"], params=LOG_PARAMS)
    assert c.dt == pytest.approx(load_params("sim")["sim"]["dt"])
    assert c.metadata["resampled_from_dt"] == pytest.approx(0.04)
    assert c.num_steps == 41 and c.duration_s == pytest.approx(4.0)  # 101 steps x 0.04 s
    # log step 5 at 0.04 s is 0.2 s: step 2 of the resampled clip, the same position
    np.testing.assert_allclose([c.ego_x[2], c.ego_y[2]], [cr_clip.ego_x[5], cr_clip.ego_y[5]], atol=1e-9)
    # a midpoint (0.1 s = 2.5 log steps) is interpolated between log steps 2 and 3
    np.testing.assert_allclose(c.ego_x[1], 0.5 * (cr_clip.ego_x[2] + cr_clip.ego_x[3]), atol=1e-9)


def test_av2_map_without_centerlines_and_errors_naming_file_and_field(tmp_path):
    """Log map archives may store lane segments by their boundaries only: the centreline is computed as
    their midline; an unusable field is an error naming the file, the lane and the field."""
    import json
    import shutil

    from rad2_datasets.adapters.av2 import AV2FormatError, find_scenario_files, load_av2_map

    _, map_json = find_scenario_files(AV2_DIR)
    full, _ = load_av2_map(map_json, LOG_PARAMS)
    archive = json.loads(Path(map_json).read_text())
    for seg in archive["lane_segments"].values():
        del seg["centerline"]
    stripped = tmp_path / "log_map_archive_stripped.json"
    stripped.write_text(json.dumps(archive))
    computed, _ = load_av2_map(stripped, LOG_PARAMS)
    for given, mid in zip(full.centerlines, computed.centerlines):
        # the archive's own centrelines are midlines too: the computed ones lie on them (< 0.3 m)
        d = np.array([project_onto_polyline(given, p)[1] for p in mid])
        assert np.abs(d).max() < 0.3
    # the whole scenario loads from a directory whose archive has no centrelines
    scen = tmp_path / "scenario"
    shutil.copytree(AV2_DIR, scen)
    (scen / Path(map_json).name).write_text(json.dumps(archive))
    assert load_av2_scenario(scen, LOG_PARAMS).map.num_lanes == full.num_lanes
    first = next(iter(archive["lane_segments"].values()))
    first["left_lane_boundary"] = [{"x": 1.0}]
    stripped.write_text(json.dumps(archive))
    with pytest.raises(AV2FormatError, match=rf"{stripped.name}: lane segment .*'left_lane_boundary'"):
        load_av2_map(stripped, LOG_PARAMS)
    stripped.write_text("{ not json")
    with pytest.raises(AV2FormatError, match="unreadable map archive"):
        load_av2_map(stripped, LOG_PARAMS)
